"""What Jupyter's Python kernel does that `run_notebook` must do too, and what `python SCRIPT` does with a
file's encoding: read notebooks as UTF-8 and scripts as Python reads them whatever the locale, `display`
defined without an import, a notebook in another language refused, `sys.exit()` in a cell stopping the run
as "Run all" stops, saying so."""

import builtins
import json
import os
import subprocess
import sys

import pytest

from optimum_ipu.launcher import LauncherError, run_notebook, run_script


def write_notebook(path, *sources, metadata=None):
    cells = [
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": s}
        for s in sources
    ]
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": metadata or {}, "cells": cells}
    path.write_text(json.dumps(notebook, ensure_ascii=False), encoding="utf-8")
    return path


# -- encodings: the locale's is not the file's ------------------------------------------------------

# A C/POSIX locale as the brief of issue 41 gives it: Python's UTF-8 mode off, the locale not coerced.
C_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}


def _c_locale_env():
    env = {key: value for key, value in os.environ.items() if key != "PYTHONIOENCODING"}
    env.update(C_LOCALE)
    probe = subprocess.run([sys.executable, "-c", "import locale; print(locale.getpreferredencoding(False))"],
                           env=env, capture_output=True, text=True, check=True)  # fmt: skip
    if "utf" in probe.stdout.lower():
        pytest.skip(f"this platform's C locale reads files as {probe.stdout.strip()}: nothing to show")
    return env


def _optimum_ipu_run(program, env, cwd):
    command = [sys.executable, "-c", "import sys; from optimum_ipu.cli import main; sys.exit(main())",
               "run", str(program)]  # fmt: skip
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=240)


def test_a_utf8_notebook_and_script_run_under_a_c_locale_as_python_runs_the_script(tmp_path):
    env = _c_locale_env()
    script = tmp_path / "utf8.py"
    script.write_text('word = "café ∑"\nopen("script.txt", "w").write(ascii(word))\n', encoding="utf-8")
    python = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert python.returncode == 0, python.stderr  # the reference: python reads a script as UTF-8
    expected = (tmp_path / "script.txt").read_text()
    (tmp_path / "script.txt").unlink()

    ran = _optimum_ipu_run(script, env, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "script.txt").read_text() == expected == ascii("café ∑")

    notebook = write_notebook(tmp_path / "utf8.ipynb", "# Ünïcödé in a comment\nword = 'café ∑'",
                              "open('notebook.txt', 'w').write(ascii(word))")  # fmt: skip
    ran = _optimum_ipu_run(notebook, env, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "notebook.txt").read_text() == expected


def test_a_script_with_a_pep_263_coding_line_is_read_in_its_declared_encoding(tmp_path):
    script = tmp_path / "latin1.py"
    script.write_bytes('# -*- coding: latin-1 -*-\nword = "café"\nopen("out.txt", "w").write(ascii(word))\n'
                       .encode("latin-1"))  # fmt: skip
    python = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True)
    assert python.returncode == 0, python.stderr
    expected = (tmp_path / "out.txt").read_text()
    (tmp_path / "out.txt").unlink()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert run_script(script, []) == 0
    finally:
        os.chdir(cwd)
    assert (tmp_path / "out.txt").read_text() == expected == ascii("café")


@pytest.mark.parametrize(("line", "reason"), [(1, "invalid or missing encoding declaration"),
                                              (3, "'utf-8' codec can't decode byte 0xe9")])  # fmt: skip
def test_a_script_that_is_not_utf8_and_declares_no_encoding_is_one_line_naming_pep_263(tmp_path, line, reason):
    """Python's tokenizer checks the first two lines for a coding line; a later byte fails when it is decoded."""
    script = tmp_path / "latin1.py"
    lines = ["x = 1\n", "y = 2\n", "z = 3\n"]
    lines[line - 1] = 'word = "café"\n'
    script.write_bytes("".join(lines).encode("latin-1"))
    with pytest.raises(LauncherError) as raised:
        run_script(script, [])
    message = str(raised.value)
    assert message.startswith(f"{script}: cannot read the script: {reason}")
    assert message.count(str(script)) == 1 and "PEP 263" in message and "# -*- coding: latin-1 -*-" in message


# -- the kernel's builtins --------------------------------------------------------------------------


def test_display_is_defined_without_an_import_as_in_every_jupyter_kernel(tmp_path, capsys):
    notebook = write_notebook(tmp_path / "nb.ipynb", "display('shown by display', 42)", "x = 1")
    assert run_notebook(notebook, []) == 0
    out = capsys.readouterr().out
    assert "shown by display" in out and "42" in out
    assert not hasattr(builtins, "display")  # taken back after the run


def test_a_notebooks_own_display_wins(tmp_path, capsys):
    notebook = write_notebook(tmp_path / "nb.ipynb", "def display(x):\n    print('mine', x)", "display(1)")
    assert run_notebook(notebook, []) == 0
    assert "mine 1" in capsys.readouterr().out


# -- the kernel's language --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [
        {"kernelspec": {"name": "ir", "display_name": "R", "language": "R"}, "language_info": {"name": "R"}},
        {"language_info": {"name": "R"}},
        {"kernelspec": {"name": "ir", "display_name": "R", "language": "R"}},
    ],
    ids=["both", "language_info", "kernelspec"],
)
def test_a_notebook_in_another_language_is_refused_naming_it(tmp_path, metadata):
    after = tmp_path / "ran.txt"
    notebook = write_notebook(tmp_path / "r.ipynb", f"open({str(after)!r}, 'w')", metadata=metadata)
    with pytest.raises(LauncherError, match=r"r\.ipynb: .*language is 'R'.*optimum-ipu runs Python notebooks"):
        run_notebook(notebook, [])
    assert not after.exists()  # refused before any cell ran


@pytest.mark.parametrize("language", ["python", "Python", "python3"])
def test_a_python_notebook_runs(tmp_path, language):
    metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": language},
                "language_info": {"name": "python", "version": "3.10.12"}}  # fmt: skip
    assert run_notebook(write_notebook(tmp_path / "nb.ipynb", "x = 1", metadata=metadata), []) == 0


# -- sys.exit() in a cell ---------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "status"), [("0", 0), ("3", 3), ("", 0)])
def test_sys_exit_in_a_cell_stops_the_run_saying_which_cell_and_that_the_later_ones_did_not_run(
    tmp_path, capsys, code, status
):
    after = tmp_path / "after.txt"
    notebook = write_notebook(tmp_path / "nb.ipynb", "x = 1", f"import sys\nsys.exit({code})",
                              f"open({str(after)!r}, 'w')", "y = 2")  # fmt: skip
    assert run_notebook(notebook, []) == status
    err = capsys.readouterr().err
    assert f"nb.ipynb: cell 2 raised SystemExit({code})" in err
    assert "cells 3 to 4 did not run" in err
    assert not after.exists()


def test_sys_exit_with_a_message_prints_it_and_exits_1_naming_the_cell(tmp_path, capsys):
    notebook = write_notebook(tmp_path / "nb.ipynb", "raise SystemExit('stopped here')", "y = 2")
    assert run_notebook(notebook, []) == 1
    err = capsys.readouterr().err
    assert "stopped here" in err and "cell 1 raised SystemExit('stopped here')" in err and "cell 2 did not run" in err


def test_sys_exit_in_the_last_cell_says_no_cell_was_left(tmp_path, capsys):
    notebook = write_notebook(tmp_path / "nb.ipynb", "x = 1", "import sys\nsys.exit(0)")
    assert run_notebook(notebook, []) == 0
    assert "cell 2 raised SystemExit(0); it was the last code cell" in capsys.readouterr().err
