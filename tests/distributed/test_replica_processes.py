"""Replicas and pipeline stages as torchrun processes (gloo), on one node or two, equal the single-process simulation."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from optimum_ipu.runtime.distributed import process_layout

WORKER = Path(__file__).with_name("_train_worker.py")
pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch.distributed with gloo")


def run(tmp_path: Path, name: str, processes: int, **spec) -> Path:
    """Train with `processes` torchrun processes (1: a plain python run) and return the output folder."""
    out = tmp_path / name
    spec = {"out": str(out), "steps": 3, **spec}
    spec_file = tmp_path / f"{name}.json"
    spec_file.write_text(json.dumps(spec))
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    shutil.rmtree(out, ignore_errors=True)
    result = subprocess.run([*launcher, str(WORKER), str(spec_file)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    if result.returncode != 0:  # no retry: 300 launches in a row ran without gloo's teardown abort
        raise AssertionError(f"{name} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return out


def weights(out: Path, step: int | str, rank: int = 0) -> torch.Tensor:
    """A process's flattened weights after update `step`, or after training with step="final"."""
    return torch.load(out / (f"rank{rank}_final.pt" if step == "final" else f"rank{rank}_step{step}.pt"))


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


REPLICAS_2_GA_4 = {"layers_per_ipu": [-1], "ipus_per_replica": 1, "replication_factor": 2,
                   "gradient_accumulation_steps": 4}  # fmt: skip


# AdamW divides by the root of its second moment, so an element whose true gradient is zero moves by
# up to the learning rate per step on a last-bit difference in the order of the fp32 sums (plain
# transformers' GA splits show the same): the QA head's bias is one (start and end softmaxes do not
# change when every position's logit moves together). It is held to steps x lr; the rest, some of
# whose gradients are tiny but not zero, to steps x lr / 10.
@pytest.mark.parametrize(
    "optim, device_iterations, lr, tolerance",
    [("sgd", 1, 1e-2, 1e-6), ("adamw_torch", 2, 1e-3, 1e-4)],
)
def test_two_replica_processes_equal_one_process(tmp_path, optim, device_iterations, lr, tolerance):
    ipu_config = {**REPLICAS_2_GA_4, "device_iterations": device_iterations}
    one = run(tmp_path, "one", 1, ipu_config=ipu_config, optim=optim, lr=lr)
    two = run(tmp_path, "two", 2, ipu_config=ipu_config, optim=optim, lr=lr)
    assert summary(two)["world_size"] == 2 and summary(one)["world_size"] == 1
    assert (
        summary(two)["total_train_batch_size"]
        == summary(one)["total_train_batch_size"]
        == 16 * device_iterations
    )
    for step in (1, 2, 3):
        torch.testing.assert_close(weights(two, step, rank=1), weights(two, step, rank=0), rtol=0, atol=0)
        bound = tolerance if optim == "sgd" else step * tolerance
        torch.testing.assert_close(weights(two, step)[:-2], weights(one, step)[:-2], rtol=0, atol=bound)
        torch.testing.assert_close(weights(two, step)[-2:], weights(one, step)[-2:], rtol=0, atol=step * lr)
    assert summary(two)["losses"] == pytest.approx(summary(one)["losses"], abs=1e-5)


def test_replicas_differ_from_a_longer_accumulation_with_dropout_and_processes_keep_them(tmp_path):
    """Each replica has its own dropout stream, in one process or in two."""
    ipu_config = dict(REPLICAS_2_GA_4)
    one = run(tmp_path, "one", 1, ipu_config=ipu_config, dropout=0.1, steps=2)
    two = run(tmp_path, "two", 2, ipu_config=ipu_config, dropout=0.1, steps=2)
    torch.testing.assert_close(weights(two, 2), weights(one, 2), rtol=0, atol=1e-6)
    torch.testing.assert_close(weights(two, 2, rank=1), weights(two, 2), rtol=0, atol=0)


def test_an_overflow_on_one_replica_process_skips_the_update_on_both(tmp_path):
    out = run(tmp_path, "two", 2, ipu_config=REPLICAS_2_GA_4, fp32=False, optim="adamw_torch", loss_scaling=64.0,
              lr=1e-3, steps=3, overflow_rank=1, overflow_step=1)  # fmt: skip
    assert summary(out)["skipped_updates"] == 1
    for rank in (0, 1):
        torch.testing.assert_close(weights(out, 2, rank), weights(out, 1, rank), rtol=0, atol=0)  # skipped
        assert not torch.equal(weights(out, 3, rank), weights(out, 2, rank))  # and training goes on
    torch.testing.assert_close(weights(out, 3, rank=1), weights(out, 3, rank=0), rtol=0, atol=0)


def test_a_two_process_checkpoint_resumes_in_one_and_in_two_processes(tmp_path):
    """With dropout on, so the resumed run must also get each replica's random stream from rank 0's save."""
    full = run(tmp_path, "full", 2, ipu_config=REPLICAS_2_GA_4, steps=4, save_steps=2, dropout=0.1)
    checkpoint = str(full / "run" / "checkpoint-2")
    for processes in (1, 2):
        resumed = run(tmp_path, f"resumed{processes}", processes, ipu_config=REPLICAS_2_GA_4, steps=4,
                      resume_from=checkpoint, dropout=0.1)  # fmt: skip
        torch.testing.assert_close(weights(resumed, 4), weights(full, 4), rtol=0, atol=1e-6)


def test_a_world_size_that_does_not_divide_the_replicas_is_an_error_before_any_work(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"out": str(tmp_path / "out"), "steps": 1, "ipu_config": REPLICAS_2_GA_4}))
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=3", str(WORKER), str(spec)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert "replication_factor=2 is not a multiple of the world size 3" in result.stderr
    assert not list((tmp_path / "out").glob("rank*_step*.pt"))


def test_128_replicas_over_2_processes_attach_64_ipus_each_and_train(tmp_path):
    """The 64-IPU limit is per process: 128 replicas of 1 IPU over 2 processes are 64 IPUs each, as on a pod's
    two poprun instances; the compile accepts them, and both processes apply the same update."""
    out = run(tmp_path, "two", 2, steps=1, samples=256, ipu_config={
        "layers_per_ipu": [-1], "ipus_per_replica": 1, "replication_factor": 128, "gradient_accumulation_steps": 1,
    })  # fmt: skip
    torch.testing.assert_close(weights(out, "final", rank=1), weights(out, "final"), rtol=0, atol=0)


@pytest.mark.parametrize(
    "keep_trainer", [False, True], ids=["trainer-garbage-at-exit", "trainer-kept-to-the-end"]
)
def test_no_gloo_thread_is_left_when_the_interpreter_finalizes(tmp_path, keep_trainer):
    """The teardown abort's cause: gloo's threads outlived destroy_process_group into the finalization.

    The exit handler must end them (destroying the groups) while the interpreter is whole, whether
    the trainer is garbage by then (a script's main(), here with an unknown object holding a group
    from a reference cycle) or still referenced (a module-level trainer).
    """
    out = run(tmp_path, "threads", 2, ipu_config=REPLICAS_2_GA_4, steps=1, report_threads=True,
              keep_trainer=keep_trainer, group_in_a_cycle=not keep_trainer)  # fmt: skip
    for rank in (0, 1):
        assert json.loads((out / f"rank{rank}_threads.json").read_text()) == [], f"rank {rank}"


def test_process_layout():
    assert process_layout(1, 4, 2) == process_layout(1, 1, 1)
    assert (process_layout(2, 2, 1).stages, process_layout(2, 2, 1).data_parallel) == (1, 2)
    assert (process_layout(4, 2, 2).stages, process_layout(4, 2, 2).data_parallel) == (2, 2)
    assert (process_layout(2, 1, 2).stages, process_layout(2, 1, 2).data_parallel) == (2, 1)
    with pytest.raises(ValueError, match="4 processes = 2 pipeline stages x 2 data-parallel groups"):
        process_layout(4, 1, 2)


PIPELINE_2_GA_4 = {"layers_per_ipu": [2, 2], "ipus_per_replica": 2, "gradient_accumulation_steps": 4}


def test_two_pipeline_stage_processes_equal_one_process(tmp_path):
    one = run(tmp_path, "one", 1, ipu_config=PIPELINE_2_GA_4)
    two = run(tmp_path, "two", 2, ipu_config=PIPELINE_2_GA_4)
    # Between saves each process updates only its stage; after training every rank has the whole model.
    torch.testing.assert_close(weights(two, "final"), weights(one, 3), rtol=0, atol=1e-6)
    torch.testing.assert_close(weights(two, "final", rank=1), weights(two, "final"), rtol=0, atol=0)
    assert summary(two)["losses"] == pytest.approx(summary(one)["losses"], abs=1e-6)  # every step's


def test_stage_processes_evaluate_with_every_stage_current(tmp_path):
    """An evaluation during training sees every stage's latest weights, as the one-process run does."""
    one = run(tmp_path, "one", 1, ipu_config=PIPELINE_2_GA_4, eval_steps=2)
    two = run(tmp_path, "two", 2, ipu_config=PIPELINE_2_GA_4, eval_steps=2)
    assert len(summary(two)["eval_losses"]) == len(summary(one)["eval_losses"]) >= 1
    assert summary(two)["eval_losses"] == pytest.approx(summary(one)["eval_losses"], abs=1e-5)


def test_a_pipeline_checkpoint_holds_every_stage_and_resumes_in_one_process(tmp_path):
    """Rank 0 saves the weights and AdamW moments of both stages, gathered before the save."""
    common = dict(ipu_config=PIPELINE_2_GA_4, optim="adamw_torch", lr=1e-3, steps=4)
    full = run(tmp_path, "full", 2, save_steps=2, **common)
    reference = run(tmp_path, "reference", 1, **common)
    resumed = run(tmp_path, "resumed", 1, resume_from=str(full / "run" / "checkpoint-2"), **common)
    for out in (full, resumed):  # AdamW: see the bound of the replica test above
        torch.testing.assert_close(weights(out, "final")[:-2], weights(reference, 4)[:-2], rtol=0, atol=4e-4)


def test_two_replicas_of_two_stage_processes_equal_one_process(tmp_path):
    """4 processes on a 2-D mesh: 2 data-parallel groups x 2 pipeline stages (replica r on ranks 2r, 2r+1)."""
    ipu_config = {**PIPELINE_2_GA_4, "replication_factor": 2}
    one = run(tmp_path, "one", 1, ipu_config=ipu_config)
    four = run(tmp_path, "four", 4, ipu_config=ipu_config)
    assert summary(four)["world_size"] == 4
    assert summary(four)["total_train_batch_size"] == summary(one)["total_train_batch_size"] == 16
    torch.testing.assert_close(weights(four, "final"), weights(one, 3), rtol=0, atol=1e-6)
    for rank in (1, 2, 3):
        torch.testing.assert_close(weights(four, "final", rank=rank), weights(four, "final"), rtol=0, atol=0)
    assert summary(four)["losses"] == pytest.approx(summary(one)["losses"], abs=1e-6)


@pytest.mark.parametrize(
    "ipu_config, samples, extra",
    [(REPLICAS_2_GA_4, 32, {"dropout": 0.1}), (PIPELINE_2_GA_4, 16, {"optim": "adamw_torch", "lr": 1e-3})],
    ids=["replicas", "stages"],
)
def test_a_checkpoint_saved_at_an_epoch_end_holds_every_process_state(tmp_path, ipu_config, samples, extra):
    """save_strategy="epoch" decides after the step's callbacks: the processes must still gather first."""
    common = dict(ipu_config=ipu_config, samples=samples, steps=4, **extra)  # 2 steps per epoch
    full = run(tmp_path, "full", 2, save_strategy="epoch", **common)
    resumed = run(tmp_path, "resumed", 1, resume_from=str(full / "run" / "checkpoint-2"), **common)
    atol = 1e-6 if "dropout" in extra else 4e-4  # AdamW: see the bound of the replica test above
    torch.testing.assert_close(weights(resumed, "final")[:-2], weights(full, "final")[:-2], rtol=0, atol=atol)


# -- several machines: two torchrun agents on this host stand for two nodes (`--nnodes 2`, c10d rendezvous
# on localhost); each starts its own processes, as on two machines, and the rendezvous ranks them.


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nodes(tmp_path: Path, name: str, nodes: int, per_node: int, **spec) -> Path:
    """Train with `nodes` torchrun agents of `per_node` processes each, meeting at a c10d rendezvous."""
    out = tmp_path / name
    spec_file = tmp_path / f"{name}.json"
    spec_file.write_text(json.dumps({"out": str(out), "steps": 3, **spec}))
    endpoint = f"127.0.0.1:{_free_port()}"
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={nodes}",
                f"--nproc_per_node={per_node}",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint}",
                f"--rdzv_id={name}",
                str(WORKER),
                str(spec_file),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        for _ in range(nodes)
    ]
    logs = [agent.communicate(timeout=300)[0] for agent in agents]
    for node, (agent, log) in enumerate(zip(agents, logs)):
        if agent.returncode != 0:
            raise AssertionError(f"node {node} of {name} failed (exit {agent.returncode}):\n{log[-4000:]}")
    return out


def test_replicas_on_two_nodes_equal_one_process(tmp_path):
    one = run(tmp_path, "one", 1, ipu_config=REPLICAS_2_GA_4, optim="sgd", lr=1e-2)
    nodes = run_nodes(tmp_path, "nodes", 2, 1, ipu_config=REPLICAS_2_GA_4, optim="sgd", lr=1e-2)
    assert summary(nodes)["world_size"] == 2
    for step in (1, 2, 3):
        torch.testing.assert_close(weights(nodes, step, rank=1), weights(nodes, step), rtol=0, atol=0)
        torch.testing.assert_close(weights(nodes, step)[:-2], weights(one, step)[:-2], rtol=0, atol=1e-6)
    assert summary(nodes)["losses"] == pytest.approx(summary(one)["losses"], abs=1e-5)


def test_two_replicas_of_two_stages_on_two_nodes_equal_one_process(tmp_path):
    """4 processes, 2 per node: each node holds one replica's two pipeline stages (ranks 2r and 2r+1)."""
    ipu_config = {**PIPELINE_2_GA_4, "replication_factor": 2}
    one = run(tmp_path, "one", 1, ipu_config=ipu_config)
    nodes = run_nodes(tmp_path, "nodes", 2, 2, ipu_config=ipu_config)
    assert summary(nodes)["world_size"] == 4
    torch.testing.assert_close(weights(nodes, "final"), weights(one, 3), rtol=0, atol=1e-6)
    for rank in (1, 2, 3):
        torch.testing.assert_close(
            weights(nodes, "final", rank=rank), weights(nodes, "final"), rtol=0, atol=0
        )
    assert summary(nodes)["losses"] == pytest.approx(summary(one)["losses"], abs=1e-6)
