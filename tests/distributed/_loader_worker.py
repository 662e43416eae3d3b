"""A PopTorch data program as PopTorch's multi-host launch runs it: `python _loader_worker.py OUT K P`.

No torchrun: the process is named by `opts.Distributed.configureProcessId(K, P)` alone. It shuffles with
`opts.randomSeed(5)`, then draws from torch's global generator a number of times that differs per process
(so only the options' seed can make the processes shuffle alike), reads two epochs through an
`inferenceModel` (the items pass its batch check) and saves the samples it was handed (`process{K}.pt`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import poptorch

out, process, processes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
opts = poptorch.Options().deviceIterations(2).randomSeed(5)
opts.Distributed.configureProcessId(process, processes)
torch.randn(process + 1)  # the processes' global generators part here
loader = poptorch.DataLoader(opts, torch.utils.data.TensorDataset(torch.arange(60.0)), batch_size=3, shuffle=True)
model = poptorch.inferenceModel(torch.nn.Identity(), opts)
epochs = [torch.cat([model(x) for (x,) in loader]) for _ in range(2)]
out.mkdir(parents=True, exist_ok=True)
torch.save(epochs, out / f"process{process}.pt")
