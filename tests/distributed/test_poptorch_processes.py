"""A PopTorch program under torchrun (2 processes, gloo): one replica per process, the one-process weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

WORKER = Path(__file__).with_name("_poptorch_worker.py")
pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch.distributed with gloo")


def launch(out: Path, processes: int) -> None:
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    result = subprocess.run([*launcher, str(WORKER), str(out)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert result.returncode == 0, f"{processes} process(es) failed:\n{result.stderr[-4000:]}"


def test_replication_factor_2_over_2_processes_equals_one_process(tmp_path):
    """The same program (replicationFactor(2), DI 2, GA 2, SGD with momentum, shuffled) in one process and
    in two: each process's DataLoader hands it its replica's part of every combined batch, the gradient
    sums are all-reduced, and both processes end with the one-process weights."""
    launch(tmp_path / "one", 1)
    launch(tmp_path / "two", 2)
    one = torch.load(tmp_path / "one" / "rank0_final.pt")
    rank0, rank1 = (torch.load(tmp_path / "two" / f"rank{k}_final.pt") for k in (0, 1))
    torch.testing.assert_close(rank0, one, rtol=0, atol=1e-6)
    torch.testing.assert_close(rank1, rank0, rtol=0, atol=0)

    combined = torch.load(tmp_path / "one" / "rank0_batches.pt")  # [call][DI x GA x R x micro-batch of 4]
    calls = combined.shape[0]
    by_replica = combined.reshape(calls, 2, 2, 2, 4, 6)  # [call][DI][GA][replica][sample]
    for k in (0, 1):
        handed = torch.load(tmp_path / "two" / f"rank{k}_batches.pt")
        assert handed.shape == (calls, 16, 6)
        torch.testing.assert_close(handed, by_replica[:, :, :, k].reshape(calls, 16, 6), rtol=0, atol=0)


def test_inference_under_processes_returns_the_process_rows(tmp_path):
    """popdist's tutorial validates after training: under two processes each process's DataLoader hands
    it its replicas' samples, and its `inferenceModel` returns the outputs of those rows only (as a pod's
    instance does), equal to the plain module's outputs for them; the processes' rows together are the
    one-process run's."""
    launch(tmp_path / "one", 1)
    launch(tmp_path / "two", 2)
    one = torch.load(tmp_path / "one" / "rank0_validation.pt")
    ranks = [torch.load(tmp_path / "two" / f"rank{k}_validation.pt") for k in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == len(one)
    for call, (x, _, out, loss) in enumerate(one):
        for k in (0, 1):
            x_k, _, out_k, loss_k = ranks[k][call]
            assert out_k.shape[0] == x_k.shape[0] == x.shape[0] // 2  # its own rows, not the run's
            # [DI][R][micro-batch] in the one-process call: process k's rows are replica k's
            mine = x.reshape(2, 2, 4, 6)[:, k].reshape(-1, 6)
            torch.testing.assert_close(x_k, mine, rtol=0, atol=0)
            torch.testing.assert_close(out_k, out.reshape(2, 2, 4, 3)[:, k].reshape(-1, 3), rtol=0, atol=1e-6)
            torch.testing.assert_close(loss_k, loss.reshape(2, 2)[:, k].reshape(-1), rtol=0, atol=1e-6)


def test_128_replicas_over_2_processes_attach_64_ipus_each_and_train_as_one_run(tmp_path):
    """PopTorch's 64-IPU limit is per process (a poprun instance attaches to its own replicas' IPUs): 128
    replicas of 1 IPU over 2 processes are 64 each, accepted, and the run trains as one: both processes
    end with the same weights, and each validation call returns its 64 replicas' rows."""
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(WORKER.with_name("_poptorch_replicas_worker.py")), str(tmp_path), "128"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{k}_final.pt") for k in (0, 1))
    torch.testing.assert_close(rank1, rank0, rtol=0, atol=0)
    assert torch.load(tmp_path / "rank0_rows.pt").shape == (64 * 2, 1)
