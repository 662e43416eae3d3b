"""A PopTorch program whose replicationFactor(R) needs more IPUs than one process can attach to (R > 64 of
1 IPU), run by torchrun over enough processes: `python _poptorch_replicas_worker.py OUT R`. Each process
trains one call (its R / P replicas) and validates once, and writes its flattened weights (`rank{k}_final.pt`)
and the rows its inference call returned (`rank{k}_rows.pt`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import poptorch


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        out = self.linear(x)
        return out, torch.nn.functional.mse_loss(out, y)


def main(out: Path, replicas: int) -> None:
    torch.manual_seed(0)
    dataset = torch.utils.data.TensorDataset(torch.randn(2 * replicas, 4), torch.randn(2 * replicas, 1))
    model = Regression()
    opts = poptorch.Options().replicationFactor(replicas)
    training = poptorch.trainingModel(model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for x, y in poptorch.DataLoader(opts, dataset, batch_size=2):
        training(x, y)
    training.detachFromDevice()
    validation = poptorch.inferenceModel(model.eval(), poptorch.Options().replicationFactor(replicas))
    rows = [validation(x, y)[0] for x, y in poptorch.DataLoader(opts, dataset, batch_size=2)]
    rank = os.environ.get("RANK", "0")
    out.mkdir(parents=True, exist_ok=True)
    torch.save(torch.cat(rows), out / f"rank{rank}_rows.pt")
    torch.save(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), out / f"rank{rank}_final.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
