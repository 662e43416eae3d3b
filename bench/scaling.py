"""Scaling over processes: replicas and pipeline stages under torchrun, against one process.

    python bench/scaling.py [--rounds 3] [--steps 4]

Two comparisons, each measured in the same run, rounds interleaved, medians reported:

- replicas: one process training one replica vs two processes training two replicas (one each),
  every process on one thread, so each replica does the same work. Efficiency =
  samples/s(2 processes) / (2 x samples/s(1 process)); target >= 0.8.
- pipeline: a 2-IPU pipeline in one process (its stages run one after another) vs the same pipeline
  as two stage processes (stages work on different micro-batches at once), one thread each, GA 16.
  Speed-up = samples/s(2 processes) / samples/s(1 process); target >= 1.4.

The model is a MiniLM-size BERT (6 layers, hidden 384) for question answering at sequence length
128 on random tokens, trained in fp32 (the arithmetic is the same in every layout, so only the
layout's speed differs). Throughput counts the timed steps after one warm-up step and before the
last: at the end of training (and before every save or evaluation) stage processes gather the whole
model and its optimizer state on every rank, which is printed on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER_FLAG = "--worker"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


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
        def __init__(self):
            self.times = []

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter())

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
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
    if args.process_index == 0:
        # The steps between the first (warm-up) and the last are timed. The last step ends training:
        # stage processes then gather every stage's weights and optimizer state (as before a save), a
        # one-off reported on its own as the last step's time beyond a typical step.
        steps = [b - a for a, b in zip(timer.times, timer.times[1:])]
        typical = statistics.median(steps[:-1])
        Path(spec["out"], "result.json").write_text(json.dumps({
            "samples_per_second": combined * spec["steps"] / sum(steps[:-1]),
            "gather_seconds": max(steps[-1] - typical, 0.0),
        }))  # fmt: skip


def run(name: str, processes: int, ipu_config: dict, steps: int, micro_batch: int, folder: Path) -> dict:
    """samples/s of one launch, and the seconds its end-of-training gather added."""
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    spec = folder / f"{name}.json"
    spec.write_text(
        json.dumps({"out": str(out), "ipu_config": ipu_config, "steps": steps, "micro_batch": micro_batch})
    )
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
    return json.loads((out / "result.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    parser.add_argument("--only", choices=("replicas", "pipeline"), default=None)
    options = parser.parse_args()

    ga = 16
    layouts = {
        "replicas": [
            ("1 process, 1 replica", 1, {"layers_per_ipu": [-1], "ipus_per_replica": 1, "replication_factor": 1,
                                         "gradient_accumulation_steps": ga}),
            ("2 processes, 2 replicas", 2, {"layers_per_ipu": [-1], "ipus_per_replica": 1, "replication_factor": 2,
                                            "gradient_accumulation_steps": ga}),
        ],
        "pipeline": [
            ("1 process, 2-IPU pipeline", 1, {"layers_per_ipu": [3, 3], "ipus_per_replica": 2,
                                              "gradient_accumulation_steps": ga}),
            ("2 stage processes", 2, {"layers_per_ipu": [3, 3], "ipus_per_replica": 2,
                                      "gradient_accumulation_steps": ga}),
        ],
    }  # fmt: skip
    if options.only:
        layouts = {options.only: layouts[options.only]}
    print(f"CPU: {_cpu_name()}, {os.cpu_count()} cores; one thread per process; BERT 6x384 QA, seq 128, "
          f"micro-batch 2, GA {ga}, fp32; {options.rounds} rounds of {options.steps} timed steps")  # fmt: skip
    samples: dict[str, list[float]] = {}
    gathers: dict[str, list[float]] = {}
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
                        Path(tmp),
                    )
                    samples.setdefault(name, []).append(result["samples_per_second"])
                    gathers.setdefault(name, []).append(result["gather_seconds"])
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
        print(f"pipeline speed-up at GA {ga} (target >= 1.4): {speedup:.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == WORKER_FLAG:
        worker(sys.argv[2])
    else:
        main()
