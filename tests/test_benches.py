"""The PopTorch benches keep running: they time the runtime through names they patch (`bench/fp16_breakdown.py`'s
instruments), so a renamed function would leave a phase silently at zero or stop the script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[1] / "bench"


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_the_poptorch_breakdown_times_every_phase_of_a_half_call():
    out = _run("poptorch_breakdown.py", "--rounds", "1", "--calls", "1", "--program", "mlp")
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line[:1].isalpha()}
    for phase in ("forward", "backward", "accumulate", "fp32", "update", "round", "total"):
        assert phase in rows, phase
    phases = ("forward", "backward", "accumulate", "weights", "fp32", "update", "round")
    half = {name: float(rows[name][-2]) for name in phases}
    assert all(value > 0 for value in half.values()), half  # each instrument saw the half call's work
    assert "plain fp32 / run (CPU time): poptorch fp32" in out


def test_the_poptorch_overhead_bench_runs_the_rounding_floor():
    out = _run("poptorch_overhead.py", "--rounds", "1", "--calls", "1", "--program", "mlp")
    floor = next(line for line in out.splitlines() if line.startswith("rounding floor"))
    assert float(floor.split()[2]) > 0  # ms per host call
