"""Overhead of `poptorch.trainingModel` over a plain PyTorch loop doing the same micro-batch steps.

An MNIST-sized MLP (784 -> 512 -> 256 -> 10, cross-entropy) is trained with SGD (momentum 0.9) at
micro-batch 16, gradient accumulation 2 and 4 device iterations: one host call of `trainingModel`
is 8 micro-batches and 4 weight updates. The plain loop does exactly those steps: per device
iteration, forward and backward of 2 micro-batches (loss / 2, the Mean reduction), then
`optimizer.step()`. These runs are interleaved over several rounds, each timing `--calls` host calls
after a warm-up call (compilation excluded, as in PopTorch's own throughput figures):

- `plain fp32`: the plain loop, fp32 weights;
- `poptorch fp32`: `trainingModel` on an fp32 copy of the same model;
- `poptorch half`: `trainingModel` on `model.half()` (fp16 weights, fp32 update, emulated fp16
  compute on a CPU).

Printed: the CPU, each run's median time per host call, and `plain fp32 time / poptorch time` (1.0 =
no overhead; targets >= 0.9 in fp32 and >= 0.8 in half, issue 23), all measured in this one run, in
this process's CPU time (`time.process_time`: with one torch thread it is the work done, which other
jobs on a shared machine do not inflate) and in wall-clock time.

    OMP_NUM_THREADS=1 python bench/poptorch_overhead.py [--rounds 5] [--calls 10]
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import time

import torch
from overhead import cpu_description
from torch import nn

import poptorch

MICRO_BATCH, ACCUMULATION, DEVICE_ITERATIONS = 16, 2, 4
COMBINED = MICRO_BATCH * ACCUMULATION * DEVICE_ITERATIONS


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10)
        )

    def forward(self, images, labels):
        logits = self.net(images)
        return logits, nn.functional.cross_entropy(logits, labels)


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def plain_call(model, optimizer, images, labels) -> None:
    """One host call's worth of steps in plain PyTorch, micro-batch by micro-batch."""
    xs = images.view(DEVICE_ITERATIONS, ACCUMULATION, MICRO_BATCH, *images.shape[1:])
    ys = labels.view(DEVICE_ITERATIONS, ACCUMULATION, MICRO_BATCH)
    for d in range(DEVICE_ITERATIONS):
        optimizer.zero_grad()
        for g in range(ACCUMULATION):
            _, loss = model(xs[d, g], ys[d, g])
            (loss / ACCUMULATION).backward()
        optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=10, help="timed host calls per run and round")
    args = parser.parse_args()
    logging.getLogger("poptorch").setLevel(logging.ERROR)
    print(cpu_description(), f"{torch.get_num_threads()} torch threads, torch {torch.__version__}")
    print(f"MLP 784-512-256-10, SGD momentum; micro-batch {MICRO_BATCH} x GA {ACCUMULATION} x DI "
          f"{DEVICE_ITERATIONS} = {COMBINED} samples per host call; {args.rounds} rounds x {args.calls} calls")  # fmt: skip

    torch.manual_seed(0)
    base = MLP()
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.rand(COMBINED, 1, 28, 28, generator=g), torch.randint(0, 10, (COMBINED,), generator=g))
        for _ in range(args.calls)
    ]

    plain = copy.deepcopy(base)
    plain_optimizer = _sgd(plain)
    opts = poptorch.Options().deviceIterations(DEVICE_ITERATIONS)
    opts.Training.gradientAccumulation(ACCUMULATION)
    fp32_model = copy.deepcopy(base)
    fp32 = poptorch.trainingModel(fp32_model, opts, optimizer=_sgd(fp32_model))
    half_model = copy.deepcopy(base).half()
    half = poptorch.trainingModel(half_model, opts, optimizer=_sgd(half_model))

    runs = {
        "plain fp32": lambda x, y: plain_call(plain, plain_optimizer, x, y),
        "poptorch fp32": lambda x, y: fp32(x, y),
        "poptorch half": lambda x, y: half(x.half(), y),
    }
    for run in runs.values():  # warm-up (and compilation)
        run(*batches[0])
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    wall: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            for x, y in batches:
                run(x, y)
            cpu[name].append((time.process_time() - start_cpu) / len(batches))
            wall[name].append((time.perf_counter() - start) / len(batches))

    print(f"{'':<15} {'CPU time of this process':^36} {'wall clock':^26}")
    print(f"{'run':<15} {'ms per host call':>17} {'plain fp32 / run':>18} {'ms per host call':>17} {'ratio':>8}")
    cpu_reference, wall_reference = statistics.median(cpu["plain fp32"]), statistics.median(wall["plain fp32"])
    for name in runs:
        c, w = statistics.median(cpu[name]), statistics.median(wall[name])
        print(f"{name:<15} {c * 1e3:17.2f} {cpu_reference / c:18.2f} {w * 1e3:17.2f} {wall_reference / w:8.2f}")


if __name__ == "__main__":
    main()
