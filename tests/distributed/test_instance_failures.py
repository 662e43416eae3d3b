"""An instance that fails while the others wait for it in a collective ends the whole launch within seconds.

`_crashing_worker.py` runs 2 instances; instance 1 fails after one collective step, while instance 0
goes into the next and waits for it there. Under poprun, plain torchrun, and `optimum-ipu run` under
torchrun, the launch must end soon after the failure with instance 1's status (poprun names it and
where its output went). Before, the exit barrier registered at exit held the failed instance, so its
peer waited in the collective until gloo's 30-minute timeout and the launch never returned.

Each launch is killed (with its whole process group) if it has not ended 20 s after the failure, so
a regression fails here instead of hanging the suite; the time to start the instances (imports on a
loaded machine) is not counted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from optimum_ipu.runtime.distributed import EXIT_WAIT

WORKER = Path(__file__).with_name("_crashing_worker.py")
STARTUP = 180  # seconds the instances may take to start and reach the failure (a loaded CI machine)
AFTER_FAILURE = 20  # seconds the launch may take to end once instance 1 failed
pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch.distributed with gloo")

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "--monitor_interval=0.1"]  # fmt: skip
POPRUN = [sys.executable, "-m", "optimum_ipu.sdk.poprun", "--num-instances", "2"]


def _stop(process: subprocess.Popen, marker: str) -> None:
    """End a launch that hangs: the launcher (SIGTERM: torchrun stops its workers), then, SIGKILL, whatever is
    left of it and of the instances it started (torchrun starts each in a session of its own; they are found by
    the `CRASHING_WORKER_MARK` this launch gave them)."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"CRASHING_WORKER_MARK={marker}".encode() in environ.read_bytes().split(b"\0"):
                os.kill(int(environ.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def _launch(command: list[str], tmp_path: Path) -> tuple[int, str, float]:
    """Run `command`; (its status, its stderr, seconds from instance 1's failure to the launch's end)."""
    failed_at = tmp_path / "failed_at"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", CRASHING_WORKER_MARK=str(failed_at))
    with open(tmp_path / "stdout", "w+") as out, open(tmp_path / "stderr", "w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + STARTUP
            while not failed_at.exists() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            status = process.wait(timeout=AFTER_FAILURE if failed_at.exists() else 1)
        except subprocess.TimeoutExpired:
            _stop(process, str(failed_at))
            err.seek(0)
            when = f"{AFTER_FAILURE} s after instance 1 failed" if failed_at.exists() else f"after {STARTUP} s"
            pytest.fail(f"{command} still ran {when}:\n{err.read()[-3000:]}")
        ended = time.time()
        err.seek(0)
        stderr = err.read()
    assert failed_at.exists(), f"instance 1 never reached its failure:\n{stderr[-3000:]}"
    return status, stderr, ended - float(failed_at.read_text())


@pytest.mark.parametrize("collective", ["hvd", "poptorch"])
def test_poprun_ends_every_instance_with_the_failed_ones_status(collective, tmp_path):
    status, stderr, took = _launch([*POPRUN, sys.executable, str(WORKER), collective, "raise"], tmp_path)
    assert status == 1, stderr[-3000:]
    assert "poprun: instance 1 exited with status 1; its output is above. The other instances were stopped." in stderr
    assert "instance 0 was not stopped" not in (tmp_path / "stdout").read_text()
    assert took < EXIT_WAIT.total_seconds(), took  # it did not wait for instance 0 to reach its exit


def test_poprun_names_the_log_files_of_a_failed_instance_whose_output_is_not_shown(tmp_path):
    command = [*POPRUN, "--only-output-from-instance", "0", sys.executable, str(WORKER), "hvd", "raise"]
    status, stderr, _ = _launch(command, tmp_path)
    assert status == 1, stderr[-3000:]
    line = next(line for line in stderr.splitlines() if line.startswith("poprun: instance 1 exited"))
    logs = line.split("its output is in ")[1].split(". The other")[0].split(" and ")
    assert [Path(f).name for f in logs] == ["stdout.log", "stderr.log"]
    assert "RuntimeError: instance 1 fails on purpose" in Path(logs[1]).read_text()


def test_poprun_exits_with_the_status_an_instance_gave_sys_exit(tmp_path):
    """sys.exit(3) is no exception: instance 1 waits for instance 0 at its exit, EXIT_WAIT at most, then leaves
    first, and instance 0's broken collective defers to it."""
    status, stderr, took = _launch([*POPRUN, sys.executable, str(WORKER), "hvd", "exit"], tmp_path)
    assert status == 3, stderr[-3000:]
    assert "poprun: instance 1 exited with status 3" in stderr
    assert took < EXIT_WAIT.total_seconds() + 8, took


def test_torchrun_ends_every_process_when_one_fails_in_a_replicated_step(tmp_path):
    status, stderr, took = _launch([*TORCHRUN, str(WORKER), "poptorch", "raise"], tmp_path)
    assert status == 1, stderr[-3000:]
    assert "instance 0 was not stopped" not in (tmp_path / "stdout").read_text()
    assert took < EXIT_WAIT.total_seconds(), took


def test_optimum_ipu_run_under_torchrun_ends_every_process_when_one_fails(tmp_path):
    """`optimum-ipu run` catches the program's exception to print it: it records it as the interpreter does,
    so the process still leaves without waiting for the others."""
    command = [*TORCHRUN, "--no_python", sys.executable, "-m", "optimum_ipu.cli", "run", str(WORKER), "hvd", "raise"]
    status, stderr, took = _launch(command, tmp_path)
    assert status == 1, stderr[-3000:]
    assert "RuntimeError: instance 1 fails on purpose" in stderr
    assert took < EXIT_WAIT.total_seconds(), took
