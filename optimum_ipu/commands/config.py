"""`optimum-ipu config show NAME_OR_PATH`: the resolved IPU config, its batch arithmetic and its origin.

Answers the questions a user has before a run: which file was used (a local one, the Hub, the Hub
cache or the copy bundled with optimum-ipu), what every attribute resolved to in both modes, and how
large a combined batch is. Only the config machinery is imported, so the command starts fast.
"""

from __future__ import annotations

import argparse
import sys

from optimum_ipu.commands.flags import spellings
from optimum_ipu.configuration import IPUConfig, IPUConfigError, load_ipu_config

_SOURCES = {
    "local": "local file",
    "hub": "Hugging Face Hub",
    "hub-cache": "Hugging Face cache (offline)",
    "bundled": "copy bundled with optimum-ipu (the Hub was offline or unreachable)",
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `config` and its `show` action on the `optimum-ipu` parser."""
    parser = subparsers.add_parser("config", help="Inspect IPU configs (ipu_config.json).")
    actions = parser.add_subparsers(dest="config_action", required=True)
    show = actions.add_parser(
        "show",
        help="Print a resolved IPU config, its combined-batch arithmetic and where it came from.",
        description="Print a resolved IPU config, its combined-batch arithmetic and where it came from.",
    )
    show.add_argument("name_or_path", help="Hub id (e.g. Graphcore/bert-base-ipu), folder or JSON file.")
    show.add_argument(*spellings("--micro-batch"), type=int, default=1, help="Micro-batch size (default 1).")
    show.add_argument(
        *spellings("--n-ipu"), type=int, default=None, help="Total IPUs: sets the replication factors."
    )
    show.add_argument(
        *spellings("--pod-type"), default=None, help="Older spelling of --n-ipu: podN, e.g. pod16."
    )
    show.add_argument("--overrides", default=None, help='Like --ipu_config_overrides: "k1=v1,k2=[0.1 0.2]".')
    show.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit).")
    show.add_argument("--strict", action="store_true", help="Fail on unknown keys instead of warning.")
    show.set_defaults(run=run_show)


def _load(args: argparse.Namespace) -> IPUConfig:
    return load_ipu_config(
        args.name_or_path, n_ipu=args.n_ipu, pod_type=args.pod_type, overrides=args.overrides,
        revision=args.revision, strict=args.strict, flags=("--pod-type", "--n-ipu"),
    )  # fmt: skip


def format_report(config: IPUConfig, micro_batch: int = 1) -> str:
    """The text `config show` prints for a loaded config."""
    source = _SOURCES.get(config.source, "constructed in code")
    lines = [f"Source: {source}"]
    if config.source_path:
        lines.append(f"File: {config.source_path}")
    lines += [
        "",
        config.to_json_string().rstrip(),
        "",
    ]
    for mode, for_inference in (("training", False), ("inference", True)):
        view = config.copy().eval() if for_inference else config.copy().train()
        lines += [
            f"{mode.capitalize()}:",
            f"  pipeline: {view.ipus_per_replica} IPUs per replica, layers_per_ipu {view.layers_per_ipu}, "
            f"matmul_proportion {view.matmul_proportion}",
            f"  IPUs: {view.replication_factor} replicas × {view.ipus_per_replica} = {config.num_ipus(for_inference)}",
            f"  combined batch: {config.describe_combined_batch(micro_batch, for_inference)}",
        ]
    return "\n".join(lines)


def run_show(args: argparse.Namespace) -> int:
    """Run `optimum-ipu config show`; returns the exit status (1 when the config cannot be loaded)."""
    if args.micro_batch < 1:
        print(f"error: --micro-batch must be >= 1, got {args.micro_batch}", file=sys.stderr)
        return 2
    try:
        config = _load(args)
    except (IPUConfigError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"IPU config: {args.name_or_path}")
    print(format_report(config, args.micro_batch))
    return 0
