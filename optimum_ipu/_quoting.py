"""Bounded quotes of user values in error messages: a bad value of 300,000 characters stays one readable line.

`shown(value)` is `repr(value)` cut to about 160 characters, followed by the value's size (entries of a
list or dict, characters of a string); `clipped(text)` does the same for text quoted as it is (an
override written on the command line, a line of a file). Both always return: a value Python cannot
`repr` (an integer of more than 4,300 digits, a list nested thousands deep) is described instead.
"""

from __future__ import annotations

import math
from typing import Any

LIMIT = 160


def clipped(text: str, limit: int = LIMIT) -> str:
    """`text` itself when short, else its first `limit` characters, `...` and its length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def shown(value: Any, limit: int = LIMIT) -> str:
    """`repr(value)` cut to about `limit` characters, with the entry count of a long list, tuple, set or
    dict, the length of a long string or the digits of a long integer: an error about a 100,000-entry
    list stays a readable line."""
    if isinstance(value, str) and len(value) > limit:  # repr of the prefix only: no copy of a huge string
        return f"{repr(value[:limit])[:limit]}... ({len(value):,} characters)"
    try:
        text = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        if isinstance(value, int):
            digits = int((abs(value).bit_length() - 1) * math.log10(2)) + 1  # the digits of 2**(bits - 1)
            digits += abs(value) >= 10**digits
            return f"an integer of {digits:,} digits"
        return f"a {type(value).__name__} that cannot be shown"
    except RecursionError:
        return f"a {type(value).__name__} nested too deeply to show"
    if len(text) <= limit:
        return text
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        count = f" ({len(value):,} entries)"
    elif isinstance(value, int) and text.lstrip("-").isdigit():
        count = f" ({len(text.lstrip('-')):,} digits)"
    else:
        count = ""
    return f"{text[:limit]}...{count}"
