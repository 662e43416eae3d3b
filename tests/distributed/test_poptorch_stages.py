"""A pipelined PopTorch program under torchrun as stage processes equals the plain PyTorch loop.

`_poptorch_stage_worker.py` (2 blocks on IPUs 0 and 1, PipelinedExecution, DI 2, GA 4, SGD with
momentum, shuffled) runs in 2 processes (1 replica: one pipeline of 2 stage processes) and in 4
(2 replicas: 2 pipelines of 2). The reference is plain PyTorch, not our one-process run: for every
device iteration, the mean of the R x GA micro-batch losses is backpropagated and SGD steps once.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "_poptorch_stage_worker.py"
pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch.distributed with gloo")

_spec = importlib.util.spec_from_file_location("_poptorch_stage_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def launch(out: Path, processes: int, replicas: int, *extra: str) -> list[dict]:
    """Run the worker under torchrun with `processes` processes (1: without torchrun, in one process)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
    ]
    command = [
        *(torchrun if processes > 1 else [sys.executable]),
        str(WORKER),
        str(out),
        str(replicas),
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, f"{processes} processes failed:\n{result.stderr[-4000:]}"
    return [torch.load(out / f"rank{k}.pt") for k in range(processes)]


def plain_loop(xs: torch.Tensor, labels: torch.Tensor, replicas: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same training in plain PyTorch: (every micro-batch's loss in PopTorch's [DI][GA][R] order, weights)."""
    torch.manual_seed(0)
    net = worker.network()
    model = worker.ModelWithLoss(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    di, ga, mb = worker.DEVICE_ITERATIONS, worker.ACCUMULATION, worker.MICRO_BATCH
    losses = []
    for x, y in zip(xs, labels):  # one combined batch: [DI][GA][R][micro-batch]
        x, y = x.reshape(di, ga * replicas, mb, -1), y.reshape(di, ga * replicas, mb)
        for d in range(di):
            optimizer.zero_grad()
            micro = [model(x[d, i], y[d, i])[1] for i in range(ga * replicas)]
            (torch.stack(micro).sum() / (ga * replicas)).backward()
            optimizer.step()
            losses.extend(loss.detach() for loss in micro)
    weights = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    momentum = torch.cat([optimizer.state[p]["momentum_buffer"].reshape(-1) for p in net.parameters()])
    with torch.no_grad():
        predictions = net(xs[0])
    return torch.stack(losses).reshape(len(xs), -1), weights, momentum, predictions


def check_equals_plain_loop(ranks: list[dict], replicas: int) -> None:
    losses, weights, momentum, predictions = plain_loop(ranks[0]["x"], ranks[0]["labels"], replicas)
    for rank in ranks:  # every process: the same batches, losses, whole model and inference outputs
        torch.testing.assert_close(rank["x"], ranks[0]["x"], rtol=0, atol=0)
        torch.testing.assert_close(rank["losses"], losses, rtol=0, atol=1e-6)
        torch.testing.assert_close(rank["weights"], weights, rtol=0, atol=1e-6)
        torch.testing.assert_close(rank["momentum"], momentum, rtol=0, atol=1e-6)  # whole after detaching
        torch.testing.assert_close(rank["predictions"], predictions, rtol=0, atol=1e-6)


def test_two_stage_processes_train_as_the_plain_loop(tmp_path):
    """1 replica, 2 processes: one pipeline, stage 0 on rank 0 and stage 1 on rank 1."""
    ranks = launch(tmp_path, 2, replicas=1)
    check_equals_plain_loop(ranks, replicas=1)


def test_two_pipelines_of_two_stage_processes_train_as_the_plain_loop(tmp_path):
    """2 replicas, 4 processes: ranks 0-1 run replica 0's pipeline, ranks 2-3 replica 1's; gradients are
    summed over the pipelines before each update."""
    ranks = launch(tmp_path, 4, replicas=2)
    check_equals_plain_loop(ranks, replicas=2)


def test_an_fp16_model_with_loss_scaling_trains_as_stage_processes_as_in_one_process(tmp_path):
    """model.half() (emulated fp16 compute, fp32 gradient sums, fp16 write-back) with loss scaling 64: the
    two stage processes return the losses, weights and predictions of the same program in one process."""
    one = launch(tmp_path / "one", 1, 1, "half")[0]
    ranks = launch(tmp_path / "stages", 2, 1, "half")
    assert one["weights"].dtype == torch.float16
    for rank in ranks:
        torch.testing.assert_close(rank["x"], one["x"], rtol=0, atol=0)
        for key in ("losses", "weights", "momentum", "predictions"):
            torch.testing.assert_close(rank[key], one[key], rtol=0, atol=0)
