"""A pipelined PopTorch training program (2 blocks on IPUs 0 and 1), run by torchrun as stage processes.

`python -m torch.distributed.run --nproc_per_node P _poptorch_stage_worker.py OUT REPLICAS [half]`:
with replicationFactor(REPLICAS) not a multiple of P, the P processes are P / 2 pipelines of two
stage processes. Every process writes what it saw and returned (`rank{k}.pt`: the combined batches,
the returned losses of every call, the flattened weights after training), so a test compares them
with a plain PyTorch loop over the same micro-batches. `half`: the model in fp16 (`model.half()`,
emulated fp16 compute) with `poptorch.optim.SGD(loss_scaling=64)`; run without torchrun it is the
one-process reference of the same program.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

import poptorch

DEVICE_ITERATIONS, ACCUMULATION, MICRO_BATCH = 2, 4, 2


def network() -> torch.nn.Sequential:
    """Two blocks: Linear-Tanh on IPU 0, Linear-Tanh-Linear on IPU 1 (the boundary's input crosses)."""
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    )


class ModelWithLoss(torch.nn.Module):
    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x, labels):
        out = self.net(x)
        return out, torch.nn.functional.cross_entropy(out, labels)


def data() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(
        torch.randn(96, 6, generator=generator), torch.randint(0, 3, (96,), generator=generator)
    )


def main(out: Path, replicas: int, half: bool = False) -> None:
    torch.manual_seed(0)
    net = network().half() if half else network()
    poptorch.BeginBlock(net[0], "first", ipu_id=0)
    poptorch.BeginBlock(net[2], "second", ipu_id=1)
    opts = poptorch.Options().deviceIterations(DEVICE_ITERATIONS).replicationFactor(replicas)
    opts.Training.gradientAccumulation(ACCUMULATION)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    opts.outputMode(poptorch.OutputMode.All)
    loader = poptorch.DataLoader(opts, data(), batch_size=MICRO_BATCH, shuffle=True)
    if half:
        optimizer = poptorch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, loss_scaling=64.0)
    else:
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model = poptorch.trainingModel(ModelWithLoss(net), opts, optimizer=optimizer)
    xs, labels, losses, seconds = [], [], [], []
    for x, y in loader:
        start = time.perf_counter()
        _, loss = model(x, y)
        seconds.append(time.perf_counter() - start)
        xs.append(x)
        labels.append(y)
        losses.append(loss)
    model.detachFromDevice()  # as stage processes: every process now holds every stage's optimizer state
    weights = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    momentum = torch.cat([optimizer.state[p]["momentum_buffer"].reshape(-1) for p in net.parameters()])
    # Inference with 1 replica (so not split over the processes): the whole trained model in every process.
    predictions = poptorch.inferenceModel(net, poptorch.Options().deviceIterations(2))(xs[0])
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"x": torch.stack(xs), "labels": torch.stack(labels), "losses": torch.stack(losses),
                "weights": weights, "momentum": momentum, "predictions": predictions, "seconds": seconds},
               out / f"rank{os.environ.get('RANK', '0')}.pt")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), half=sys.argv[3:] == ["half"])
