"""`optimum-ipu run` on the command line: the program's arguments pass through untouched; errors are one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

BEHAVIOUR = Path(__file__).resolve().parents[1] / "launcher" / "scripts" / "behaviour.py"


def optimum_ipu(*argv, cwd=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "optimum_ipu.cli", *argv], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)  # fmt: skip


def test_program_arguments_pass_through_including_debug_and_help(tmp_path):
    out = tmp_path / "seen.json"
    done = optimum_ipu("run", str(BEHAVIOUR), "describe", str(out), "--debug", "underflow_overflow", "-h")
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["argv"] == [
        str(BEHAVIOUR),
        "describe",
        str(out),
        "--debug",
        "underflow_overflow",
        "-h",
    ]


def test_exit_status_is_the_programs():
    assert optimum_ipu("run", str(BEHAVIOUR), "exit", "7").returncode == 7


def test_missing_program_is_one_error_line_without_traceback(tmp_path):
    done = optimum_ipu("run", str(tmp_path / "run_glue.py"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'run_glue.py'}: no such file; give the path of a Python script (.py) or a notebook (.ipynb)."
    ]


def test_offline_hub_data_is_one_error_line_naming_the_scripts_flags():
    done = optimum_ipu("run", str(BEHAVIOUR), "offline-data")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: behaviour.py:") and "--train_file, --validation_file" in last
    assert "Traceback" not in done.stderr
