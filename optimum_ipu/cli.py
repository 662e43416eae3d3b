"""The `optimum-ipu` console command: a thin dispatcher over `optimum_ipu.commands`.

Each subcommand lives in its own module and registers its arguments with `add_parser(subparsers)`
and runs with `run(args) -> int`, so the dispatcher never grows with the commands.
"""

from __future__ import annotations

import argparse
import importlib
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
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module_name in _COMMANDS.values():
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
