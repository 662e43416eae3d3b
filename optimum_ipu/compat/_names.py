"""Lazy name tables: what each `optimum.graphcore` module exposes, and the placeholders for the rest.

Every public name that Optimum Graphcore 0.7 exported appears in `TABLES` under the module it came
from. A name is either an *alias* (``"optimum_ipu.module:attr"``, imported on first access so that
``import optimum.graphcore`` stays as fast as ``import optimum_ipu``) or a `Missing` entry: a name
with no equivalent on a simulated IPU (PopTorch internals, seq2seq generation on the device,
Stable Diffusion, ...). A missing name still imports, so a script that merely imports it runs; using
it (calling, instantiating, subclassing, reading an attribute) raises `NoEquivalentError`, whose
message says why and what to use instead.

The `optimum/graphcore/*.py` files are one line each: `bind(__name__)` gives them `__all__`,
`__getattr__` and `__dir__` built from their table.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Missing", "NoEquivalentError", "bind", "missing"]


class NoEquivalentError(NotImplementedError):
    """An Optimum Graphcore name that optimum-ipu does not provide; the message names the replacement."""


@dataclass(frozen=True)
class Missing:
    """A name with no equivalent: `why` it has none, and what to use `instead`."""

    why: str
    instead: str


def _message(qualified: str, entry: Missing) -> str:
    return f"`{qualified}` (Optimum Graphcore 0.7) has no equivalent in optimum-ipu: {entry.why}. Instead: {entry.instead}."


class _MissingMeta(type):
    """Metaclass of placeholders: every use of the placeholder raises `NoEquivalentError`."""

    def __call__(cls, *args, **kwargs):
        raise NoEquivalentError(cls._message)

    def __getattr__(cls, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # introspection (copy, pickle, inspect) must not trip the error
        raise NoEquivalentError(cls._message)

    def __contains__(cls, item):  # `model_cls in MODELS_SUPPORTING_KV_CACHE`
        raise NoEquivalentError(cls._message)

    def __iter__(cls):
        raise NoEquivalentError(cls._message)

    def __new__(mcs, name, bases, namespace):
        for base in bases:
            if isinstance(base, _MissingMeta):  # `class MyTrainer(IPUSeq2SeqTrainer)`
                raise NoEquivalentError(base._message)
        return super().__new__(mcs, name, bases, namespace)


def missing(qualified: str, entry: Missing) -> type:
    """A placeholder standing for `qualified`: importable, but raising `NoEquivalentError` on use.

    A class (rather than a function) so that instantiating it, calling a classmethod on it
    (`IPUSeq2SeqTrainer.from_pretrained`) or subclassing it all fail with the same clear message.
    """
    module, _, name = qualified.rpartition(".")
    namespace = {
        "_message": _message(qualified, entry),
        "__module__": module,
        "__qualname__": name,
        "__doc__": f"Not available in optimum-ipu: {entry.why}. Instead: {entry.instead}.",
    }
    return _MissingMeta(name, (), namespace)


def _resolve(target: str):
    module, _, attr = target.partition(":")
    value = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        value = getattr(value, part)
    return value


def bind(module_name: str) -> tuple[list[str], Callable[[str], object], Callable[[], list[str]]]:
    """`__all__`, `__getattr__` and `__dir__` for the `optimum.graphcore` module `module_name`."""
    from optimum_ipu.compat._tables import TABLES

    table = TABLES[module_name]

    def __getattr__(name: str):
        entry = table.get(name)
        if entry is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = missing(f"{module_name}.{name}", entry) if isinstance(entry, Missing) else _resolve(entry)
        setattr(sys.modules[module_name], name, value)  # resolve once; later reads are plain lookups
        return value

    def __dir__() -> list[str]:
        return sorted(set(table) | set(vars(sys.modules[module_name])))

    return sorted(table), __getattr__, __dir__
