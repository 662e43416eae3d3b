"""Quality of the example jobs on the simulated IPU: does training through optimum-ipu learn?

Runs the two offline demos exactly as a user would (they generate their data and call the example
scripts with IPU settings from Graphcore's published configs) and reports the score before and
after training, the training steps and the times. The generated data is hard on purpose, so the
trained score is well short of perfect and a numerics regression shows as a lower score:

(a) question answering: real MiniLM-L6 weights fine-tuned on generated SQuAD-format data (recurring
    fact kinds, distractor sentences, paraphrased questions) at sequence length 128 with
    `Graphcore/bert-base-ipu`, `--pod_type pod16`, `--loss_scaling 64`, fp16, 30 steps
    (examples/question-answering/run_offline_demo.sh). Target: F1 >= {qa_floor} and at least
    {qa_gain} points above the untrained model, within 30 steps.
(b) multi-label X-ray classification: a tiny ViT built from a config, trained on generated
    ChestX-ray14-shaped data (faint, overlapping findings, the real prevalences, 10 % label noise)
    split by patient (examples/image-classification/run_offline_demo.sh). Target: macro ROC AUC
    >= {vit_floor} and at least {vit_gain} above the untrained model.

    python bench/quality.py [--only qa|vit] [--work-dir DIR] [--json results.json]

Timings on shared machines vary by +-20%. The scores are not exactly reproducible across machines
and thread counts (summation order), and 30 short steps amplify that: two QA runs on one CPU, one
and two torch threads, ended at F1 66.0 and 42.7; the targets leave room for that spread.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Targets: the trained score must reach the floor and beat the untrained model by the gain.
QA_FLOOR, QA_GAIN = 30.0, 25.0  # measured: untrained F1 4.1-4.2, trained 42.7 and 66.0 (two runs)
VIT_FLOOR, VIT_GAIN = 0.65, 0.1  # measured: untrained AUC 0.51, trained 0.70
__doc__ = __doc__.format(qa_floor=QA_FLOOR, qa_gain=QA_GAIN, vit_floor=VIT_FLOOR, vit_gain=VIT_GAIN)
JOBS = {
    "qa": {
        "script": ROOT / "examples" / "question-answering" / "run_offline_demo.sh",
        "score": "eval_f1", "untrained": "untrained_f1", "target": QA_FLOOR, "gain": QA_GAIN, "max_steps": 30,
        "also": ("eval_exact_match", "untrained_exact_match"),
    },
    "vit": {
        "script": ROOT / "examples" / "image-classification" / "run_offline_demo.sh",
        "score": "eval_roc_auc", "untrained": "untrained_roc_auc", "target": VIT_FLOOR, "gain": VIT_GAIN,
        "max_steps": None, "also": ("eval_roc_auc_findings_scored", "eval_loss"),
    },
}  # fmt: skip


def run_job(name: str, work_dir: Path, extra: list[str]) -> dict:
    """Run one demo in `work_dir`; return its score, steps, times and whether it met the target."""
    job = JOBS[name]
    env = dict(
        os.environ, WORK=str(work_dir), PYTHON=sys.executable, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"
    )
    log_path = work_dir / "bench.log"
    work_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log_path.open("w") as log:
        done = subprocess.run(
            ["bash", str(job["script"]), *extra], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        tail = log_path.read_text()[-2000:]
        raise RuntimeError(f"{name} demo failed (exit {done.returncode}); log {log_path}:\n{tail}")
    results = json.loads((work_dir / "output" / "all_results.json").read_text())
    steps = int(results["train_steps"])
    score = float(results[job["score"]])
    untrained = float(results.get(job["untrained"], "nan"))
    within_steps = job["max_steps"] is None or steps <= job["max_steps"]
    return {
        "job": name,
        job["untrained"]: round(untrained, 4),
        job["score"]: round(score, 4),
        **{key: round(float(results[key]), 4) for key in job["also"] if key in results},
        "train_steps": steps,
        "train_samples_per_second": results.get("train_samples_per_second"),
        "train_runtime_s": round(float(results["train_runtime"]), 1),
        "wall_time_s": round(wall, 1),  # data generation, model loading, compilation, training, evaluation
        "target": f"{job['score']} >= {job['target']} and >= {job['untrained']} + {job['gain']}"
        + (f" within {job['max_steps']} steps" if job["max_steps"] else ""),
        "met": score >= job["target"] and score - untrained >= job["gain"] and within_steps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(JOBS), help="run one job only")
    parser.add_argument(
        "--work-dir", type=Path, help="keep data and outputs here (default: a temporary folder)"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--qa-args", default="", help="extra run_qa.py flags, e.g. '--max_steps 20'")
    parser.add_argument("--vit-args", default="", help="extra run_image_classification.py flags")
    args = parser.parse_args(argv)

    names = [args.only] if args.only else list(JOBS)
    extras = {"qa": args.qa_args.split(), "vit": args.vit_args.split()}
    with tempfile.TemporaryDirectory(prefix="optimum_ipu_quality_") as scratch:
        base = args.work_dir or Path(scratch)
        results = [run_job(name, base / name, extras[name]) for name in names]
    for result in results:
        print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(r["met"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
