"""Run a Jupyter notebook's code cells in order, in one namespace, as "Run all" would.

Markdown and raw cells are ignored. IPython syntax is not Python: shell lines (`!pip install ...`)
and magics (`%pip ...`, `%%capture` cells) are skipped, each with one note saying which. The value
of a cell's last expression is printed, as Jupyter shows it. The first cell that raises stops the
run with its traceback (status 1).
"""

from __future__ import annotations

import ast
import json
import linecache
import os
import re
import sys
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

_SHELL_OR_MAGIC = re.compile(r"^(\s*)(?:[\w.,\s\[\]]+=\s*)?([!%])")


@dataclass(frozen=True)
class CodeCell:
    """A code cell: its number among the code cells (from 1) and its source."""

    number: int
    source: str


def read_code_cells(path: Path) -> list[CodeCell]:
    """The code cells of the notebook at `path`, in order (nbformat 4)."""
    try:
        notebook = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise LauncherError(f"{path}: not a readable Jupyter notebook ({error}).") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise LauncherError(f"{path}: not a Jupyter notebook in nbformat 4 (no 'cells' list); open and save it in "
                            "Jupyter to convert it.")  # fmt: skip
    sources = [
        "".join(cell["source"]) if isinstance(cell.get("source"), list) else str(cell.get("source", ""))
        for cell in notebook["cells"]
        if isinstance(cell, dict) and cell.get("cell_type") == "code"
    ]
    return [CodeCell(number, source) for number, source in enumerate(sources, start=1)]


def python_source(cell: CodeCell) -> str | None:
    """The cell's source with shell and magic lines replaced by `pass` (one note each); None for a cell magic."""
    lines = cell.source.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.startswith("%%"):
        note(f"cell {cell.number}: skipped the whole cell (cell magic {first.split()[0]}: not Python).")
        return None
    kept: list[str] = []
    continuing = False  # a skipped line ending in a backslash continues on the next
    for line in lines:
        match = None if continuing else _SHELL_OR_MAGIC.match(line)
        if continuing:
            kept.append("")
        elif match:
            kind = "shell command" if match.group(2) == "!" else "magic"
            note(f"cell {cell.number}: skipped {kind} line: {line.strip()}")
            kept.append(f"{match.group(1)}pass")  # keeps a block valid and the line numbers right
        else:
            kept.append(line)
        continuing = (continuing or match is not None) and line.rstrip().endswith("\\")
    return "\n".join(kept)


def _run_cell(code: str, filename: str, namespace: dict) -> None:
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    tree = ast.parse(code, filename)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
        if value is not None:
            print(repr(value))


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
    with program_environment(context, [str(path), *args]), compatibility_shims(notebook=True):
        for cell in cells:
            code = python_source(cell)
            if code is None or not code.strip():
                continue
            try:
                _run_cell(code, filenames[cell.number], namespace)
            except SystemExit as exit_:
                return exit_code(exit_)
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
