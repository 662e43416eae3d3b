"""Run a Jupyter notebook's code cells in order, in one namespace, as "Run all" would.

Markdown and raw cells are ignored. IPython syntax is not Python: shell lines (`!pip install ...`)
and magics (`%pip ...`, `%%capture` cells) are skipped, each with one note saying which. Only a
line that starts a statement can be one of those (Python's tokenizer tells, as in IPython): a `%` or
`!` line inside a string literal or in brackets is the user's Python and runs byte for byte. The
value of a cell's last expression is printed, as Jupyter shows it. The first cell that raises stops
the run with its traceback (status 1); a cell that raises `SystemExit` stops it too, with the exit's
status and one line naming the cell and the cells that did not run. While the cells run, the
interpreter looks interactive, as in Jupyter's kernel (`sys.ps1` is set), so that libraries behave as
in a notebook (see `_kernel_prompts`), and `display` is a builtin, as IPython makes it (see
`_kernel_builtins`). The file is read as UTF-8 whatever the locale, and a notebook whose kernel
language is not Python is refused before any cell runs.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import json
import linecache
import os
import re
import reprlib
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from optimum_ipu.launcher import _context
from optimum_ipu.launcher._report import LauncherError, note
from optimum_ipu.launcher.runner import (
    exit_code,
    hub_offline_error,
    print_user_traceback,
    program_environment,
    where_in_user_code,
)
from optimum_ipu.launcher.shims import compatibility_shims

__all__ = ["CodeCell", "python_source", "read_code_cells", "run_notebook"]

# The shape of an IPython line: `!cmd`, `%magic`, or their output assigned (`files = !ls`). Only its shape:
# whether the line starts a statement, and so can be IPython at all, is for `_StatementStarts` to say.
_SHELL_OR_MAGIC = re.compile(r"^(\s*)(?:[\w.,\s\[\]]+=\s*)?([!%])")


@dataclass(frozen=True)
class CodeCell:
    """A code cell: its number among the code cells (from 1) and its source."""

    number: int
    source: str


def _cell_source(path: Path, number: int, index: int, cell: dict) -> str:
    """The cell's `source` as one string: nbformat 4 stores a string or a list of strings (its lines).

    Anything else means a malformed notebook; it is refused before any cell runs, naming the cell,
    rather than joined into a bare `TypeError` or, for a dict or None, run as the text of its repr.
    A cell without a `source` has no code and runs nothing.
    """
    source = cell.get("source", "")
    if isinstance(source, str):
        return source
    if isinstance(source, list):
        bad = next(((i, item) for i, item in enumerate(source) if not isinstance(item, str)), None)
        if bad is None:
            return "".join(source)
        what = f"a list holding {reprlib.repr(bad[1])} ({type(bad[1]).__name__}) at item {bad[0]}"
    else:
        what = f"{reprlib.repr(source)} ({type(source).__name__})"
    raise LauncherError(
        f"{path}: cell {number} (cells[{index}] in the file) is malformed: its source is {what}, and a cell's "
        'source must be a string or a list of strings. Fix that cell\'s "source" in the notebook file (or '
        "re-create the cell in Jupyter and save the notebook)."
    )


# The language names Jupyter's Python kernels write (ipykernel: "python"; older front ends "python3").
_PYTHON_LANGUAGE = re.compile(r"^i?python\d*$", re.IGNORECASE)


def _check_kernel_language(path: Path, metadata: object) -> None:
    """Refuse a notebook whose kernel language (`metadata.kernelspec.language`, `language_info.name`) is not
    Python, before any cell runs: its cells are R, Julia, ... code, which Python would run into a
    SyntaxError at best. A notebook that declares no language is taken as Python, as nbformat 4 files
    written without a kernel are."""
    if not isinstance(metadata, dict):
        return
    for section, key in (("kernelspec", "language"), ("language_info", "name")):
        entry = metadata.get(section)
        language = entry.get(key) if isinstance(entry, dict) else None
        if language is None or (isinstance(language, str) and _PYTHON_LANGUAGE.match(language.strip())):
            continue
        raise LauncherError(
            f"{path}: the notebook's kernel language is {language!r} (metadata.{section}.{key}), not Python: "
            f"optimum-ipu runs Python notebooks. Run this one in a Jupyter kernel for {language}, or give the "
            "Python notebook."
        )


def read_code_cells(path: Path) -> list[CodeCell]:
    """The code cells of the notebook at `path`, in order (nbformat 4), numbered from 1 among the code cells.

    The file is read as UTF-8, as Jupyter reads it, whatever the locale's encoding.

    Raises:
        LauncherError: the file is not JSON, not nbformat 4, declares a kernel language other than
            Python, or a code cell's source is not a string or a list of strings.
    """
    try:  # a notebook file is JSON in UTF-8 (as Jupyter writes and reads it), whatever the locale's encoding
        notebook = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LauncherError(f"{path}: not a readable Jupyter notebook ({error}).") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise LauncherError(f"{path}: not a Jupyter notebook in nbformat 4 (no 'cells' list); open and save it in "
                            "Jupyter to convert it.")  # fmt: skip
    _check_kernel_language(path, notebook.get("metadata"))
    code_cells = [
        (index, cell)
        for index, cell in enumerate(notebook["cells"])
        if isinstance(cell, dict) and cell.get("cell_type") == "code"
    ]
    return [
        CodeCell(number, _cell_source(path, number, index, cell))
        for number, (index, cell) in enumerate(code_cells, start=1)
    ]


def _lines(code: str) -> list[str]:
    """`code`'s lines with their endings, split where Python splits them (`\\n`, `\\r\\n`, `\\r`) and
    nowhere else: `str.splitlines` also splits at form feeds and Unicode line separators, which
    Python leaves inside a string literal, so joining its lines again would change the user's text."""
    return io.StringIO(code, newline="").readlines()


class _StatementStarts:
    """Which lines of a cell start a statement, told by Python's tokenizer as it reads the cell.

    A line starts a statement when the line before it ended one: its last token was a NEWLINE, or
    the NL of a blank or comment line outside brackets. A line inside a string literal, in brackets
    or after a backslash continuation does not, and neither does a line the tokens seen so far
    cannot vouch for, so an unsure answer leaves the line as the user wrote it.
    """

    def __init__(self) -> None:
        self.depth = 0  # brackets open
        self.last: tokenize.TokenInfo | None = None

    def see(self, token: tokenize.TokenInfo) -> None:
        """Take in the tokenizer's next token (the brackets it opens or closes, and where it is)."""
        if token.type == tokenize.OP and token.string in ("(", "[", "{"):
            self.depth += 1
        elif token.type == tokenize.OP and token.string in (")", "]", "}"):
            self.depth -= 1
        self.last = token

    def starts(self, row: int) -> bool:
        """Whether line `row` (from 1) starts a statement."""
        if row == 1:
            return True
        last = self.last
        return (
            last is not None
            and last.start[0] == row - 1
            and (last.type == tokenize.NEWLINE or (last.type == tokenize.NL and self.depth == 0))
        )


def python_source(cell: CodeCell) -> str | None:
    """The cell's source with shell and magic lines replaced by `pass` (one note each); None for a cell magic.

    A line is a shell or magic line only when it starts a statement, which the tokenizer tells as it
    reads the cell line by line (it asks for a line once it has given the tokens of the lines before).
    Every other line, those inside a multi-line string or brackets included, is kept byte for byte,
    and each line keeps its ending, so line numbers match the cell's. From a line the tokenizer
    cannot read on (broken code), the lines are kept as written: the compiler then reports the
    user's own error.
    """
    lines = _lines(cell.source)
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.startswith("%%"):
        note(f"cell {cell.number}: skipped the whole cell (cell magic {first.split()[0]}: not Python).")
        return None
    kept: list[str] = []
    statements = _StatementStarts()
    continuing = False  # a skipped line ending in a backslash continues on the next

    def readline() -> str:
        """The next line for the tokenizer, once it is kept or replaced (a shell or magic line)."""
        nonlocal continuing
        if len(kept) == len(lines):
            return ""
        line = lines[len(kept)]
        text = line.rstrip("\r\n")
        ending = line[len(text) :]
        match = None if continuing else _SHELL_OR_MAGIC.match(text)
        if match and not statements.starts(len(kept) + 1):
            match = None
        if continuing:
            kept.append(ending)
        elif match:
            kind = "shell command" if match.group(2) == "!" else "magic"
            note(f"cell {cell.number}: skipped {kind} line: {text.strip()}")
            kept.append(f"{match.group(1)}pass{ending}")  # keeps a block valid and the line numbers right
        else:
            kept.append(line)
        continuing = (continuing or match is not None) and text.rstrip().endswith("\\")
        return kept[-1].rstrip("\r\n") + ("\n" if ending else "")  # the tokenizer's line ends are "\n"

    try:
        for token in tokenize.generate_tokens(readline):
            if token.type == tokenize.ERRORTOKEN:  # Python 3.10 and 3.11 read on past broken code
                break
            statements.see(token)
    except (tokenize.TokenError, SyntaxError):
        pass
    kept.extend(lines[len(kept) :])
    return "".join(kept)


def _run_cell(code: str, filename: str, namespace: dict) -> None:
    linecache.cache[filename] = (len(code), None, _lines(code), filename)
    tree = ast.parse(code, filename)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
        if value is not None:
            print(repr(value))


# The prompts IPython's shell, and so Jupyter's kernel, sets on start.
_KERNEL_PROMPTS = {"ps1": "In : ", "ps2": "...: ", "ps3": "Out: "}


@contextlib.contextmanager
def _kernel_prompts() -> Iterator[None]:
    """`sys.ps1`, `ps2` and `ps3` as Jupyter's kernel sets them, while the cells run; as they were after.

    Python defines `sys.ps1` only in an interactive interpreter, and IPython sets it so that code can
    tell that it runs interactively; libraries ask it. gradio's `Blocks.launch()`, for one, blocks the
    main thread in a script (else the script would end and the app with it) but returns at once in a
    notebook, its server serving in the background: without the prompts the cells after a `launch()`
    would never run.
    """
    saved = {name: getattr(sys, name) for name in _KERNEL_PROMPTS if hasattr(sys, name)}
    for name, prompt in _KERNEL_PROMPTS.items():
        setattr(sys, name, prompt)
    try:
        yield
    finally:
        for name in _KERNEL_PROMPTS:
            if name in saved:
                setattr(sys, name, saved[name])
            elif hasattr(sys, name):
                delattr(sys, name)


def _display(*objects, **kwargs):
    """Jupyter's `display`, which IPython puts among the builtins of every kernel: here it is
    `IPython.display.display` (without a front end it prints), or the launcher's stand-in for it when
    IPython is not installed (it prints as text)."""
    from IPython.display import display

    return display(*objects, **kwargs)


@contextlib.contextmanager
def _kernel_builtins() -> Iterator[None]:
    """`display` among the builtins while the cells run, as in Jupyter's kernel; as they were after.

    A notebook calls `display(df)` without importing it, which in plain Python is a NameError. A
    `display` the caller's builtins already have (an IPython shell's) is kept; a notebook's own
    `display` (a function it defines, or its import) shadows the builtin, as in Jupyter.
    """
    if hasattr(builtins, "display"):
        yield
        return
    builtins.display = _display
    try:
        yield
    finally:
        vars(builtins).pop("display", None)  # a cell may have deleted or replaced it


def _stopped_by_exit(notebook: Path, cell: CodeCell, cells: list[CodeCell], exit_: SystemExit) -> int:
    """The status of a run a cell ended with `sys.exit()`, after one line saying so.

    Jupyter's "Run all" stops at a cell that raises `SystemExit` as at any other error, so the cells
    after it never run; the line names the cell and those cells, so that a `sys.exit(0)` cannot pass
    for a notebook that ran to its end.
    """
    status = exit_code(exit_)  # prints a message given as the code, as Python does
    raised = f"SystemExit({reprlib.repr(exit_.code)})" if exit_.args else "SystemExit()"
    later = [c.number for c in cells if c.number > cell.number and c.source.strip()]
    if not later:
        rest = "it was the last code cell"
    elif len(later) == 1:
        rest = f"cell {later[0]} did not run"
    else:
        rest = f"cells {later[0]} to {later[-1]} did not run"
    print(f"{notebook.name}: cell {cell.number} raised {raised}; {rest}. Exit status {status}.", file=sys.stderr)
    return status


def run_notebook(path: str | os.PathLike, args: list[str], serve_metrics: bool = True) -> int:
    """Run the code cells of the notebook at `path` in order in one namespace; return the exit status.

    Raises:
        LauncherError: the file is missing, not a notebook, has no code cells, or a shim stopped a cell.
    """
    notebook = Path(path)
    if not notebook.is_file():
        raise LauncherError(
            f"{path}: no such file; give the path of a Python script (.py) or a notebook (.ipynb)."
        )
    notebook = notebook.resolve()
    cells = read_code_cells(notebook)
    if not any(cell.source.strip() for cell in cells):
        raise LauncherError(f"{path}: the notebook has no code cells, so there is nothing to run.")
    context = _context.RunContext(path=notebook, kind="notebook", serve_metrics=serve_metrics)
    filenames = {cell.number: f"<{notebook.name} cell {cell.number}>" for cell in cells}
    user_files = tuple(filenames.values())
    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    with (
        program_environment(context, [str(path), *args]),
        compatibility_shims(notebook=True),
        _kernel_prompts(),
        _kernel_builtins(),
    ):
        for cell in cells:
            code = python_source(cell)
            if code is None or not code.strip():
                continue
            try:
                _run_cell(code, filenames[cell.number], namespace)
            except SystemExit as exit_:
                return _stopped_by_exit(notebook, cell, cells, exit_)
            except LauncherError as error:
                place = where_in_user_code(error, user_files)
                raise LauncherError(
                    f"{place}: {error}" if place else f"cell {cell.number}: {error}"
                ) from None
            except KeyboardInterrupt:
                raise
            except BaseException as error:
                offline = hub_offline_error(error, user_files)
                if offline is not None:
                    raise offline from None
                print_user_traceback(error, user_files)
                print(f"{notebook.name}: cell {cell.number} raised {type(error).__name__}; the cells after it did "
                      "not run.", file=sys.stderr)  # fmt: skip
                return 1
    return 0
