"""A PopTorch training program (replicationFactor(2), DI 2, GA 2), run alone or by torchrun.

`python _poptorch_worker.py OUT`: the same program in both cases. Every process writes its
flattened weights after training (`rank{k}_final.pt`) and the combined batches its DataLoader
handed it (`rank{k}_batches.pt`), so a test compares processes with each other and with a
one-process run. Then it validates as popdist's tutorial does (an `inferenceModel` under the same
options, fed by a DataLoader) and writes each call's inputs and outputs (`rank{k}_validation.pt`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import poptorch


class ModelWithLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))

    def forward(self, x, labels):
        out = self.net(x)
        return out, torch.nn.functional.cross_entropy(out, labels)


def main(out: Path) -> None:
    torch.manual_seed(0)
    dataset = torch.utils.data.TensorDataset(torch.randn(128, 6), torch.randint(0, 3, (128,)))
    model = ModelWithLoss()
    opts = poptorch.Options().deviceIterations(2).replicationFactor(2)
    opts.Training.gradientAccumulation(2)
    loader = poptorch.DataLoader(opts, dataset, batch_size=4, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    batches = []
    for _ in range(2):
        for x, labels in loader:
            batches.append(x)
            training(x, labels)
    rank = os.environ.get("RANK", "0")
    out.mkdir(parents=True, exist_ok=True)
    training.detachFromDevice()
    inference_opts = poptorch.Options().deviceIterations(2).replicationFactor(2)
    validation = poptorch.inferenceModel(model.eval(), inference_opts)
    loader = poptorch.DataLoader(inference_opts, dataset, batch_size=4)
    calls = [(x, labels, *validation(x, labels)) for x, labels in loader]
    torch.save(calls, out / f"rank{rank}_validation.pt")
    torch.save(torch.stack(batches), out / f"rank{rank}_batches.pt")
    torch.save(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), out / f"rank{rank}_final.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
