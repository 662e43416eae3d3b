"""`run_notebook` runs the cells in an interpreter that looks interactive, as Jupyter's kernel does
(optimum_ipu/launcher/notebook.py, `_kernel_prompts`).

name-entity-extraction.ipynb calls gradio's `demo.launch()` and goes on to more cells: in a notebook
`launch()` returns at once (its server runs in the background) because `sys.ps1` is set; in a script
it blocks the main thread for good.
"""

import json
import sys

from optimum_ipu.launcher import run_notebook


def write_notebook(path, *sources):
    cells = [
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": s}
        for s in sources
    ]
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}))
    return path


def test_cells_see_the_kernels_prompts_and_a_launch_that_waits_only_in_scripts_returns(tmp_path, capsys):
    assert not hasattr(sys, "ps1")  # pytest is no interactive interpreter
    notebook = write_notebook(
        tmp_path / "app.ipynb",
        "import sys\n"
        "def launch():\n"
        "    # A web app's launch: in a script it would wait here until stopped.\n"
        "    if not hasattr(sys, 'ps1') and not sys.flags.interactive:\n"
        "        raise RuntimeError('would block the script forever')\n"
        "    return 'serving in the background'",
        "launch()",
        "print('next cell ran', repr(sys.ps1))",
    )
    assert run_notebook(notebook, []) == 0
    out = capsys.readouterr().out
    assert "'serving in the background'" in out and "next cell ran 'In : '" in out
    assert not hasattr(sys, "ps1") and not hasattr(sys, "ps2")  # taken back after the run


def test_prompts_the_caller_had_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    notebook = write_notebook(tmp_path / "nb.ipynb", "import sys\nassert sys.ps1 == 'In : '")
    assert run_notebook(notebook, []) == 0
    assert sys.ps1 == ">>> "
