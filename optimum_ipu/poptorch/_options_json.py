"""`Options.from_json` and `POPTORCH_DEFAULT_OPTIONS`: options given as a JSON object of setter calls.

PopTorch 3.4 seeds every `poptorch.Options()` from the environment variable `POPTORCH_DEFAULT_OPTIONS`,
a JSON object read by `Options.from_json`: each key is the path of a setter from the `Options` object
(`"deviceIterations"`, `"Training.gradientAccumulation"`, `"_Popart.set"`), each value its argument, a
list being the arguments in order; a string `"Enum.Member"` naming one of poptorch's enums
(`"OutputMode.All"`) is that member, at the top level or in an argument list. So a job script can set
options for a program it does not edit:

    POPTORCH_DEFAULT_OPTIONS='{"deviceIterations": 4, "outputMode": "OutputMode.All"}' python train.py

The keys are walked as an options file's setter chain is (`_options_file.option_attribute`): attributes
of the option objects only, with the closest name for a misspelt one; of the private names only
`_Popart`, which PopTorch documents for raw PopART settings. Every refusal is one `ValueError` naming
where the JSON came from (the variable, or `Options.from_json`), the key and what to write instead.
"""

from __future__ import annotations

import json
import os
from typing import Any

from optimum_ipu._quoting import clipped
from optimum_ipu.poptorch import enums
from optimum_ipu.poptorch._options_file import Refused, SetterRefused, _is_option_method, option_attribute

__all__ = ["ENV", "apply_environment", "apply_json"]

ENV = "POPTORCH_DEFAULT_OPTIONS"
_EXAMPLE = '{"deviceIterations": 4, "Training.gradientAccumulation": 2, "outputMode": "OutputMode.All"}'
_PRIVATE_ALLOWED = ("_Popart",)
_NOT_FROM_JSON = ("from_json", "loadFromFile")  # a JSON of options loads no other options


def _enum_or_text(value: Any) -> Any:
    """`"OutputMode.All"` as `poptorch.OutputMode.All`; any other value (a path with a dot too) as it is."""
    if not isinstance(value, str) or value.count(".") != 1:
        return value
    kind, member = value.split(".")
    enum = getattr(enums, kind, None) if kind in enums.__all__ else None
    return enum.__members__[member] if enum is not None and member in enum.__members__ else value


def _setter(target, key: str) -> Any:
    """The setter `key` names from `target`, walked one attribute at a time; `Refused` otherwise."""
    owner, path = target, ""
    for name in key.split("."):
        if (name.startswith("_") and name not in _PRIVATE_ALLOWED) or name in _NOT_FROM_JSON:
            raise Refused(f"{path}{clipped(name)} is not an option a JSON of options can set")
        owner, path = option_attribute(owner, name, path), f"{path}{name}."
    if not _is_option_method(owner):
        raise Refused(f"{clipped(key)} is not a setter")
    return owner


def apply_json(target, text: str, source: str) -> None:
    """Call the setters the JSON object `text` names on `target` (an `Options`), in the object's order.

    Raises:
        ValueError: `text` is not a JSON object, a key names no setter, or a setter refuses its value;
            the message starts with `source` (where the JSON came from) and names the key.
    """
    hint = f"write a JSON object of setters and their arguments, e.g. '{_EXAMPLE}'"
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{source} is not valid JSON ({error}): {hint}.") from None
    if not isinstance(values, dict):
        raise ValueError(f"{source} must be a JSON object, got {clipped(text.strip())!r}: {hint}.")
    for key, value in values.items():
        try:
            setter = _setter(target, key)
        except Refused as error:
            raise ValueError(f"{source}: {error}; {hint}.") from None
        args = [_enum_or_text(v) for v in value] if isinstance(value, list) else [_enum_or_text(value)]
        try:
            setter(*args)
        except Exception as error:
            refused = SetterRefused(key, clipped(json.dumps(value)), error)
            raise ValueError(f"{source}: {refused}") from None


def apply_environment(target) -> None:
    """Apply `POPTORCH_DEFAULT_OPTIONS`, when set, to a new `Options` (as PopTorch's constructor does)."""
    text = os.environ.get(ENV, "")
    if text.strip():
        apply_json(target, text, f"the environment variable {ENV}")
