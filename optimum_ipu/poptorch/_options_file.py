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

Every refusal is one `ValueError` naming the file and the line: a value a setter refuses names the
setter, the value as written and the setter's own message; a misspelt setter, name or enum member
gets the closest one; a line longer than `MAX_LINE` characters, nested more than `MAX_DEPTH` levels
or computing an integer beyond 64 bits is refused before it costs memory or recursion; no raw Python
exception (a `ZeroDivisionError`, a `RecursionError`) escapes, and every quote is a bounded prefix.
"""

from __future__ import annotations

import ast
import difflib
import itertools
import operator
from collections.abc import Iterable, Iterator
from enum import Enum
from typing import Any

import torch

from optimum_ipu._quoting import clipped, shown
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
# A real options file's longest line is a list of buffer names or a per-IPU dict: some hundreds of characters.
MAX_LINE = 10_000
# Levels of calls, containers and operators in one line; a setter chain with an option object uses about 8.
MAX_DEPTH = 50
# Integers beyond 64 bits fit no PopTorch option (PopTorch hands them to C++ as 64-bit numbers).
_INT_LIMIT = 2**64


class Refused(ValueError):
    """A line, or a part of it, that is not a setter call with literal arguments."""


class BadValue(ValueError):
    """A literal argument that cannot be computed (a division by zero, an unhashable key, a huge integer)."""


class SetterRefused(ValueError):
    """A setter (or an option class) called with the line's arguments raised: its name, the arguments as
    written, and its error."""

    def __init__(self, setter: str, arguments: str, error: Exception):
        reason = str(error)
        if not isinstance(error, (ValueError, TypeError, AssertionError)):
            reason = f"{type(error).__name__}: {reason}"
        super().__init__(f"the setter {setter} refused {arguments}: {clipped(reason, 400)}")


def _did_you_mean(name: str, candidates: Iterable[str], prefix: str = "") -> str:
    """The suffix " (did you mean `prefix`X?)" for the candidate closest to a misspelt `name`, or ""."""
    found = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.7)
    return f" (did you mean {prefix}{found[0]}?)" if found else ""


def _is_option_class(value: Any) -> bool:
    return isinstance(value, type) and value.__module__ in _OPTION_MODULES


def _is_option_method(value: Any) -> bool:
    owner = getattr(value, "__self__", None)
    return callable(value) and owner is not None and type(owner).__module__ in _OPTION_MODULES


def _setter_names(owner: Any) -> list[str]:
    """The public attributes of an option object a line may name (for the suggestions)."""
    return [n for n in dir(type(owner)) if not n.startswith("_") and n not in ("loadFromFile", "from_json")]


def option_attribute(owner: Any, name: str, path: str) -> Any:
    """`owner.name`, where `owner` is an option object (`Options`, a sub-option object, an execution
    strategy); `Refused` naming `path` + `name`, with the closest attribute, for any other.

    The one way an options file and a JSON of options (`_options_json`) walk to a setter.
    """
    if type(owner).__module__ not in _OPTION_MODULES or not hasattr(owner, name):
        hint = _did_you_mean(name, _setter_names(owner), path) if type(owner).__module__ in _OPTION_MODULES else ""
        raise Refused(f"{path or 'Options.'}{clipped(name)} is not an option{hint}")
    return getattr(owner, name)


def _private_names(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        name = (
            node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        )
        if name is not None and name.startswith("_"):
            found.append((node.col_offset, name))
    return [name for _, name in sorted(found)]


def _deeper_than(tree: ast.AST, limit: int) -> bool:
    """Whether expressions nest more than `limit` levels (walked without recursion)."""
    todo = [(tree, 0)]
    while todo:
        node, depth = todo.pop()
        depth += isinstance(node, ast.expr)
        if depth > limit:
            return True
        todo.extend((child, depth) for child in ast.iter_child_nodes(node))
    return False


class _Line:
    """One line's evaluation against `target` (the Options object)."""

    def __init__(self, target, text: str):
        import optimum_ipu.poptorch as poptorch  # the package, for `poptorch.X`

        self.target, self.text = target, text
        self.names = {"poptorch": poptorch, "torch": torch, **{e: getattr(enums, e) for e in enums.__all__}}

    def _source(self, node: ast.AST) -> str:
        """`node` as written on the line, bounded."""
        return clipped(ast.get_source_segment(self.text, node) or ast.unparse(node))

    def setter_chain(self, node: ast.expr) -> Any:
        """`a.b(...).c(...)` on the Options object: attributes and calls of option objects only."""
        if isinstance(node, ast.Name):
            return self._option_attribute(self.target, node.id, "")
        if isinstance(node, ast.Attribute):
            return self._option_attribute(
                self.setter_chain(node.value), node.attr, self._source(node.value) + "."
            )
        if isinstance(node, ast.Call):
            method = self.setter_chain(node.func)
            if not _is_option_method(method):
                raise Refused(f"{self._source(node.func)} is not a setter")
            return self._call(node, method)
        raise Refused(f"{self._source(node)} is not part of a setter call")

    def _call(self, node: ast.Call, function: Any) -> Any:
        """Call a setter or an option class with the line's literal arguments; its error names it."""
        if any(k.arg is None for k in node.keywords):
            raise Refused("** arguments are not literals")
        args = [self.value(a) for a in node.args]
        kwargs = {k.arg: self.value(k.value) for k in node.keywords}
        try:
            return function(*args, **kwargs)
        except Exception as error:
            written = clipped(", ".join(self._source(a) for a in [*node.args, *node.keywords]))
            raise SetterRefused(self._source(node.func), written, error) from None

    def _option_attribute(self, owner: Any, name: str, path: str) -> Any:
        if name == "loadFromFile":
            raise Refused("an options file cannot load another")
        return option_attribute(owner, name, path)

    def value(self, node: ast.expr) -> Any:
        """An argument: a literal, a dtype, an enum member, or an option object built by a call."""
        value = self._value(node)
        if isinstance(value, int) and not -_INT_LIMIT < value < _INT_LIMIT:
            raise BadValue(
                f"{shown(value)} does not fit in 64 bits, which every number of a PopTorch option does"
            )
        return value

    def _value(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        try:
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
        except (ArithmeticError, TypeError) as error:  # 4 / 0, an int too large for a float, {[1]: 2}
            raise BadValue(f"{self._source(node)}: {error}") from None
        if isinstance(node, ast.Name):
            if node.id not in self.names:
                raise Refused(
                    f"{clipped(node.id)} is not a name an options file knows (poptorch, torch, the poptorch enums)"
                    + _did_you_mean(node.id, self.names)
                )
            return self.names[node.id]
        if isinstance(node, ast.Attribute):
            return self._argument_attribute(node)
        if isinstance(node, ast.Call):
            call = self.value(node.func)
            if not (_is_option_class(call) and not issubclass(call, Enum)) and not _is_option_method(call):
                raise Refused(
                    f"{self._source(node.func)} is not one of poptorch's option classes or their setters"
                )
            return self._call(node, call)
        raise Refused(f"{self._source(node)} is not a literal")

    def _number(self, node: ast.expr) -> int | float:
        value = self.value(node)
        if type(value) not in (int, float):
            raise Refused(f"{self._source(node)} is not a number")
        return value

    def _argument_attribute(self, node: ast.Attribute) -> Any:
        owner = self.value(node.value)
        base, prefix = self._source(node), self._source(node.value) + "."
        if owner is torch:
            value = getattr(torch, node.attr, None)
            if not isinstance(value, torch.dtype):
                dtypes = [n for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)]
                raise Refused(f"{base} is not a torch dtype{_did_you_mean(node.attr, dtypes, prefix)}")
            return value
        if owner is self.names["poptorch"]:
            value = getattr(owner, node.attr, None)
            if not _is_option_class(value):
                classes = [n for n in dir(owner) if _is_option_class(getattr(owner, n, None))]
                hint = _did_you_mean(node.attr, classes, prefix)
                raise Refused(f"{base} is not one of poptorch's option classes or enums{hint}")
            return value
        if isinstance(owner, type) and issubclass(owner, Enum):
            if node.attr in owner.__members__:
                return owner[node.attr]
            hint = _did_you_mean(node.attr, owner.__members__, prefix)
            raise Refused(f"{base} is not a member of {owner.__name__}{hint}")
        if type(owner).__module__ in _OPTION_MODULES and hasattr(owner, node.attr):
            return getattr(owner, node.attr)  # a setter of an option object built on this line
        raise Refused(f"{base} is not an option, an enum member or a dtype")


def lines(filepath: str) -> Iterator[tuple[str, str]]:
    """(`file:line`, the line stripped) for each line of `filepath`, read a bounded line at a time.

    Raises:
        ValueError: for a line longer than `MAX_LINE` characters (read no further than the limit), or
            one that is not UTF-8 text.
    """
    limit = 4 * MAX_LINE + 2  # bytes: up to 4 per character in UTF-8, and the line's end
    with open(filepath, "rb") as f:
        for number in itertools.count(1):
            raw, where = f.readline(limit + 1), f"{filepath}:{number}"
            if not raw:
                return
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8").strip()
            except UnicodeDecodeError as error:
                if len(raw) <= limit:
                    raise ValueError(
                        f"{where}: the line is not UTF-8 text ({error.reason} at byte {error.start}); an options "
                        "file is a text file of setter calls, e.g. deviceIterations(4)."
                    ) from None
                text = raw.decode("utf-8", errors="replace")
            if len(raw) > limit or len(text) > MAX_LINE:
                raise ValueError(
                    f"{where}: the line is longer than {MAX_LINE:,} characters (it starts {clipped(text[:160])!r}); "
                    f"{HINT}, so a line is short: split the settings over several lines."
                )
            yield where, text


def apply_line(target, line: str, where: str) -> None:
    """Apply one line of an options file to `target`; `ValueError` naming `where` (file:line) otherwise."""
    quoted = repr(clipped(line))
    too_deep = (
        f"{where}: {quoted} is not an Options setter call with literal arguments (it is nested more than "
        f"{MAX_DEPTH} levels deep); {HINT}."
    )
    try:
        tree = ast.parse(line, mode="eval")
    except SyntaxError as error:
        if "too many nested" in str(error.msg):
            raise ValueError(too_deep) from None
        if "integer string conversion" in str(error.msg):  # a literal of more than 4,300 digits
            raise ValueError(
                f"{where}: {quoted}: an integer of more than 4,300 digits does not fit in 64 bits, which every "
                "number of a PopTorch option does; write the value itself, e.g. deviceIterations(4)."
            ) from None
        raise ValueError(f"{where}: {quoted} is not a setter call: {clipped(error.msg)}; {HINT}.") from None
    except ValueError as error:  # a null byte (Python 3.11; 3.12 raises a SyntaxError)
        raise ValueError(f"{where}: {quoted} is not a setter call: {clipped(str(error))}; {HINT}.") from None
    except (RecursionError, MemoryError):
        raise ValueError(too_deep) from None
    if _deeper_than(tree, MAX_DEPTH):
        raise ValueError(too_deep)
    private = _private_names(tree)
    try:
        if private:
            raise Refused(f"private names are not options: {clipped(', '.join(private))}")
        if not isinstance(tree.body, ast.Call):
            raise Refused("not a call")
        _Line(target, line).setter_chain(tree.body)
    except Refused as error:
        raise ValueError(
            f"{where}: {quoted} is not an Options setter call with literal arguments ({error}); {HINT}."
        ) from None
    except BadValue as error:
        raise ValueError(
            f"{where}: {quoted}: {error}; write the value itself, e.g. deviceIterations(4)."
        ) from None
    except SetterRefused as error:
        raise ValueError(f"{where}: {error}") from None


def load_file(target, filepath: str) -> None:
    """Apply every line of `filepath` to `target` (`#` lines and blank ones skipped); see the module."""
    for where, line in lines(filepath):
        if line and not line.startswith("#"):
            apply_line(target, line, where)
