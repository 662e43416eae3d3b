"""The `optimum-ipu` console command: a thin dispatcher over `optimum_ipu.commands`.

Each subcommand lives in its own module and registers its arguments with `add_parser(subparsers)`
and runs with `run(args) -> int`, so the dispatcher never grows with the commands.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from optimum_ipu.commands.flags import FlagParser

# subcommand -> module under optimum_ipu.commands
_COMMANDS = {
    "config": "optimum_ipu.commands.config",
    "plan": "optimum_ipu.commands.plan",
    "run": "optimum_ipu.commands.run",
}


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        prog="optimum-ipu",
        description="Inspect IPU configs, plan IPU layouts, and run Optimum Graphcore scripts and notebooks on a "
        "simulated IPU.",
        epilog=f"--debug (or {DEBUG_ENV}=1) shows the traceback of an error.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in _COMMANDS.values():
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


DEBUG_ENV = "OPTIMUM_IPU_DEBUG"


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; return its exit status.

    A bad input prints one `error:` line and exits non-zero, without a traceback: argparse checks
    the flags (status 2), a command's own checks return 1 or 2, and any other exception is printed
    as one line too. `--debug` (anywhere on the command line) or `OPTIMUM_IPU_DEBUG=1` re-raises it
    with its traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, program_args = _split_program_args(argv)
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if "--debug" in ours:
        ours.remove("--debug")
        debug = True
    try:
        args = build_parser().parse_args(ours)
    except SystemExit as exit_:  # argparse has printed the usage and the error
        return exit_.code if isinstance(exit_.code, int) else 2
    if program_args is not None:
        args.args = program_args
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if debug:
            raise
        kind = "" if isinstance(error, (ValueError, OSError, KeyError)) else f"{type(error).__name__}: "
        print(f"error: {kind}{error}", file=sys.stderr)
        print(f"(run with --debug or {DEBUG_ENV}=1 to see the traceback)", file=sys.stderr)
        return 1


def _split_program_args(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """For `run PROGRAM ARGS...`: our arguments up to PROGRAM, and the program's (untouched: a script may
    have its own --debug or -h). Other commands: all arguments are ours."""
    if "run" not in argv or any(not a.startswith("-") for a in argv[: argv.index("run")]):
        return argv, None
    for position in range(argv.index("run") + 1, len(argv)):
        if not argv[position].startswith("-"):
            return argv[: position + 1], argv[position + 1 :]
    return argv, None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
