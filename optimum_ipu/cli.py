"""The `optimum-ipu` console command: a thin dispatcher over `optimum_ipu.commands`.

Each subcommand lives in its own module and registers its arguments with `add_parser(subparsers)`
and runs with `run(args) -> int`, so the dispatcher never grows with the commands.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# subcommand -> module under optimum_ipu.commands
_COMMANDS = {
    "config": "optimum_ipu.commands.config",
    "plan": "optimum_ipu.commands.plan",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optimum-ipu",
        description="Inspect IPU configs and plan IPU layouts on a simulated IPU.",
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
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if "--debug" in argv:
        argv.remove("--debug")
        debug = True
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage and the error
        return exit_.code if isinstance(exit_.code, int) else 2
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
