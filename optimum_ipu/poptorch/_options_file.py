"""`Options.loadFromFile`: an options file read as setter calls with literal arguments, never run.

A PopTorch options file holds one line per option, written as in a script without the `options.`
prefix: `deviceIterations(4)`, `Training.gradientAccumulation(2)`,
`setExecutionStrategy(poptorch.ShardedExecution())`. Each line is parsed (`ast`) and evaluated here,
node by node, with only what such lines use:

- the call chain: attributes of the `Options` object and of its sub-option objects, called;
- the arguments: literals (numbers, strings, booleans, None, lists, tuples, dicts, sets, and the four
  arithmetic operators on numbers), torch dtypes (`torch.float16`), the enums by name or as
  `poptorch.X.Y`, and poptorch's option classes (`poptorch.ShardedExecution(...)`,
  `poptorch.TensorLocationSettings().useOnChipStorage(False)`).

Anything else (another name, a private attribute, a subscript, a function of torch or poptorch, two
statements) refuses the line, naming the file, the line and what is not allowed: a file from
elsewhere cannot run code through it.
"""

from __future__ import annotations

import ast
import operator
from enum import Enum
from typing import Any

import torch

from optimum_ipu.poptorch import blocks, enums, options

# Modules whose classes a line may construct or call methods of: the options, execution strategies and enums.
_OPTION_MODULES = {blocks.__name__, enums.__name__, options.__name__}
_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
HINT = (
    "an options file holds one setter call per line, an Options setter as in a script without the `options.` "
    "prefix (deviceIterations(4), Training.gradientAccumulation(2), "
    "setExecutionStrategy(poptorch.ShardedExecution())), with literal arguments; nothing in it runs as Python"
)


class Refused(ValueError):
    """A line, or a part of it, that is not a setter call with literal arguments."""


def _is_option_class(value: Any) -> bool:
    return isinstance(value, type) and value.__module__ in _OPTION_MODULES


def _is_option_method(value: Any) -> bool:
    owner = getattr(value, "__self__", None)
    return callable(value) and owner is not None and type(owner).__module__ in _OPTION_MODULES


def _private_names(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        name = (
            node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        )
        if name is not None and name.startswith("_"):
            found.append((node.col_offset, name))
    return [name for _, name in sorted(found)]


class _Line:
    """One line's evaluation against `target` (the Options object)."""

    def __init__(self, target):
        import optimum_ipu.poptorch as poptorch  # the package, for `poptorch.X`

        self.target = target
        self.names = {"poptorch": poptorch, "torch": torch, **{e: getattr(enums, e) for e in enums.__all__}}

    def setter_chain(self, node: ast.expr) -> Any:
        """`a.b(...).c(...)` on the Options object: attributes and calls of option objects only."""
        if isinstance(node, ast.Name):
            return self._option_attribute(self.target, node.id)
        if isinstance(node, ast.Attribute):
            return self._option_attribute(self.setter_chain(node.value), node.attr)
        if isinstance(node, ast.Call):
            method = self.setter_chain(node.func)
            if not _is_option_method(method):
                raise Refused(f"{ast.unparse(node.func)} is not a setter")
            return method(
                *[self.value(a) for a in node.args], **{k.arg: self.value(k.value) for k in node.keywords}
            )
        raise Refused(f"{ast.unparse(node)} is not part of a setter call")

    def _option_attribute(self, owner: Any, name: str) -> Any:
        if name == "loadFromFile":
            raise Refused("an options file cannot load another")
        if type(owner).__module__ not in _OPTION_MODULES or not hasattr(owner, name):
            raise Refused(f"{type(owner).__name__} has no option {name}")
        return getattr(owner, name)

    def value(self, node: ast.expr) -> Any:
        """An argument: a literal, a dtype, an enum member, or an option object built by a call."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = [self.value(e) for e in node.elts]
            return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise Refused("** in a dict is not a literal")
            return {self.value(k): self.value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return self._number(node.operand) * (-1 if isinstance(node.op, ast.USub) else 1)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            return _ARITHMETIC[type(node.op)](self._number(node.left), self._number(node.right))
        if isinstance(node, ast.Name):
            if node.id not in self.names:
                raise Refused(
                    f"{node.id} is not a name an options file knows (poptorch, torch, the poptorch enums)"
                )
            return self.names[node.id]
        if isinstance(node, ast.Attribute):
            return self._argument_attribute(node)
        if isinstance(node, ast.Call):
            call = self.value(node.func)
            if not (_is_option_class(call) and not issubclass(call, Enum)) and not _is_option_method(call):
                raise Refused(
                    f"{ast.unparse(node.func)} is not one of poptorch's option classes or their setters"
                )
            return call(
                *[self.value(a) for a in node.args], **{k.arg: self.value(k.value) for k in node.keywords}
            )
        raise Refused(f"{ast.unparse(node)} is not a literal")

    def _number(self, node: ast.expr) -> int | float:
        value = self.value(node)
        if type(value) not in (int, float):
            raise Refused(f"{ast.unparse(node)} is not a number")
        return value

    def _argument_attribute(self, node: ast.Attribute) -> Any:
        owner = self.value(node.value)
        base = ast.unparse(node)
        if owner is torch:
            value = getattr(torch, node.attr, None)
            if not isinstance(value, torch.dtype):
                raise Refused(f"{base} is not a torch dtype")
            return value
        if owner is self.names["poptorch"]:
            value = getattr(owner, node.attr, None)
            if not _is_option_class(value):
                raise Refused(f"{base} is not one of poptorch's option classes or enums")
            return value
        if isinstance(owner, type) and issubclass(owner, Enum) and node.attr in owner.__members__:
            return owner[node.attr]
        if type(owner).__module__ in _OPTION_MODULES and hasattr(owner, node.attr):
            return getattr(owner, node.attr)  # a setter of an option object built on this line
        raise Refused(f"{base} is not an option, an enum member or a dtype")


def apply_line(target, line: str, where: str) -> None:
    """Apply one line of an options file to `target`; `ValueError` naming `where` (file:line) otherwise."""
    try:
        tree = ast.parse(line, mode="eval")
    except SyntaxError as error:
        raise ValueError(f"{where}: {line!r} is not a setter call: {error.msg}; {HINT}.") from None
    private = _private_names(tree)
    try:
        if private:
            raise Refused(f"private names are not options: {', '.join(private)}")
        if not isinstance(tree.body, ast.Call):
            raise Refused("not a call")
        _Line(target).setter_chain(tree.body)
    except Refused as error:
        raise ValueError(
            f"{where}: {line!r} is not an Options setter call with literal arguments ({error}); {HINT}."
        ) from None
