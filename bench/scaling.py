"""Scaling over processes: replicas and pipeline stages under torchrun, against one process.

    python bench/scaling.py [--rounds 3] [--steps 4] [--only replicas|pipeline] [--layers 6] [--ga 16]

Two comparisons, each measured in the same run, rounds interleaved, medians reported:

- replicas: one process training one replica vs two processes training two replicas (one each),
  every process on one thread, so each replica does the same work. Efficiency =
  samples/s(2 processes) / (2 x samples/s(1 process)); target >= 0.8.
- pipeline: a 2-IPU pipeline in one process (its stages run one after another) vs the same pipeline
  as two stage processes (stages work on different micro-batches at once), one thread each, GA 16.
  Speed-up = samples/s(2 processes) / samples/s(1 process); target >= 1.4 (issue 43: >= 1.8 on a
  balanced pipeline). Each process's CPU time per step is printed too: a stage process's is its
  stage's work, so their ratio is the stages' balance, and with the pipeline's fill and drain (GA + 1
  slots of the busier stage for GA micro-batches) it bounds the speed-up any hand-over could reach.

The model is a MiniLM-size BERT (6 layers by default, `--layers`; hidden 384) for question answering
at sequence length 128 on random tokens, trained in fp32 (the arithmetic is the same in every layout,
so only the layout's speed differs). Throughput counts the timed steps after one warm-up step and before the
last: at the end of training (and before every save or evaluation) stage processes gather the whole
model and its optimizer state on every rank, which is printed on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_description

WORKER_FLAG = "--worker"


def worker(spec_path: str) -> None:
    """One training run (under torchrun or alone); rank 0 writes the timed samples/s."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering, TrainerCallback

    from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments

    torch.set_num_threads(1)
    spec = json.loads(Path(spec_path).read_text())
    seq = 128

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, n: int):
            g = torch.Generator().manual_seed(0)
            self.ids = torch.randint(5, 30000, (n, seq), generator=g)
            self.start = torch.randint(1, seq - 3, (n,), generator=g)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "attention_mask": torch.ones(seq, dtype=torch.long),
                    "start_positions": self.start[i], "end_positions": self.start[i] + 2}  # fmt: skip

    class StepTimes(TrainerCallback):
        """Wall clock and this process's CPU time at the end of every step."""

        def __init__(self):
            self.times, self.cpu_times = [], []

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter())
            self.cpu_times.append(time.process_time())

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=spec["layers"], num_attention_heads=12,
                        intermediate_size=1536, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    model = BertForQuestionAnswering(config)
    ipu_config = IPUConfig(**spec["ipu_config"])
    args = IPUTrainingArguments(
        output_dir=spec["out"], per_device_train_batch_size=spec["micro_batch"], max_steps=spec["steps"] + 2,
        learning_rate=1e-4, save_strategy="no", report_to="none", logging_steps=1000, use_cpu=True,
        dataloader_num_workers=0, fp32=True, disable_tqdm=True,
    )  # fmt: skip
    combined = spec["micro_batch"] * ipu_config.batch_size_factor()
    trainer = IPUTrainer(model, ipu_config, args, train_dataset=Tokens(combined * (spec["steps"] + 2)))
    timer = StepTimes()
    trainer.add_callback(timer)
    trainer.train()
    # The steps between the first (warm-up) and the last are timed. The last step ends training: stage
    # processes then gather every stage's weights and optimizer state (as before a save), a one-off
    # reported on its own as the last step's time beyond a typical step. Every process writes the CPU
    # time its steps took: a stage process's is its stage's work, the rest of the wall time its waits.
    cpu_steps = [b - a for a, b in zip(timer.cpu_times, timer.cpu_times[1:])][:-1]
    Path(spec["out"], f"cpu-{args.process_index}.json").write_text(json.dumps(statistics.median(cpu_steps)))
    if args.process_index == 0:
        steps = [b - a for a, b in zip(timer.times, timer.times[1:])]
        typical = statistics.median(steps[:-1])
        Path(spec["out"], "result.json").write_text(json.dumps({
            "samples_per_second": combined * spec["steps"] / sum(steps[:-1]),
            "step_seconds": typical,
            "gather_seconds": max(steps[-1] - typical, 0.0),
        }))  # fmt: skip


def run(
    name: str, processes: int, ipu_config: dict, steps: int, micro_batch: int, layers: int, folder: Path
) -> dict:
    """samples/s of one launch, its median step in wall clock, the seconds its end-of-training gather
    added, and each process's median CPU seconds per step (`cpu`, by rank)."""
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    spec = folder / f"{name}.json"
    spec.write_text(json.dumps(
        {"out": str(out), "ipu_config": ipu_config, "steps": steps, "micro_batch": micro_batch, "layers": layers}
    ))  # fmt: skip
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    result = subprocess.run(
        [*launcher, __file__, WORKER_FLAG, str(spec)], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        finished = (out / "result.json").exists()
        raise SystemExit(
            f"{name} failed ({'after' if finished else 'before'} training ended):\n{result.stderr[-3000:]}"
        )
    result = json.loads((out / "result.json").read_text())
    result["cpu"] = [json.loads((out / f"cpu-{rank}.json").read_text()) for rank in range(processes)]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    parser.add_argument("--only", choices=("replicas", "pipeline"), default=None)
    parser.add_argument(
        "--layers", type=int, default=6, help="encoder layers (even: the pipeline puts half on each IPU)"
    )
    parser.add_argument("--ga", type=int, default=16, help="gradient accumulation steps")
    options = parser.parse_args()
    if options.layers < 2 or options.layers % 2:
        parser.error(f"--layers {options.layers}: give an even number of layers, at least 2.")

    ga, half = options.ga, options.layers // 2
    layouts = {
        "replicas": [
            ("1 process, 1 replica", 1, {"layers_per_ipu": [-1], "ipus_per_replica": 1, "replication_factor": 1,
                                         "gradient_accumulation_steps": ga}),
            ("2 processes, 2 replicas", 2, {"layers_per_ipu": [-1], "ipus_per_replica": 1, "replication_factor": 2,
                                            "gradient_accumulation_steps": ga}),
        ],
        "pipeline": [
            ("1 process, 2-IPU pipeline", 1, {"layers_per_ipu": [half, half], "ipus_per_replica": 2,
                                              "gradient_accumulation_steps": ga}),
            ("2 stage processes", 2, {"layers_per_ipu": [half, half], "ipus_per_replica": 2,
                                      "gradient_accumulation_steps": ga}),
        ],
    }  # fmt: skip
    if options.only:
        layouts = {options.only: layouts[options.only]}
    print(cpu_description())
    print(f"one thread per process; BERT {options.layers}x384 QA, "
          f"seq 128, micro-batch 2, GA {ga}, fp32; {options.rounds} rounds of {options.steps} timed steps")  # fmt: skip
    samples: dict[str, list[float]] = {}
    gathers: dict[str, list[float]] = {}
    steps: dict[str, list[float]] = {}
    cpus: dict[str, list[list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(options.rounds):
            for kind, runs in layouts.items():
                for name, processes, ipu_config in runs:
                    result = run(
                        f"{kind}-{processes}-{round_index}",
                        processes,
                        ipu_config,
                        options.steps,
                        2,
                        options.layers,
                        Path(tmp),
                    )
                    samples.setdefault(name, []).append(result["samples_per_second"])
                    gathers.setdefault(name, []).append(result["gather_seconds"])
                    steps.setdefault(name, []).append(result["step_seconds"])
                    cpus.setdefault(name, []).append(result["cpu"])
                    print(f"  round {round_index + 1}: {name}: {result['samples_per_second']:.2f} samples/s, "
                          f"last step +{result['gather_seconds']:.2f} s", flush=True)  # fmt: skip
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print("\nlayout | samples/s (median) | end-of-training gather, s (median)")
    for name, value in medians.items():
        print(f"{name} | {value:.2f} | {statistics.median(gathers[name]):.2f}")
    if "replicas" in layouts:
        efficiency = medians["2 processes, 2 replicas"] / (2 * medians["1 process, 1 replica"])
        print(f"replica scaling efficiency (target >= 0.8): {efficiency:.2f}")
    if "pipeline" in layouts:
        speedup = medians["2 stage processes"] / medians["1 process, 2-IPU pipeline"]
        print(f"pipeline speed-up at GA {ga} (target >= 1.4; issue 43: >= 1.8 when balanced): {speedup:.2f}x")
        _stage_balance(cpus, steps, ga)


def _stage_balance(cpus: dict[str, list[list[float]]], steps: dict[str, list[float]], ga: int) -> None:
    """Each stage process's work (its CPU time per step) against the one process doing both, and the
    speed-up that balance allows: a 1F1B schedule of `ga` micro-batches over 2 stages takes ga + 1
    slots of the busier stage's micro-batch, and the one process takes both stages' time."""
    one = statistics.median(c[0] for c in cpus["1 process, 2-IPU pipeline"])
    stages = [statistics.median(c[rank] for c in cpus["2 stage processes"]) for rank in range(2)]
    wall = statistics.median(steps["2 stage processes"])
    bound = one / (max(stages) * (ga + 1) / ga)
    print(f"CPU s per step: 1 process {one:.3f}; stage 0 {stages[0]:.3f} ({stages[0] / one:.2f} of it), "
          f"stage 1 {stages[1]:.3f} ({stages[1] / one:.2f})")  # fmt: skip
    print(f"2 stage processes: {wall:.3f} s per step in wall clock, of which the busier stage worked "
          f"{max(stages):.3f} s")  # fmt: skip
    print(f"the speed-up this balance allows with the pipeline's fill and drain: {bound:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == WORKER_FLAG:
        worker(sys.argv[2])
    else:
        main()
