"""Where the time of one training step goes: IPUTrainer fp16 (emulated), IPUTrainer --fp32 and the plain Trainer.

Issue 43 asks for a name and a number for each cost of the fp16 step before any of it is taken back.
This bench runs the three trainers of `bench/overhead.py` on the same model and batch (micro-batch 2 x
GA 4) and times each phase of every step in **process CPU time** (one thread: `OMP_NUM_THREADS=1` is
set below), which another process on a shared machine disturbs far less than wall time:

| phase | what runs |
|---|---|
| forward | the model's `forward()` (with emulated fp16: the dispatch layer converting fp16 operands) |
| backward | `loss.backward()` less the accumulator's hooks |
| accumulate | the accumulator's post-accumulate-grad hooks (fp16 `.grad` summed into the buffers) |
| weights for compute | fp16 weights converted to fp32 once per update for the micro-batches (emulated fp16) |
| gradients out | the accumulator's sums handed on as fp32 |
| unscale + check | loss-scale division, the overflow check and the gradient norm, one fused pass |
| clip | scaling the gradients to `max_grad_norm` (plain: `clip_grad_norm_`, norm included) |
| fp32 copies | fp32 working copies of the fp16 weights for the torch optimizer |
| update | the optimizer's own `step()` (AdamW) |
| round back | the new values written to fp16: stochastic rounding draws and writes |
| update in chunks | an fp16 weight's fp32 copy, AdamW update and write-back, chunk by chunk in the cache (CPU) |
| rounding draws | stochastic rounding's draws and the noise added and cut, in those chunks and in round back |
| clear | gradients and buffers dropped |
| rest | the step's CPU time less all of the above: Python, the loader, the Trainer's bookkeeping |

A fourth run, `fp16-torch-sr`, is the fp16 step with `OPTIMUM_IPU_COMPILED_ROUNDING=off`: stochastic rounding
on torch's generator calls instead of the compiled kernel (the same bits), the code before that kernel.

    OMP_NUM_THREADS=1 python bench/fp16_breakdown.py [--steps 6] [--rounds 3] [--only minilm|vit|bert-base]

Medians per phase over the timed steps of all rounds (the first step of each run is a warm-up). The
CPU is printed first: a breakdown holds for its CPU only.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_description  # noqa: E402
from overhead import ACCUMULATION, EFFECTIVE_BATCH, MICRO_BATCH, RandomData, minilm_qa, vit  # noqa: E402

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments  # noqa: E402
from optimum_ipu.runtime import executor, gradients, loss_scaling, optimizers, rounding  # noqa: E402

PHASES = ("forward", "backward", "accumulate", "weights for compute", "gradients out", "unscale + check", "clip",
          "fp32 copies", "update", "round back", "update in chunks", "rounding draws", "clear", "rest")  # fmt: skip


class Clock:
    """CPU seconds per phase in the current step; nested phases are subtracted from the phase around them."""

    def __init__(self):
        self.step: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self._stack: list[list[float]] = []  # [start, time of nested phases]

    @contextlib.contextmanager
    def phase(self, name: str):
        self._stack.append([time.process_time(), 0.0])
        try:
            yield
        finally:
            start, nested = self._stack.pop()
            spent = time.process_time() - start
            self.step[name] += spent - nested
            if self._stack:
                self._stack[-1][1] += spent

    def begin_step(self) -> None:
        """Start timing a step (a training step, a host call): its phases, CPU time and page faults."""
        self.step = defaultdict(float)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self._faults, self._system = usage.ru_minflt, usage.ru_stime
        self._start = time.process_time()

    def end_step(self) -> None:
        """Record the step begun last: its phases, `rest` (its CPU time outside them) and `total`, and the page
        faults and kernel time it took (each fresh page the allocator hands out costs one fault, in the kernel's
        time, counted in the process's CPU time; how many depends on the allocator's state, not only the step)."""
        total = time.process_time() - self._start
        step = dict(self.step)
        step["rest"] = total - sum(step.values())
        step["total"] = total
        usage = resource.getrusage(resource.RUSAGE_SELF)
        step["page faults"] = (usage.ru_minflt - self._faults) / 1e3
        step["kernel time"] = usage.ru_stime - self._system  # mostly those faults
        self.steps.append(step)

    def timed(self, name: str, function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            with self.phase(name):
                return function(*args, **kwargs)

        return run


class StepClock(TrainerCallback):
    def __init__(self, clock: Clock):
        self.clock = clock

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.begin_step()

    def on_step_end(self, args, state, control, **kwargs):
        self.clock.end_step()


@contextlib.contextmanager
def patched(target, name: str, value):
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


def timed_context(clock: Clock, enter: str, leave: str, factory):
    """A context manager factory whose entering and leaving are timed as two phases."""

    @contextlib.contextmanager
    def run(*args, **kwargs):
        manager = factory(*args, **kwargs)
        with clock.phase(enter):
            manager.__enter__()
        try:
            yield
        finally:
            with clock.phase(leave):
                manager.__exit__(None, None, None)

    return run


def instrumented(clock: Clock, model_class):
    stack = contextlib.ExitStack()
    stack.enter_context(patched(model_class, "forward", clock.timed("forward", model_class.forward)))
    stack.enter_context(patched(torch.Tensor, "backward", clock.timed("backward", torch.Tensor.backward)))
    accumulator = gradients.GradientAccumulator
    stack.enter_context(patched(accumulator, "_take", clock.timed("accumulate", accumulator._take)))
    stack.enter_context(patched(accumulator, "gradients", clock.timed("gradients out", accumulator.gradients)))
    stack.enter_context(patched(accumulator, "clear", clock.timed("clear", accumulator.clear)))
    scaler = loss_scaling.LossScaler
    stack.enter_context(patched(scaler, "unscale_", clock.timed("unscale + check", scaler.unscale_)))
    stack.enter_context(patched(executor, "clip_", clock.timed("clip", executor.clip_)))
    stack.enter_context(patched(torch.nn.utils, "clip_grad_norm_", clock.timed("clip", torch.nn.utils.clip_grad_norm_)))
    stack.enter_context(patched(executor, "fp32_working_copies",
                                timed_context(clock, "fp32 copies", "round back", optimizers.fp32_working_copies)))  # fmt: skip
    stack.enter_context(patched(executor, "fp16_compute_context",
                                timed_context(clock, "weights for compute", "weights for compute",
                                              executor.fp16_compute_context)))  # fmt: skip
    stack.enter_context(patched(torch.optim.AdamW, "step", clock.timed("update", torch.optim.AdamW.step)))
    # The IPU optimizers (IPUTrainer's fp16 default): their step makes the fp32 working copies, runs
    # torch's fused AdamW on them, and writes the results back to fp16.
    stack.enter_context(patched(optimizers.AdamW, "step", clock.timed("fp32 copies", optimizers.AdamW.step)))
    stack.enter_context(patched(optimizers, "adamw", clock.timed("update", optimizers.adamw)))
    stack.enter_context(patched(optimizers, "write_back", clock.timed("round back", optimizers.write_back)))
    # An fp16 weight on the CPU: its copy, update and rounding chunk by chunk, in one phase.
    stack.enter_context(patched(optimizers, "update_in_chunks",
                                clock.timed("update in chunks", optimizers.update_in_chunks)))  # fmt: skip
    # Within them, stochastic rounding's share: the draws from the generator and the noise's add and cut.
    noise = rounding._Noise
    stack.enter_context(patched(noise, "round_", clock.timed("rounding draws", noise.round_)))
    return stack


def run(kind: str, make_model, data, steps: int, clock: Clock) -> None:
    if kind == "fp16-torch-sr":  # the fp16 step with stochastic rounding on torch's calls, not the compiled kernel
        before = os.environ.get("OPTIMUM_IPU_COMPILED_ROUNDING")
        os.environ["OPTIMUM_IPU_COMPILED_ROUNDING"] = "off"
        try:
            run("ipu-fp16", make_model, data, steps, clock)
        finally:
            if before is None:
                del os.environ["OPTIMUM_IPU_COMPILED_ROUNDING"]
            else:
                os.environ["OPTIMUM_IPU_COMPILED_ROUNDING"] = before
        return
    torch.manual_seed(0)
    common = dict(output_dir=tempfile.mkdtemp(), max_steps=steps + 1, save_strategy="no", report_to="none", disable_tqdm=True,
                  learning_rate=1e-4, logging_steps=1000, use_cpu=True, dataloader_num_workers=0, seed=0)  # fmt: skip
    model = make_model()
    callback = StepClock(clock)
    if kind == "plain-ga":
        args = TrainingArguments(per_device_train_batch_size=MICRO_BATCH, gradient_accumulation_steps=ACCUMULATION,
                                 **common)  # fmt: skip
        trainer = Trainer(model, args, train_dataset=data, callbacks=[callback])
    else:
        config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=ACCUMULATION)
        args = IPUTrainingArguments(per_device_train_batch_size=MICRO_BATCH, fp32=kind == "ipu-fp32",
                                    fp16_compute="emulated", **common)  # fmt: skip
        trainer = IPUTrainer(model, config, args, train_dataset=data, callbacks=[callback])
    trainer.remove_callback(PrinterCallback)
    first = len(clock.steps)
    with instrumented(clock, type(model)):
        trainer.train()
    del clock.steps[first]  # the warm-up step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--only", choices=("minilm", "vit", "bert-base"),
                        help="one model; bert-base (the real size: 109 M parameters) runs only when named")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(cpu_description())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); micro-batch {MICRO_BATCH} x GA "
          f"{ACCUMULATION} = {EFFECTIVE_BATCH}; {args.rounds} rounds x {args.steps} steps; ms of process CPU time "
          "per step, medians")  # fmt: skip
    if os.path.exists("/proc/loadavg"):
        print("load average at start:", open("/proc/loadavg").read().split()[:3])
    kinds = ("plain-ga", "ipu-fp32", "ipu-fp16", "fp16-torch-sr")
    models = {"minilm": minilm_qa(args.seq_len), "vit": vit(), "bert-base": minilm_qa(args.seq_len, base=True)}
    for key, (name, make_model, item) in models.items():
        if (args.only and key != args.only) or (not args.only and key == "bert-base"):
            continue
        data = RandomData(item, EFFECTIVE_BATCH * (args.steps + 1))
        clocks = {kind: Clock() for kind in kinds}
        for _ in range(args.rounds):  # interleaved, so drift on a shared machine hits every run alike
            for kind in kinds:
                run(kind, make_model, data, args.steps, clocks[kind])
        print(f"\n{name}")
        print(f"{'phase':<20}" + "".join(f"{kind:>14}" for kind in kinds) + f"{'fp16 - fp32':>13}")
        medians = {kind: {p: statistics.median(s.get(p, 0.0) for s in clocks[kind].steps) * 1e3
                          for p in (*PHASES, "total", "page faults", "kernel time")} for kind in kinds}  # fmt: skip
        for phase in (*PHASES, "total"):
            row = [medians[kind][phase] for kind in kinds]
            print(f"{phase:<20}" + "".join(f"{v:>14.1f}" for v in row) + f"{row[2] - row[1]:>+13.1f}")
        print(f"{'  of which kernel':<20}" + "".join(f"{medians[kind]['kernel time']:>14.1f}" for kind in kinds))
        print(f"{'page faults':<20}" + "".join(f"{medians[kind]['page faults']:>14,.0f}" for kind in kinds))
        fp32, fp16, torch_sr, plain = (medians[k]["total"] for k in ("ipu-fp32", "ipu-fp16", "fp16-torch-sr", "plain-ga"))
        print(f"ratio to plain-ga (samples/s, CPU time): ipu-fp32 {plain / fp32:.2f}, ipu-fp16 {plain / fp16:.2f}, "
              f"fp16 with stochastic rounding on torch's calls {plain / torch_sr:.2f}")


if __name__ == "__main__":
    main()
