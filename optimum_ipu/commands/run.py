"""`optimum-ipu run PROGRAM [ARGS...]`: an Optimum Graphcore script or notebook, unchanged.

PROGRAM is a Python script (run as `python PROGRAM ARGS` would, as `__main__`) or a Jupyter
notebook (`.ipynb`: its code cells in order). Everything after PROGRAM is the program's own
command line, passed on untouched (its `--debug` included). The launcher's compatibility shims
and offline metrics are described in docs/running-optimum-graphcore-code.md.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `run` on the `optimum-ipu` parser."""
    parser = subparsers.add_parser(
        "run",
        help="Run an Optimum Graphcore script or notebook unchanged (with shims for APIs removed since).",
        description="Run a Python script as __main__, or a notebook's code cells in order, with compatibility "
        "shims for the transformers / datasets APIs that Optimum Graphcore 0.7 code uses and newer releases "
        "removed, and common metrics served offline. Each shim is noted once when it acts.",
    )
    parser.add_argument("program", help="The script (.py) or notebook (.ipynb) to run.")
    parser.add_argument(
        "args", nargs=argparse.REMAINDER, help="The program's own arguments, passed on as they are."
    )
    parser.add_argument(
        "--hub-metrics",
        action="store_true",
        help="Load every metric through evaluate and the Hugging Face Hub instead of the launcher's offline copies.",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the program; its exit status, or 1 with one `error:` line when the launcher has to stop it."""
    from optimum_ipu.launcher import LauncherError, run_notebook, run_script

    runner = run_notebook if str(args.program).endswith(".ipynb") else run_script
    try:
        return runner(args.program, list(args.args), serve_metrics=not args.hub_metrics)
    except LauncherError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
