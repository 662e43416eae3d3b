"""Count the gloo teardown aborts in N two-process torchrun launches.

Each launch trains the multi-process tests' tiny BERT QA worker (`tests/distributed/_train_worker.py`)
for a few steps with 2 replica processes (or `--pipeline`: 2 pipeline stages) on gloo, and is
classified by its exit status and stderr:

- `ok`: exit 0;
- `teardown abort`: torchrun failed, a process printed "terminate called without an active
  exception" (SIGABRT) and rank 0 had written everything (`summary.json`): the run itself succeeded;
- `other failure`: anything else (its stderr tail is printed).

Before the fix in `optimum_ipu/runtime/distributed.py` (`_close_process_group`) about 1 launch in 75
aborted at teardown; the goal was 300 launches in a row without one, met on 2026-11-25 with
`-n 300 --steps 1` (2 replica processes: 300 ok). Launches run one after another
unless `--parallel` is given (each launch is two processes; on a 2-core machine keep it at 1).

    python bench/teardown.py [-n 300] [--steps 3] [--pipeline] [--parallel 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed" / "_train_worker.py"
TEARDOWN_ABORT = "terminate called without an active exception"
REPLICAS = {
    "layers_per_ipu": [-1],
    "ipus_per_replica": 1,
    "replication_factor": 2,
    "gradient_accumulation_steps": 4,
}
PIPELINE = {"layers_per_ipu": [2, 2], "ipus_per_replica": 2, "gradient_accumulation_steps": 4}


def launch(index: int, folder: Path, steps: int, ipu_config: dict) -> tuple[str, float, str]:
    """One two-process launch: (outcome, seconds, stderr tail)."""
    out = folder / f"run{index}"
    spec = folder / f"spec{index}.json"
    spec.write_text(json.dumps({"out": str(out), "steps": steps, "ipu_config": ipu_config}))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(WORKER), str(spec)]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    seconds = time.perf_counter() - start
    if result.returncode == 0:
        return "ok", seconds, ""
    if TEARDOWN_ABORT in result.stderr and (out / "summary.json").exists():
        return "teardown abort", seconds, result.stderr[-1500:]
    return "other failure", seconds, result.stderr[-3000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--launches", type=int, default=300, help="two-process launches (default 300)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per launch")
    parser.add_argument("--pipeline", action="store_true", help="2 pipeline stages instead of 2 replicas")
    parser.add_argument("--parallel", type=int, default=1, help="launches at a time")
    args = parser.parse_args(argv)
    ipu_config = PIPELINE if args.pipeline else REPLICAS
    counts = {"ok": 0, "teardown abort": 0, "other failure": 0}
    with tempfile.TemporaryDirectory(prefix="teardown-") as tmp, ThreadPoolExecutor(args.parallel) as pool:
        futures = [pool.submit(launch, i, Path(tmp), args.steps, ipu_config) for i in range(args.launches)]
        for i, future in enumerate(futures, start=1):
            outcome, seconds, tail = future.result()
            counts[outcome] += 1
            print(f"launch {i:4d}/{args.launches}: {outcome:<14} {seconds:5.1f} s", flush=True)
            if tail:
                print("  " + tail.replace("\n", "\n  "), flush=True)
    layout = "2 pipeline stages" if args.pipeline else "2 replica processes"
    print(
        f"{args.launches} launches ({layout}, gloo): {counts['ok']} ok, {counts['teardown abort']} teardown "
        f"aborts, {counts['other failure']} other failures"
    )
    return 0 if counts["ok"] == args.launches else 1


if __name__ == "__main__":
    sys.exit(main())
