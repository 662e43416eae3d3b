"""Mutation testing: does a test fail when a line of a rule-bearing module is changed?

    pip install -e ".[mutation]"      # mutmut 3.8.1
    python bench/mutation.py runtime/loss_scaling.py [--children 2]
    python bench/mutation.py --list

mutmut changes the module one small edit at a time (an operator, a constant, a condition, a dropped
call) and runs the tests that cover the changed function. A mutant no test notices ("survived") is
either a rule no test checks, or an edit that changes nothing observable (an "equivalent" mutant:
a log message's wording, a default nobody passes). The triage of those lives in
`bench/mutation_triage.txt`, one line per equivalent mutant (`name: why`); this script prints

    killed + timed out / (all mutants - equivalent ones)

per module, the figure the issue tracker asks to stay >= 90 %.

How it runs: the working tree is copied to a temporary folder (your checkout is never edited), and
mutmut runs there from a small virtual environment that sees this environment's packages but not
its editable install of optimum-ipu (an editable install would shadow the mutated copy). A module
takes a few minutes on 2 cores; the list of modules and the tests that cover each is `MODULES`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRIAGE = ROOT / "bench" / "mutation_triage.txt"

# Module (under optimum_ipu/) -> the tests that check its rules. mutmut reruns, for every mutant, each
# selected test that calls the mutated function, so slow end-to-end files (tests/test_trainer.py) are
# left out in favour of the module's own unit tests; leaving a test out can only lower the score.
MODULES: dict[str, list[str]] = {
    "runtime/loss_scaling.py": ["tests/runtime/test_loss_scaling.py", "tests/runtime/test_fp16_gradients.py",
                                "tests/runtime/test_executor.py"],
    "runtime/replicas.py": ["tests/runtime/test_replica_streams.py", "tests/runtime/test_executor.py"],
    "runtime/executor.py": ["tests/runtime/test_executable_wiring.py", "tests/runtime/test_executor.py",
                            "tests/runtime/test_fp16_gradients.py", "tests/runtime/test_replica_streams.py",
                            "tests/test_evaluation_metrics.py"],
    "runtime/gradients.py": ["tests/runtime/test_gradients.py", "tests/runtime/test_executor.py",
                             "tests/runtime/test_fp16_gradients.py"],
    "runtime/rounding.py": ["tests/runtime/test_rounding_and_optimizers.py"],
    "runtime/optimizers.py": ["tests/runtime/test_rounding_and_optimizers.py"],
    "runtime/fp16_compute.py": ["tests/runtime/test_fp16_compute.py", "tests/runtime/test_executable_wiring.py"],
    "runtime/batches.py": ["tests/runtime/test_batches.py", "tests/runtime/test_executor.py"],
    "runtime/checks.py": ["tests/runtime/test_checks.py", "tests/runtime/test_executor.py"],
    "runtime/distributed.py": ["tests/runtime/test_process_replicas.py"],
    "checkpoints/folders.py": ["tests/checkpoints"],
    "checkpoints/setup_change.py": ["tests/checkpoints"],
    "checkpoints/trainer_hooks.py": ["tests/checkpoints"],
    "configuration/schema.py": ["tests/test_config_schema.py", "tests/test_configuration.py"],
    "pipelining/placement.py": ["tests/pipelining/test_placement.py"],
}  # fmt: skip

RESULT = re.compile(r"^\s*(?P<name>\S+__mutmut_\d+): (?P<status>.+)$")


def isolated_python(folder: Path) -> Path:
    """A venv whose site-packages points at this interpreter's, without processing its .pth files.

    The editable install of optimum-ipu is a .pth file; a plain path entry to the same folder does not
    run it, so `import optimum_ipu` finds the mutated copy in mutmut's working folder instead.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "parent_environment.pth").write_text("\n".join(sorted(paths)) + "\n")
    return python


def copy_tree(target: Path) -> None:
    """The working tree as it is (tracked and untracked, not ignored files), without git or caches."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()  # fmt: skip
    for name in files:
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def configure(work: Path, tests: list[str]) -> None:
    selection = ", ".join(f'"{t}"' for t in tests)
    with open(work / "pyproject.toml", "a") as f:
        f.write(
            "\n[tool.mutmut]\n"
            'source_paths = ["optimum_ipu"]\n'
            'also_copy = ["tests", "optimum", "configs", "examples"]\n'
            f"pytest_add_cli_args_test_selection = [{selection}]\n"
        )


def equivalent_mutants() -> dict[str, str]:
    """`name: why` lines of the triage file (blank lines and `#` comments skipped)."""
    lines = TRIAGE.read_text().splitlines() if TRIAGE.exists() else []
    pairs = [line.split(": ", 1) for line in lines if line.strip() and not line.startswith("#")]
    return {name.strip(): why.strip() for name, why in pairs}


def run(module: str, children: int) -> int:
    if module not in MODULES:
        raise SystemExit(f"{module!r} is not in MODULES; choose one of: {', '.join(MODULES)}")
    dotted = "optimum_ipu." + module.removesuffix(".py").replace("/", ".")
    with tempfile.TemporaryDirectory(prefix="optimum-ipu-mutation-") as tmp:
        work = Path(tmp) / "tree"
        copy_tree(work)
        configure(work, MODULES[module])
        python = isolated_python(Path(tmp) / "venv")
        # mutmut forks a child per mutant after importing the tests: one thread per process, or a fork
        # copies a busy OpenMP pool and the child hangs until mutmut's timeout.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1"}  # fmt: skip
        subprocess.run([str(python), "-m", "mutmut", "run", "--max-children", str(children), f"{dotted}.*"],
                       cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        listing = subprocess.run([str(python), "-m", "mutmut", "results", "--all", "true"], cwd=work,
                                 capture_output=True, text=True).stdout  # fmt: skip
        results = {m["name"]: m["status"] for m in map(RESULT.match, listing.splitlines()) if m}
        results = {name: status for name, status in results.items() if name.startswith(dotted + ".")}
        equivalent = equivalent_mutants()
        survivors = [n for n, s in results.items() if s in ("survived", "no tests") and n not in equivalent]
        diffs = {name: _show(python, work, name) for name in survivors}
    if not results:
        print(f"{module}: mutmut produced no results (is mutmut installed? pip install mutmut==3.8.1)")
        return 1
    counts = Counter(results.values())
    declared = [n for n, s in results.items() if s in ("survived", "no tests") and n in equivalent]
    detected = counts["killed"] + counts["timeout"]
    counted = len(results) - len(declared)
    print(f"{module}: {len(results)} mutants: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"  equivalent (bench/mutation_triage.txt): {len(declared)}")
    print(
        f"  killed or timed out: {detected} of {counted} non-equivalent = {100 * detected / max(counted, 1):.1f} %"
    )
    for name in survivors:
        print(
            f"  not caught: {name} ({results[name]})\n" + "\n".join("      " + line for line in diffs[name])
        )
    return 0


def _show(python: Path, work: Path, name: str) -> list[str]:
    """The changed lines of mutant `name` (its diff without the file headers)."""
    diff = subprocess.run([str(python), "-m", "mutmut", "show", name], cwd=work, capture_output=True,
                          text=True).stdout  # fmt: skip
    return [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="modules under optimum_ipu/, e.g. runtime/loss_scaling.py")
    parser.add_argument("--children", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--list", action="store_true", help="list the modules and their tests")
    args = parser.parse_args(argv)
    if args.list or not args.modules:
        for module, tests in MODULES.items():
            print(f"{module}: {' '.join(tests)}")
        return 0
    return max(run(module, args.children) for module in args.modules)


if __name__ == "__main__":
    sys.exit(main())
