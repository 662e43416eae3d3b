"""`run_notebook`: a notebook's code cells, in order, in one namespace; IPython-only lines skipped with a note."""

import importlib.util
import json

import pytest

from optimum_ipu.launcher import LauncherError, run_notebook
from optimum_ipu.launcher._report import PREFIX
from optimum_ipu.launcher.notebook import CodeCell, python_source


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


def test_a_syntax_error_in_a_cell_shows_the_cell_line_and_caret_without_the_launchers_frames(
    tmp_path, capsys
):
    """A cell that does not parse is shown as Python shows a script that does not parse: no frames at all."""
    notebook = write_notebook(tmp_path / "nb.ipynb", [("code", "x = 1"), ("code", "y = 2\nfor\n")])
    assert run_notebook(notebook, []) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        '  File "<nb.ipynb cell 2>", line 2',
        "    for",
        "       ^",
        "SyntaxError: invalid syntax",
        "nb.ipynb: cell 2 raised SyntaxError; the cells after it did not run.",
    ]


def test_a_runtime_error_in_a_cells_last_expression_shows_no_launcher_frames(tmp_path, capsys):
    notebook = write_notebook(tmp_path / "nb.ipynb", [("code", "def f():\n    return 1 / 0\nf()")])
    assert run_notebook(notebook, []) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert '"<nb.ipynb cell 1>", line 3' in err and '"<nb.ipynb cell 1>", line 2, in f' in err
    assert "optimum_ipu" not in err and "ast.py" not in err


def test_only_a_line_that_starts_a_statement_is_a_magic_and_string_text_stays_byte_for_byte(tmp_path, capsys):
    """`%` or `!` inside a string literal, or `%` continuing an expression in brackets, is the user's Python."""
    out = tmp_path / "out.json"
    text = (
        "\n%pip install not-a-magic\n!echo not a shell line\n%%bash too\nline\u2028separator\x0cform feed\n"
    )
    cell = (
        f's = """{text}"""\n'
        "r = (10\n% 3)\n"
        "if r:\n    %ls\n"
        f"open({str(out)!r}, 'w').write(json.dumps([s, r]))\n"
    )
    notebook = write_notebook(
        tmp_path / "nb.ipynb", [("code", "import json\n!echo a real shell line"), ("code", cell)]
    )
    assert run_notebook(notebook, []) == 0
    assert json.loads(out.read_text()) == [text, 1]
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith(PREFIX)]
    assert notes == [
        f"{PREFIX} cell 1: skipped shell command line: !echo a real shell line",
        f"{PREFIX} cell 2: skipped magic line: %ls",
    ]


@pytest.mark.parametrize(
    ("source", "what"),
    [
        (["x = 1\n", 3], "a list holding 3 (int) at item 1"),
        ({"text": "x = 1"}, "{'text': 'x = 1'} (dict)"),
        (None, "None (NoneType)"),
    ],
)
def test_a_cell_source_that_is_not_a_string_or_list_of_strings_is_one_line_naming_the_cell(
    tmp_path, source, what
):
    out = tmp_path / "ran.txt"
    notebook = write_notebook(tmp_path / "nb.ipynb", [
        ("code", f"open({str(out)!r}, 'w')"), ("markdown", "prose"), ("code", source),
    ])  # fmt: skip
    with pytest.raises(LauncherError) as raised:
        run_notebook(notebook, [])
    assert str(raised.value) == (
        f"{notebook.resolve()}: cell 2 (cells[2] in the file) is malformed: its source is {what}, and a cell's "
        'source must be a string or a list of strings. Fix that cell\'s "source" in the notebook file (or '
        "re-create the cell in Jupyter and save the notebook)."
    )
    assert not out.exists()  # found before any cell runs


def test_python_source_changes_only_the_magic_lines_and_keeps_every_other_byte():
    """Line endings (CRLF included), a docstring at statement level and backslash continuations stay as
    written; only the lines that start a statement with `%` or `!` become `pass` (and a shell line's
    backslash-continued tail a blank line), so line numbers do not move."""
    source = (
        '"""A docstring\r\n%d is text here\r\n"""\r\n'
        "!pip install a \\\r\n    b\r\n"
        "total = 1 + \\\r\n2\r\n"
        "files = !ls\r\n"
        "%ls"
    )
    expected = '"""A docstring\r\n%d is text here\r\n"""\r\npass\r\n\r\ntotal = 1 + \\\r\n2\r\npass\r\npass'
    assert python_source(CodeCell(1, source)) == expected


def test_without_ipython_a_plot_and_an_audio_cell_run_as_text(tmp_path, capsys, monkeypatch):
    """whisper-example.ipynb: `import IPython`, a matplotlib figure (matplotlib asks any imported IPython for
    `get_ipython()`), then `IPython.display.Audio(samples, rate=...)` as the cell's value."""
    pytest.importorskip("matplotlib")
    if importlib.util.find_spec("IPython") is not None:
        pytest.skip("IPython is installed: the stand-in is not used")
    monkeypatch.delenv("MPLBACKEND", raising=False)
    notebook = write_notebook(tmp_path / "nb.ipynb", [
        ("code", "import IPython\nimport matplotlib.pyplot as plt\nfrom IPython.display import clear_output"),
        ("code", "plt.figure(figsize=(4, 2))\nclear_output()\nIPython.display.Audio([0.0] * 16000, rate=16000)"),
    ])  # fmt: skip
    assert run_notebook(notebook, []) == 0
    assert "<IPython.display.Audio: 16000 samples at 16000 Hz>" in capsys.readouterr().out
