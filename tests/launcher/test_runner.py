"""`run_script`: a script runs as `python SCRIPT ARGS` would, and ends as it would."""

import json
import sys
from pathlib import Path

import pytest

from optimum_ipu.launcher import LauncherError, run_script

SCRIPTS = Path(__file__).parent / "scripts"
BEHAVIOUR = SCRIPTS / "behaviour.py"


def test_script_runs_as_main_with_its_argv_and_its_folder_first_on_the_path(tmp_path):
    out = tmp_path / "seen.json"
    path_before, argv_before = sys.path[:], sys.argv[:]
    assert run_script(BEHAVIOUR, ["describe", str(out), "--flag", "-h"]) == 0
    seen = json.loads(out.read_text())
    assert seen["argv"] == [str(BEHAVIOUR), "describe", str(out), "--flag", "-h"]
    assert seen["name"] == "__main__"
    assert seen["file"] == str(BEHAVIOUR.resolve())
    assert seen["path0"] == str(SCRIPTS.resolve())
    assert (sys.path, sys.argv) == (path_before, argv_before)  # put back afterwards


@pytest.mark.parametrize("code", [0, 3])
def test_exit_code_of_sys_exit_is_returned(code):
    assert run_script(BEHAVIOUR, ["exit", str(code)]) == code


def test_sys_exit_with_a_message_prints_it_and_returns_1(capsys):
    assert run_script(BEHAVIOUR, ["exit-message", "stopped by the script"]) == 1
    assert "stopped by the script" in capsys.readouterr().err


def test_the_scripts_exception_is_shown_as_the_scripts_traceback(capsys):
    assert run_script(BEHAVIOUR, ["raise"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert f'File "{BEHAVIOUR.resolve()}"' in err and "in fail" in err
    assert err.rstrip().endswith("ValueError: the script's own error")
    assert (
        "runpy" not in err and "optimum_ipu/launcher" not in err
    )  # the launcher's frames are not the user's


def test_missing_script_is_one_line_naming_it(tmp_path):
    with pytest.raises(LauncherError, match=r"nothing\.py: no such file; give the path of a Python script"):
        run_script(tmp_path / "nothing.py", [])
    with pytest.raises(LauncherError, match=r": a folder; give the path of a Python script"):
        run_script(tmp_path, [])


def test_a_syntax_error_in_the_script_is_shown_as_python_shows_it_without_the_launchers_frames(
    tmp_path, capsys
):
    """`python bad.py` prints the file, the line, the caret and the error, and no frames: so must the launcher."""
    import subprocess

    script = tmp_path / "bad.py"
    script.write_text("x = 1\ny = (x,\n")
    assert run_script(script, []) == 1
    err = capsys.readouterr().err
    python = subprocess.run([sys.executable, str(script.resolve())], capture_output=True, text=True)
    assert err == python.stderr
    assert f'File "{script.resolve()}", line 2' in err and err.rstrip().endswith(
        "SyntaxError: '(' was never closed"
    )
    assert "Traceback" not in err and "runpy" not in err and "optimum_ipu" not in err


def test_a_note_said_in_data_loader_workers_is_printed_once_per_run(tmp_path, capfd):
    """A shim used in a DataLoader's worker processes (a collator's `as_target_processor()`, an audio column's
    decoding) is noted once for the run, not once per worker: the workers are the run's processes too."""
    script = tmp_path / "workers.py"
    script.write_text(
        "from torch.utils.data import DataLoader, Dataset\n"
        "from transformers.utils import send_example_telemetry\n"
        "class Items(Dataset):\n"
        "    def __len__(self):\n"
        "        return 6\n"
        "    def __getitem__(self, i):\n"
        "        send_example_telemetry('run_x', None)\n"
        "        return i\n"
        "for _ in DataLoader(Items(), num_workers=3, multiprocessing_context='fork'):\n"
        "    pass\n"
        "send_example_telemetry('run_x', None)\n"
    )
    assert run_script(script, []) == 0
    assert run_script(script, []) == 0  # a second run says it again, once
    said = [line for line in capfd.readouterr().err.splitlines() if "send_example_telemetry" in line]
    assert len(said) == 2, said
