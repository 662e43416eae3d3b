"""Parsing `--ipu_config_overrides "k1=v1,k2=[0.1 0.2]"` into typed values.

Each value is read by the type of the attribute's current value, as in Optimum Graphcore, with two
traps of the original removed: a list may replace a number (`matmul_proportion=0.2` ->
`matmul_proportion=[0.1 0.2]`), and `None` can be set and later overridden (the type is then inferred
from the text).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from optimum_ipu._quoting import clipped
from optimum_ipu.configuration.schema import IPUConfigError, close_matches

FORMS = (
    "Overrides are `key=value` pairs separated by commas, e.g. "
    "`gradient_accumulation_steps=32,matmul_proportion=[0.1 0.2 0.3 0.3],seed=None`: booleans as "
    "true/false/yes/no/1/0, lists in brackets (spaces or commas between items), dicts as JSON, "
    "None (or none) to unset."
)
_TRUE, _FALSE = {"true", "yes", "1"}, {"false", "no", "0"}
_INT = re.compile(r"^[+-]?\d+$")
_OPEN, _CLOSE = "[{(", "]})"


def split_overrides(text: str) -> list[str]:
    """Split on commas that are not inside brackets or braces; drop empty items."""
    items, depth, current = [], 0, []
    for char in text:
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
            if depth < 0:
                raise IPUConfigError(f"IPU config overrides {clipped(text)!r}: unbalanced {char!r}. {FORMS}")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise IPUConfigError(f"IPU config overrides {clipped(text)!r}: a bracket is not closed. {FORMS}")
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _bad(key: str, raw: str, expected: str) -> IPUConfigError:
    return IPUConfigError(f"IPU config override `{key}={clipped(raw)}`: expected {expected}. {FORMS}")


def _number(key: str, raw: str, text: str) -> int | float:
    try:  # int() refuses more than 4,300 digits (sys.get_int_max_str_digits): the same error as a non-number
        return int(text) if _INT.match(text) else float(text)
    except ValueError:
        raise _bad(key, raw, "a number") from None


def _integer(key: str, raw: str) -> int:
    if _INT.match(raw):
        try:
            return int(raw)
        except ValueError:  # more than 4,300 digits (sys.get_int_max_str_digits): no count of anything
            pass
    raise _bad(key, raw, "an integer")


def _list(key: str, raw: str) -> list:
    inner = raw[1:-1].replace(",", " ").split()
    return [_number(key, raw, item) for item in inner]


def _dict(key: str, raw: str) -> dict:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise _bad(key, raw, 'a dict written as JSON, e.g. {"key": 1}') from None
    if not isinstance(value, dict):
        raise _bad(key, raw, 'a dict written as JSON, e.g. {"key": 1}')
    return value


def _unquote(raw: str) -> str:
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        return raw[1:-1]
    return raw


def _infer(key: str, raw: str) -> Any:
    """Read a value with no type to go by (the current value is None, or a list replaced by a scalar)."""
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if raw.startswith("["):
        return _list(key, raw)
    if raw.startswith("{"):
        return _dict(key, raw)
    try:
        return _number(key, raw, raw)
    except IPUConfigError:
        return _unquote(raw)


def parse_value(key: str, raw: str, current: Any) -> Any:
    """Parse the text `raw` for attribute `key` by the type of its `current` value.

    Raises:
        IPUConfigError: naming the key, the value and the accepted forms.
    """
    raw = raw.strip()
    if raw.lower() in ("none", "null"):
        return None
    if isinstance(current, bool):
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise _bad(key, raw, "a boolean (true/false/yes/no/1/0)")
    if isinstance(current, int):
        return _integer(key, raw)
    if isinstance(current, float):
        # A per-IPU list may replace a single proportion.
        return _list(key, raw) if raw.startswith("[") else float(_number(key, raw, raw))
    if isinstance(current, list):
        if raw.startswith("[") and raw.endswith("]"):
            return _list(key, raw)
        if raw.startswith("["):
            raise _bad(key, raw, "a list in brackets, e.g. [0.1 0.2]")
        return _infer(key, raw)
    if isinstance(current, dict):
        return _dict(key, raw)
    if isinstance(current, str):
        return _unquote(raw)
    return _infer(key, raw)


def parse_overrides(text: str, known: Iterable[str], current: Callable[[str], Any]) -> dict[str, Any]:
    """Turn an overrides string into `{attribute: value}`.

    Args:
        text: the `--ipu_config_overrides` string.
        known: the accepted attribute names.
        current: returns the current value of an attribute, whose type decides how its text is read.

    Raises:
        IPUConfigError: for an item without `=`, an unknown key or a value of the wrong form.
    """
    known = set(known)
    parsed: dict[str, Any] = {}
    for item in split_overrides(text or ""):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise IPUConfigError(f"IPU config override {clipped(item)!r} is not `key=value`. {FORMS}")
        if key not in known:
            raise IPUConfigError(
                f"IPU config override `{clipped(item)}`: `{clipped(key)}` is not an `IPUConfig` attribute"
                f"{close_matches(key, known)}. "
                f"{FORMS}"
            )
        parsed[key] = parse_value(key, raw, current(key))
    return parsed
