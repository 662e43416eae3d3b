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
