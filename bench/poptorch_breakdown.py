"""Where the time of one host call of a PopTorch program goes: half, fp32 and the plain PyTorch loop.

Issue 43 asks for a name and a number for each cost of the fp16 step of a PopTorch half program, as
`bench/fp16_breakdown.py` gives them for IPUTrainer. This bench trains the programs of
`bench/poptorch_overhead.py` (`seed`: seed 004's program, one micro-batch per update, 50 device
iterations; `mlp`: micro-batch 16 x GA 2 x 4 device iterations, SGD with momentum) three ways on the
same micro-batches, and times the phases of every host call in process CPU time (one thread) with the
instruments of `bench/fp16_breakdown.py`:

| phase | what runs |
|---|---|
| forward | the program's `forward()` (in half: the dispatch layer converting fp16 operands) |
| backward | `loss.backward()` less the accumulator's hooks (in half: each weight gradient rounded to fp16) |
| accumulate | the accumulator's post-accumulate-grad hooks (an fp16 `.grad` added into its fp32 sum) |
| weights for compute | the fp16 weights' fp32 copies made once per update (several micro-batches per update) |
| gradients out | the accumulator's sums handed on as fp32 |
| unscale + check | the Mean reduction's division and the non-finite check, one fused pass |
| fp32 copies | fp32 working copies of the fp16 weights for the torch optimizer |
| update | `torch.optim.SGD.step` (plain: on the fp32 weights; half: on the working copies) |
| round back | the new values written to fp16, and kept as the next device iteration's fp32 values |
| clear | gradients dropped |
| rest | the call's CPU time less all of the above: the executor's Python, splitting the batch, the losses |

    OMP_NUM_THREADS=1 python bench/poptorch_breakdown.py [--rounds 3] [--calls 10] [--program mlp seed]

Medians per phase over the timed calls of all rounds, in ms per host call, after one warm-up call per run.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp16_breakdown import Clock, instrumented, patched  # noqa: E402
from machine import cpu_description  # noqa: E402
from poptorch_overhead import PROGRAMS, Program, host_calls, runs_of  # noqa: E402

PHASES = ("forward", "backward", "accumulate", "weights for compute", "gradients out", "unscale + check",
          "fp32 copies", "update", "round back", "clear", "rest")  # fmt: skip
RUNS = ("plain fp32", "poptorch fp32", "poptorch half")


def measure(program: Program, rounds: int, calls: int) -> None:
    batches = host_calls(program, calls)
    runs = runs_of(program)
    clocks = {name: Clock() for name in RUNS}
    for name in RUNS:
        runs[name][1](*batches[0])  # warm-up and compilation, not timed
    for _ in range(rounds):  # interleaved, so drift on a shared machine hits every run alike
        for name in RUNS:
            model, call = runs[name]
            clock = clocks[name]
            with contextlib.ExitStack() as stack:
                stack.enter_context(instrumented(clock, type(model)))
                stack.enter_context(patched(torch.optim.SGD, "step", clock.timed("update", torch.optim.SGD.step)))
                for x, y in batches:
                    clock.begin_step()
                    call(x, y)
                    clock.end_step()

    print(f"\n{program.name}: micro-batch {program.micro_batch} x GA {program.accumulation} x DI "
          f"{program.device_iterations} = {program.combined} samples per host call; {rounds} rounds x {calls} calls; "
          "ms of process CPU time per host call, medians")  # fmt: skip
    # Any other instrument of `bench/fp16_breakdown.py` that saw work (clipping, say) gets its row too, so the
    # rows add up to the total but for the medians' rounding.
    seen = {p for name in RUNS for step in clocks[name].steps for p, v in step.items() if v}
    extra = sorted(seen - {*PHASES, "total", "page faults", "kernel time"})
    medians = {name: {p: statistics.median(s.get(p, 0.0) for s in clocks[name].steps) * 1e3
                      for p in (*PHASES, *extra, "total", "page faults")} for name in RUNS}  # fmt: skip
    print(f"{'phase':<20}" + "".join(f"{name:>15}" for name in RUNS) + f"{'half - fp32':>13}")
    for phase in (*PHASES[:-1], *extra, PHASES[-1], "total"):
        row = [medians[name][phase] for name in RUNS]
        print(f"{phase:<20}" + "".join(f"{v:>15.2f}" for v in row) + f"{row[2] - row[1]:>+13.2f}")
    print(f"{'page faults':<20}" + "".join(f"{medians[name]['page faults']:>15,.0f}" for name in RUNS))
    plain, fp32, half = (medians[name]["total"] for name in RUNS)
    print(f"plain fp32 / run (CPU time): poptorch fp32 {plain / fp32:.2f}, poptorch half {plain / half:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10, help="timed host calls per run and round")
    parser.add_argument("--program", nargs="+", choices=sorted(PROGRAMS), default=["mlp", "seed"])
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(cpu_description(), f"{torch.get_num_threads()} torch thread(s), torch {torch.__version__}")
    if os.path.exists("/proc/loadavg"):
        print("load average at start:", open("/proc/loadavg").read().split()[:3])
    for name in args.program:
        measure(PROGRAMS[name], args.rounds, args.calls)


if __name__ == "__main__":
    main()
