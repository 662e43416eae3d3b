"""What PopTorch attaches to the ops built inside a scope: attributes (`poptorch.Attribute`) and name scopes.

On an IPU, every op PopTorch builds carries the attributes open at that moment (Graphcore's BERT and
GPT-2 applications open `__outline={"layer": name}` around each layer so that PopART outlines equal
layers as one subgraph) and a name prefixed by the name scopes open (`poptorch.NameScope`, or
`torch.ops.poptorch.push_name_scope` / `pop_name_scope` from module hooks, as the CNN and Swin
applications do), which PopVision shows. Neither changes a value.

The simulated IPU has no graph to annotate, so nothing here changes a number either. The open
attributes and scopes are still tracked, one table for the process as PopTorch keeps one per
compiled graph, with PopTorch's checks: programs that open and close them from forward hooks behave
as on PopTorch (closing what is not open is an error), and tools can read what is open
(`current_attributes()`, `current_name_scope()`).
"""

from __future__ import annotations

import copy
from typing import Any

from optimum_ipu.poptorch._logging import Error

__all__ = [
    "Attribute",
    "clear_attribute",
    "current_attributes",
    "current_name_scope",
    "pop_name_scope",
    "push_name_scope",
    "set_attribute",
]

_attributes: dict[str, dict[str, str]] = {}  # attribute name -> {key: value}, what the next op would carry
_name_scopes: list[str] = []


# -- the attribute table (PopTorch's torch.ops.poptorch.set_attribute / clear_attribute) ------------------------
def _check_str(what: str, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(
            f"poptorch attributes are strings (PopTorch passes them to its graph as text): the {what} is "
            f"{value!r} ({type(value).__name__}); write it as a string, e.g. {str(value)!r}."
        )


def set_attribute(attribute: str, key: str, value: str) -> None:
    """Attach `key = value` under `attribute` to the ops built from now on (replacing an earlier value)."""
    _check_str("attribute name", attribute)
    _check_str(f"key of attribute {attribute!r}", key)
    _check_str(f"value of {attribute}[{key!r}]", value)
    _attributes.setdefault(attribute, {})[key] = value


def clear_attribute(attribute: str, key: str) -> None:
    """Stop attaching `key` under `attribute`; an attribute or key that is not set is PopTorch's error."""
    keys = _attributes.get(attribute, {})
    if key not in keys:
        raise Error(f"Unknown key '{key}' for attribute '{attribute}'.")
    del keys[key]
    if not keys:
        del _attributes[attribute]


def current_attributes() -> dict[str, dict[str, str]]:
    """The attributes the next op would carry: {attribute: {key: value}} (a copy)."""
    return copy.deepcopy(_attributes)


class Attribute:
    """Attach attributes to the ops built inside this scope: `with poptorch.Attribute(__outline={"layer": "L0"}):`.

    Each keyword is an attribute name and its value a dict of string keys to string values. Scopes
    nest: an inner scope adds keys or overrides them, and leaving it restores what the outer scope
    set. Applications enter and leave one from forward hooks (`context.__enter__()` before a layer,
    `context.__exit__(None, None, None)` after it); the same object may be entered again after it is
    left, or while it is open (recursion). No value changes on the simulated IPU.
    """

    def __init__(self, **attributes: dict[str, str]):
        self._attributes = attributes
        self._saved: list[dict[str, dict[str, str]]] = []  # the table before each open entry

    def _check(self) -> None:
        for name, keys in self._attributes.items():
            if not isinstance(keys, dict):
                raise TypeError(
                    f"poptorch.Attribute({name}=...) takes a dict of keys to values for each attribute, got "
                    f"{keys!r} ({type(keys).__name__}); e.g. poptorch.Attribute({name}={{'layer': 'encoder'}})."
                )
            _check_str("attribute name", name)
            for key, value in keys.items():
                _check_str(f"key of attribute {name!r}", key)
                _check_str(f"value of {name}[{key!r}]", value)

    def __enter__(self) -> None:
        self._check()  # all of it before any of it, so a bad value leaves the table as it was
        self._saved.append(current_attributes())
        for name, keys in self._attributes.items():
            for key, value in keys.items():
                set_attribute(name, key, value)
        # None, as PopTorch's: a forward pre-hook `lambda *a: context.__enter__()` must not replace the inputs.

    def __exit__(self, exc_type, exc, traceback) -> None:
        if not self._saved:
            key, name = next(((k, n) for n, keys in self._attributes.items() for k in keys), ("", ""))
            raise Error(
                f"Unknown key '{key}' for attribute '{name}'. (poptorch.Attribute.__exit__ was called without a "
                "matching __enter__: enter the scope before leaving it, e.g. from a forward pre-hook.)"
            )
        before = self._saved.pop()
        for name, keys in self._attributes.items():
            for key in keys:
                if key in before.get(name, {}):
                    set_attribute(name, key, before[name][key])
                else:
                    clear_attribute(name, key)

    def __repr__(self) -> str:
        return f"poptorch.Attribute({', '.join(f'{k}={v!r}' for k, v in self._attributes.items())})"


# -- name scopes (PopTorch's torch.ops.poptorch.push_name_scope / pop_name_scope) ---------------------------------
def push_name_scope(name: str) -> None:
    """Open the name scope `name` inside the ones open (ops would be named `outer/name/Op`)."""
    if not isinstance(name, str):
        raise TypeError(f"A name scope is a string, got {name!r} ({type(name).__name__}).")
    _name_scopes.append(name)


def pop_name_scope() -> None:
    """Close the innermost name scope; closing one when none is open is an error."""
    if not _name_scopes:
        raise Error(
            "pop_name_scope() with no name scope open: every torch.ops.poptorch.pop_name_scope() needs an earlier "
            "push_name_scope(name) (register the push as a forward pre-hook and the pop as a forward hook of the "
            "same module, or use `with poptorch.NameScope(name):`)."
        )
    _name_scopes.pop()


def current_name_scope() -> str:
    """The open name scopes, outermost first, joined by "/" as PopART prefixes op names ("" when none)."""
    return "/".join(_name_scopes)
