"""One training run at a time per output folder: a second run that starts while a live run writes its
checkpoints there is refused, naming that run; a lock left by a run that crashed is taken over, said once;
only the process that writes checkpoints holds it.

Before the lock, the second run's start-up cleanup deleted the staging folder of the checkpoint the first
was writing, and the first died with a FileNotFoundError inside `.incomplete-checkpoint-N/`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fixtures import PatternQA, tiny_bert_config
from transformers import BertForQuestionAnswering

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.checkpoints import CHECKPOINT_RE, STAGING_PREFIX, checkpoint_problems


def _trainer(out: Path, max_steps: int = 2) -> IPUTrainer:
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny_bert_config(num_hidden_layers=2))
    args = IPUTrainingArguments(output_dir=str(out), per_device_train_batch_size=2, max_steps=max_steps,
                                save_strategy="steps", save_steps=1, report_to="none", use_cpu=True, fp32=True,
                                dataloader_num_workers=0, disable_tqdm=True, logging_steps=1000)  # fmt: skip
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=3)
    return IPUTrainer(model, config, args, train_dataset=PatternQA(16))


def _checkpoints(out: Path) -> list[str]:
    return sorted(n for n in os.listdir(out) if CHECKPOINT_RE.match(n))


IN_USE = r"is the output_dir of another training run.*pid {pid} on host {host}.*its own output_dir"


def test_a_second_run_started_while_the_first_writes_a_checkpoint_is_refused_and_the_checkpoint_survives(
    tmp_path, monkeypatch
):
    """The reported failure, made deterministic: the second run starts in the middle of the first's write."""
    out = tmp_path / "out"
    first, second = _trainer(out), _trainer(out)
    refusals: list[BaseException] = []
    real_save = torch.save

    def save(obj, f, *args, **kwargs):  # the first checkpoint write of the first run: start the second run
        if STAGING_PREFIX in str(f) and not refusals:
            try:
                second.train()
            except RuntimeError as error:
                refusals.append(error)
            else:
                refusals.append(AssertionError("the second run was not refused"))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    first.train()  # died with FileNotFoundError inside .incomplete-checkpoint-1/ before the lock
    (refusal,) = refusals
    assert isinstance(refusal, RuntimeError), refusal
    assert str(out) in str(refusal)
    assert __import__("re").search(IN_USE.format(pid=os.getpid(), host=socket.gethostname()), str(refusal))
    assert _checkpoints(out) == ["checkpoint-1", "checkpoint-2"]
    assert all(checkpoint_problems(out / name) == [] for name in _checkpoints(out))
    assert not [n for n in os.listdir(out) if n.startswith(".")]  # nothing left behind: no lock, no staging


HOLDER = textwrap.dedent(
    """
    import sys
    from optimum_ipu.checkpoints.run_lock import output_dir_lock

    with output_dir_lock(sys.argv[1]):
        print("holding", flush=True)
        sys.stdin.readline()
    """
)


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of `tmp_path / "out"` until it is killed."""
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))  # fmt: skip
    try:
        assert process.stdout.readline().strip() == "holding"
        yield out, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def test_a_run_in_a_folder_another_live_process_trains_into_is_refused_before_training(holder, caplog):
    out, process = holder
    trainer = _trainer(out)
    with pytest.raises(RuntimeError) as raised:
        trainer.train()
    message = str(raised.value)
    assert __import__("re").search(IN_USE.format(pid=process.pid, host=socket.gethostname()), message), message
    assert "wait until that run ends" in message
    assert _checkpoints(out) == [] and trainer.state.global_step == 0  # refused before the first step


def test_the_lock_of_a_run_that_was_killed_is_taken_over_said_once(holder, caplog):
    out, process = holder
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    record = json.loads((out / ".optimum-ipu-run.lock").read_text())  # left behind by the killed run
    assert record["pid"] == process.pid
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        _trainer(out).train()
    taken = [r.getMessage() for r in caplog.records if "ended without releasing" in r.getMessage()]
    assert len(taken) == 1 and f"pid {process.pid}" in taken[0], taken
    assert _checkpoints(out) == ["checkpoint-1", "checkpoint-2"]
    assert not (out / ".optimum-ipu-run.lock").exists()  # released at the end of the run


def test_only_the_process_that_saves_holds_the_lock(holder, monkeypatch):
    """Under torchrun every process trains, and only world process zero writes checkpoints (should_save)."""
    out, _ = holder
    trainer = _trainer(out)
    monkeypatch.setattr(type(trainer.args), "should_save", property(lambda self: False))
    trainer.train()  # not refused: this process writes nothing into the folder
    assert _checkpoints(out) == []


FORKING_HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from optimum_ipu.checkpoints.run_lock import output_dir_lock

    lock = output_dir_lock(sys.argv[1])
    lock.__enter__()  # and never left
    child = os.fork()
    if child == 0:  # a data loader worker: it shares the run's open lock file
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1), os.dup2(null, 2)  # not the test's pipes: the test reads them to their end
        time.sleep(120)
        os._exit(0)
    print(child, flush=True)
    os._exit(0)  # the run ends without releasing; its worker lives on
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_lock_still_held_by_a_dead_runs_forked_worker_says_so(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-c", FORKING_HOLDER, str(out)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), timeout=120)  # fmt: skip
    worker = int(run.stdout)
    try:
        from optimum_ipu.checkpoints.run_lock import output_dir_lock

        with pytest.raises(RuntimeError, match=r"has ended, but processes it started .* still hold the lock"):
            with output_dir_lock(out):
                pass
    finally:
        os.kill(worker, signal.SIGKILL)
