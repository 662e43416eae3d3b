"""One spelling per flag: the command line documents hyphens (`--micro-batch`) and accepts underscores.

Optimum Graphcore's scripts spell their flags with underscores (`--num_beams`, HfArgumentParser's
style), so a command line copied from one keeps working: every hyphenated flag of `optimum-ipu` is
also accepted with underscores (`--micro_batch`). `--help` and the documentation show the hyphens
only, and an abbreviation argparse accepted before (`--seq` for `--seq-len`) is not made ambiguous
by the other spelling of the same flag.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterable, Iterator


def _underscored(name: str) -> str:
    return name[:2] + name[2:].replace("-", "_")


def _documented(name: str) -> bool:
    return "_" not in name[2:]


def spellings(*names: str) -> list[str]:
    """A flag's option strings: its documented `names` (hyphens), then each spelled with underscores.

    `parser.add_argument(*spellings("--micro-batch"), ...)` accepts `--micro-batch` and `--micro_batch`;
    argparse names the value after the first (`args.micro_batch`).
    """
    if not all(_documented(name) for name in names):
        raise ValueError(f"document flags with hyphens, got {names}: the underscore spelling is added")
    aliases = [_underscored(name) for name in names if name.startswith("--") and "-" in name[2:]]
    return [*names, *aliases]


@contextlib.contextmanager
def _documented_spellings_only(actions: Iterable[argparse.Action]) -> Iterator[None]:
    """While formatting help, each flag shows its hyphenated spellings only (they are put back after)."""
    saved = [(action, action.option_strings) for action in actions]
    try:
        for action, names in saved:
            shown = [name for name in names if _documented(name)]
            if shown and shown != names:
                action.option_strings = shown
        yield
    finally:
        for action, names in saved:
            action.option_strings = names


class FlagHelpFormatter(argparse.HelpFormatter):
    """`--help` (usage and flag list) shows each flag under its documented, hyphenated spellings."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._flags: list[argparse.Action] = []

    def add_usage(self, usage, actions, groups, prefix=None) -> None:
        self._flags.extend(actions)
        super().add_usage(usage, actions, groups, prefix)

    def add_argument(self, action: argparse.Action) -> None:
        self._flags.append(action)
        with _documented_spellings_only([action]):  # the column width is measured here
            super().add_argument(action)

    def format_help(self) -> str:
        with _documented_spellings_only(dict.fromkeys(self._flags)):
            return super().format_help()


class FlagParser(argparse.ArgumentParser):
    """An `ArgumentParser` for flags declared with `spellings`: help with `FlagHelpFormatter`, and an
    abbreviation matching two spellings of one flag taken as that flag. Its subparsers are FlagParsers."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", FlagHelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, after refusing a flag that takes a value given twice: argparse keeps the last one
        silently, so `--overrides a=1 --overrides b=2` lost `a=1`."""
        import sys

        seen: dict[int, str] = {}
        for token in sys.argv[1:] if args is None else args:
            if token == "--":
                break
            if not token.startswith("--"):
                continue
            found = self._parse_optional(token)
            for action, spelled, *_ in found if isinstance(found, list) else [found] if found else []:
                if not isinstance(action, argparse._StoreAction):
                    continue
                if id(action) in seen:
                    hint = " (several overrides go in one comma-separated list: k1=v1,k2=v2)" if "overrides" in spelled else ""
                    self.error(f"{spelled} was given twice; only the last would be kept. Give it once{hint}.")
                seen[id(action)] = token
        return super().parse_known_args(args, namespace)

    def _get_option_tuples(self, option_string: str):
        matches = super()._get_option_tuples(option_string)
        one_per_flag = {id(match[0]): match for match in matches}  # match[0]: the flag's action
        return list(one_per_flag.values())
