"""poptorch.DataLoader in processes named by configureProcessId alone (PopTorch's multi-host launch, no torchrun)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("_loader_worker.py")
TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def test_two_processes_without_torchrun_each_get_half_of_every_shuffled_epoch(tmp_path):
    """60 samples, batch_size 3, DI 2, 2 processes of replicationFactor(1) each: 10 items of 6 per process
    and epoch; the two processes' samples of an epoch are disjoint and together the dataset, and the
    second epoch is another order. Before, shuffle=True failed on a torch.distributed env:// init."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    workers = [
        subprocess.Popen([sys.executable, str(WORKER), str(tmp_path), str(k), "2"], env={**env, "OMP_NUM_THREADS": "1"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        for k in (0, 1)
    ]
    for worker in workers:
        _, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr[-4000:]
    epochs = [torch.load(tmp_path / f"process{k}.pt") for k in (0, 1)]
    for epoch in (0, 1):
        assert [len(epochs[k][epoch]) for k in (0, 1)] == [30, 30]
        together = torch.cat([epochs[0][epoch], epochs[1][epoch]])
        assert sorted(together.tolist()) == list(range(60))
    assert epochs[0][0].tolist() != epochs[0][1].tolist()
