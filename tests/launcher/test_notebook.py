"""`run_notebook`: a notebook's code cells, in order, in one namespace; IPython-only lines skipped with a note."""

import json

import pytest

from optimum_ipu.launcher import LauncherError, run_notebook
from optimum_ipu.launcher._report import PREFIX


def write_notebook(path, cells):
    """A nbformat-4 notebook from (cell_type, source) pairs."""
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                "cells": [{"cell_type": kind, "metadata": {}, "source": source, **({"outputs": [], "execution_count": None} if kind == "code" else {})}
                          for kind, source in cells]}  # fmt: skip
    path.write_text(json.dumps(notebook))
    return path


def test_code_cells_run_in_order_in_one_namespace_and_markdown_is_ignored(tmp_path, capsys):
    out = tmp_path / "out.txt"
    notebook = write_notebook(tmp_path / "nb.ipynb", [
        ("markdown", "# print('markdown is not code')"),
        ("code", ["values = [1]\n", "def add(x):\n", "    values.append(x)"]),
        ("code", "add(2)"),
        ("code", f"add(3)\nopen({str(out)!r}, 'w').write(repr(values))"),
    ])  # fmt: skip
    assert run_notebook(notebook, []) == 0
    assert out.read_text() == "[1, 2, 3]"
    assert "markdown is not code" not in capsys.readouterr().out


def test_shell_and_magic_lines_are_skipped_with_one_note_each_naming_them(tmp_path, capsys):
    notebook = write_notebook(tmp_path / "nb.ipynb", [
        ("code", '%pip install "optimum-graphcore>=0.5"\n!apt install git-lfs\nx = 1'),
        ("code", "if x:\n    !echo inside a block\n    y = x + 1"),
        ("code", "%%bash\necho a cell magic"),
        ("code", "y"),
    ])  # fmt: skip
    assert run_notebook(notebook, []) == 0
    out, err = capsys.readouterr()
    notes = [line for line in err.splitlines() if line.startswith(PREFIX)]
    assert notes == [
        f'{PREFIX} cell 1: skipped magic line: %pip install "optimum-graphcore>=0.5"',
        f"{PREFIX} cell 1: skipped shell command line: !apt install git-lfs",
        f"{PREFIX} cell 2: skipped shell command line: !echo inside a block",
        f"{PREFIX} cell 3: skipped the whole cell (cell magic %%bash: not Python).",
    ]
    assert out.strip().splitlines()[-1] == "2"  # a cell's last expression is shown, as Jupyter shows it


def test_a_failing_cell_stops_the_run_with_its_traceback(tmp_path, capsys):
    out = tmp_path / "after.txt"
    notebook = write_notebook(tmp_path / "nb.ipynb", [
        ("code", "x = 1"), ("code", "x = 1 / 0"), ("code", f"open({str(out)!r}, 'w')"),
    ])  # fmt: skip
    assert run_notebook(notebook, []) == 1
    err = capsys.readouterr().err
    assert "<nb.ipynb cell 2>" in err and "x = 1 / 0" in err and "ZeroDivisionError" in err
    assert "nb.ipynb: cell 2 raised ZeroDivisionError; the cells after it did not run." in err
    assert not out.exists()


def test_a_notebook_without_code_cells_is_one_line(tmp_path):
    notebook = write_notebook(tmp_path / "empty.ipynb", [("markdown", "only prose"), ("code", "  \n")])
    with pytest.raises(
        LauncherError, match=r"empty\.ipynb: the notebook has no code cells, so there is nothing to run"
    ):
        run_notebook(notebook, [])


def test_a_file_that_is_not_a_notebook_is_one_line(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("print('a script')")
    with pytest.raises(LauncherError, match=r"bad\.ipynb: not a readable Jupyter notebook"):
        run_notebook(bad, [])
