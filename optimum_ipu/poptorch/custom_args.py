"""Custom argument types a wrapped model takes: `poptorch.ICustomArgParser` and `registerCustomArgParser`.

A wrapped model's inputs are split into micro-batches tensor by tensor, so the wrapper must find every
tensor of an argument and rebuild the argument around each micro-batch's slices. Tuples, lists and
dicts are walked; an object of another type (a PyTorch Geometric `Data`, a dataclass of tensors) is
opaque unless the program registers a parser for its type: `yieldTensors(obj)` gives its tensors in a
fixed order, `reconstruct(obj, tensors)` builds a like object from tensors in that order.

The wrappers find tensors with torch's pytree (`torch.utils._pytree`), so registering a parser also
registers its type as a pytree node whose children are the parser's tensors. A subclass of a
registered type uses its base's parser (PopTorch looks parsers up by `isinstance`); pytree matches
exact types, so `register_subclasses_in(tree)` registers any such subclass found in a call's arguments
before they are flattened. `flatten_custom` / `rebuild_custom` are PopTorch's own walk (tensors only,
parsers first) for code that does not use pytree.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from optimum_ipu.poptorch._logging import Error, logger

__all__ = ["ICustomArgParser", "flatten_custom", "parser_for", "rebuild_custom", "registerCustomArgParser",
           "register_subclasses_in"]  # fmt: skip


class ICustomArgParser(abc.ABC):
    """How to find the tensors of a custom argument type and build one back from other tensors."""

    @abc.abstractmethod
    def yieldTensors(self, struct: Any) -> Iterator[torch.Tensor]:
        """Yield every tensor `struct` holds, always in the same order (e.g. sorted by attribute name)."""

    @abc.abstractmethod
    def reconstruct(self, original_structure: Any, tensor_iterator: Iterator[torch.Tensor]) -> Any:
        """A new object like `original_structure` whose tensors are taken from `tensor_iterator`, in the order
        `yieldTensors` gives them (take exactly as many as it yields)."""


_parsers: dict[type, ICustomArgParser] = {}
_pytree_types: set[type] = set()  # the types this module registered with pytree


def parser_for(value: Any) -> ICustomArgParser | None:
    """The parser registered for `value`'s type, else for the first registered type it is an instance of."""
    if not _parsers:
        return None
    parser = _parsers.get(type(value))
    if parser is not None:
        return parser
    return next((p for t, p in _parsers.items() if isinstance(value, t)), None)


def _flatten_node(value: Any) -> tuple[list[Any], Any]:
    parser = parser_for(value)
    # A type whose parser was removed holds no tensors the wrappers see, as an unregistered object.
    return (list(parser.yieldTensors(value)) if parser is not None else []), value


def _unflatten_node(children: Iterable[Any], original: Any) -> Any:
    parser = parser_for(original)
    return parser.reconstruct(original, iter(children)) if parser is not None else original


def _flatten_node_with_keys(value: Any) -> tuple[list[tuple[Any, Any]], Any]:
    children, context = _flatten_node(value)
    return [(pytree.SequenceKey(i), child) for i, child in enumerate(children)], context


def _register_with_pytree(cls: type) -> None:
    if cls in _pytree_types:
        return
    if cls in pytree.SUPPORTED_NODES:
        logger.debug(
            "%s is already a pytree node: the wrappers flatten it as registered there, not with its custom parser.",
            cls.__qualname__,
        )
        return
    pytree.register_pytree_node(
        cls, _flatten_node, _unflatten_node, flatten_with_keys_fn=_flatten_node_with_keys
    )
    _pytree_types.add(cls)


def registerCustomArgParser(arg_data_type: type, arg_parser: ICustomArgParser | None) -> None:
    """Use `arg_parser` for arguments of type `arg_data_type` (and its subclasses); None removes the parser.

    A parser registered again for the same type replaces the earlier one.
    """
    if arg_parser is None:
        _parsers.pop(arg_data_type, None)
        return
    if not isinstance(arg_parser, ICustomArgParser):
        raise Error("arg_parser must inherit from ICustomArgParser")
    _parsers[arg_data_type] = arg_parser
    _register_with_pytree(arg_data_type)


def register_subclasses_in(tree: Any) -> None:
    """Register with pytree the type of every object in `tree` that only a base class's parser matches.

    Call before `pytree.tree_flatten(tree)` so that subclass instances are walked too.
    """
    if not _parsers:
        return
    stack = [tree]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif type(value) not in _pytree_types and parser_for(value) is not None:
            _register_with_pytree(type(value))


def flatten_custom(structure: Any) -> list[torch.Tensor]:
    """The tensors of `structure` in PopTorch's order: parsers first, then dicts, lists/tuples and tensors; other
    values hold none."""
    out: list[torch.Tensor] = []

    def walk(value: Any) -> None:
        parser = parser_for(value)
        if parser is not None:
            out.extend(parser.yieldTensors(value))
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, torch.Tensor):
            out.append(value)

    walk(structure)
    return out


def rebuild_custom(structure: Any, tensors: Iterable[torch.Tensor]) -> Any:
    """`structure` with its tensors replaced, in `flatten_custom`'s order, by `tensors`; other values kept."""
    it = iter(tensors)

    def build(value: Any) -> Any:
        parser = parser_for(value)
        if parser is not None:
            return parser.reconstruct(value, it)
        if isinstance(value, dict):
            return type(value)({k: build(v) for k, v in value.items()})
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*(build(v) for v in value))
        if isinstance(value, (list, tuple)):
            return type(value)(build(v) for v in value)
        if isinstance(value, torch.Tensor):
            return next(it)
        return value

    return build(structure)
