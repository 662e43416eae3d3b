"""`optimum-ipu plan MODEL --ipu-config NAME`: will this layout fit, how fast would it run, and what is better.

Builds the model from its config on the meta device (no weights are allocated or downloaded), traces
one micro-batch, and prints the compile report a real IPU system would give: per-IPU memory against
900 MB and the estimated throughput. `--auto` also searches `layers_per_ipu` and `matmul_proportion`
for the fastest layout that fits.

MODEL is a folder or `config.json` path, or one of the built-in presets (public architecture
hyper-parameters, so planning works offline). The presets' profiles ship with the package (see
`optimum_ipu.costmodel.shipped`) and other models' traced profiles are cached (see
`optimum_ipu.costmodel.cache`): a plan of a preset, or a repeated plan, imports neither torch nor
transformers and runs in well under a second.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from optimum_ipu.commands.flags import spellings
from optimum_ipu.configuration import load_ipu_config
from optimum_ipu.configuration.parsing import split_overrides
from optimum_ipu.costmodel.presets import PRESETS, TASKS, resolve_model
from optimum_ipu.costmodel.profiling import model_profile


def _total_ipus(args: argparse.Namespace) -> int | None:
    return args.n_ipu if args.pod is None else args.pod


# IPU config fields that only training reads: an --overrides of one under --inference changes nothing.
_TRAINING_ONLY = ("gradient_accumulation_steps", "recompute_checkpoint_every_layer", "optimizer_state_offchip",
                  "replicated_tensor_sharding", "auto_loss_scaling")  # fmt: skip
DEFAULT_SEQ_LEN = 384


def _seq_len(args: argparse.Namespace) -> int:
    """--seq-len, or its default when not given (None tells a given value from the default)."""
    return DEFAULT_SEQ_LEN if args.seq_len is None else args.seq_len


def settings_without_effect(args: argparse.Namespace, source) -> list[str]:
    """What the user gave that this plan does not read, each with why (printed as notes before the report)."""
    notes = []
    if source.is_vision and args.seq_len is not None:
        notes.append(f"--seq-len {args.seq_len} has no effect on {source.name}, an image model: its sequence is "
                     "its patches, which --image-size sets.")  # fmt: skip
    if "num_channels" not in source.config and args.image_size is not None:
        notes.append(f"--image-size {args.image_size} has no effect on {source.name}, which takes no images "
                     "(--seq-len sets its input).")  # fmt: skip
    if args.inference:
        given = [flag for flag, value in (("--optimizer", args.optimizer),
                                          ("--fp32-optimizer-state", args.fp32_optimizer_state)) if value]  # fmt: skip
        keys = [item.split("=", 1)[0].strip() for item in split_overrides(args.overrides or "")]
        given += [f"--overrides {key}" for key in keys if key in _TRAINING_ONLY]
        if given:
            notes.append(f"{', '.join(given)}: no effect with --inference, which has no optimizer, accumulation "
                         "or recomputation.")  # fmt: skip
    return notes


def run(args: argparse.Namespace) -> int:
    """Run `optimum-ipu plan`: 0 when the layout (or the proposal, with --auto) fits or may fit (an IPU
    within the memory model's error of its limit), 1 when an IPU is out of memory beyond that error."""
    from optimum_ipu.costmodel.hardware import chip
    from optimum_ipu.costmodel.layout_search import propose_layout
    from optimum_ipu.costmodel.report import report_for
    from optimum_ipu.costmodel.workload import StateTypes, Workload

    training = not args.inference
    if args.pipelined and training:
        print(
            "error: --pipelined is for --inference (training on several IPUs is always pipelined).",
            file=sys.stderr,
        )
        return 2
    if _generation_asked(args):
        return _run_generation(args)
    try:
        _check_outputs(args)
        if args.micro_batch < 1:
            raise ValueError(f"--micro-batch must be >= 1, got {args.micro_batch}.")
        source = resolve_model(args.model, args.task)
        for note in settings_without_effect(args, source):
            print(f"note: {note}", file=sys.stderr)
        seq_len = _seq_len(args)
        ipu_config = load_ipu_config(
            args.ipu_config, n_ipu=_total_ipus(args), overrides=args.overrides,
            mode="training" if training else "inference",
        )  # fmt: skip
        workload = Workload.from_ipu_config(
            ipu_config,
            micro_batch_size=args.micro_batch,
            training=training,
            optimizer=args.optimizer or "adamw",
            fp32=args.fp32,
            pipelined_inference=args.pipelined,
            state_types=StateTypes.all_fp32() if args.fp32_optimizer_state else None,
        )
        profile = model_profile(source, workload, seq_len, args.image_size, use_cache=not args.no_cache)
        placement = profile.placement(ipu_config.layers_per_ipu, workload.ipus_per_replica)
        hardware = chip(args.hardware)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    name = f"{source.name} ({source.builder})"
    if not args.auto:
        report = report_for(profile, placement, workload, hardware, model_name=name)
        print(report.summary())
        _save(args, report.to_dict(), report)
        return 1 if report.memory.surely_out_of_memory else 0
    proposal = propose_layout(profile, placement, workload, hardware, model_name=name)
    print(proposal.given.summary())
    print(proposal.summary())
    if proposal.proposed is not proposal.given:
        print("Proposed layout:")
        print(proposal.proposed.summary())
    _save(args, proposal.to_dict(), proposal.proposed)
    return 1 if proposal.proposed.memory.surely_out_of_memory else 0


def _generation_asked(args: argparse.Namespace) -> bool:
    given = (args.generation_max_length, args.num_beams, args.on_device_generation_steps)
    return any(value is not None for value in given) or args.use_cross_cache


def _generation_flags(args: argparse.Namespace) -> str:
    given = [
        ("--generation_max_length", args.generation_max_length),
        ("--num_beams", args.num_beams),
        ("--on_device_generation_steps", args.on_device_generation_steps),
    ]
    flags = [f"{flag} {value}" for flag, value in given if value is not None]
    return " ".join(flags + (["--use_cross_cache"] if args.use_cross_cache else []))


def _generation_error(args: argparse.Namespace, source) -> str | None:
    """Why the generation flags cannot apply to this plan, with the fix; None when they can."""
    flags = _generation_flags(args)
    if source is not None and not source.generates:
        return (
            f"{flags}: {source.name} plans {source.builder}, which does not generate. Generation is priced for "
            f"encoder-decoder models (BART, T5, MT5: --task summarization or translation; Whisper: --task "
            f"speech-recognition); drop {flags.split()[0]} to plan this head."
        )
    if not args.inference:
        return f"{flags}: a generation is inference; add --inference (training plans price teacher-forced steps)."
    if args.pipelined:
        return (
            f"{flags} with --pipelined: Optimum Graphcore runs the encoder's and the decoder's programs sharded, one "
            "call at a time; drop --pipelined."
        )
    if args.auto:
        return f"{flags} with --auto: the layout search prices one program, not a generation's two; drop it."
    if args.png:
        return f"{flags} with --png: a generation estimate has no drawing; write its --json instead."
    return None


def _run_generation(args: argparse.Namespace) -> int:
    """`plan --inference --generation_max_length N [--num_beams K]`: price an encoder-decoder's generation."""
    from optimum_ipu.costmodel.decoding import GenerationSettings, estimate_generation
    from optimum_ipu.costmodel.hardware import chip
    from optimum_ipu.costmodel.profiling import generation_profiles

    try:
        _check_outputs(args)
        source = resolve_model(args.model, args.task)
        for note in settings_without_effect(args, source):
            print(f"note: {note}", file=sys.stderr)
        problem = _generation_error(args, source)
        if problem:
            raise ValueError(problem)
        config = source.config
        default_length = config.get("max_length") or config.get("max_target_positions") or _DEFAULT_LENGTH
        settings = GenerationSettings(
            max_length=args.generation_max_length or default_length,
            num_beams=args.num_beams or 1,
            cross_cache=args.use_cross_cache,
            on_device_steps=args.on_device_generation_steps or 0,
        )
        ipu_config = load_ipu_config(
            args.ipu_config, n_ipu=_total_ipus(args), overrides=args.overrides, mode="inference"
        )
        float_bytes = 4 if args.fp32 else 2
        seq_len = _seq_len(args)
        profiles = generation_profiles(source, args.micro_batch, seq_len, settings, float_bytes,
                                       use_cache=not args.no_cache)  # fmt: skip
        report = estimate_generation(profiles, ipu_config, settings, batch_size=args.micro_batch,
                                     hardware=chip(args.hardware), fp32=args.fp32,
                                     model_name=f"{source.name} ({source.builder})")  # fmt: skip
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report.summary())
    _save(args, report.to_dict(), None)
    return 1 if report.memory.surely_out_of_memory else 0


# transformers' GenerationConfig.max_length, what Seq2SeqTrainer generates to when neither
# generation_max_length nor the model's config says.
_DEFAULT_LENGTH = 20


def _check_outputs(args: argparse.Namespace) -> None:
    """A ValueError, before any work, for a --json or --png that cannot be written (the report is otherwise
    printed first and then lost to the error)."""
    from optimum_ipu._matplotlib import require_matplotlib

    for flag, value in (("--json", args.json), ("--png", args.png)):
        if value and Path(value).is_dir():
            raise ValueError(f"{flag} {value} is a folder: give a file name, e.g. {Path(value) / ('plan.' + flag[2:])}.")
    if args.png:
        try:
            require_matplotlib(args.png)
        except ImportError as error:
            raise ValueError(str(error)) from None


def _save(args: argparse.Namespace, data: dict, report) -> None:
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
        print(f"Wrote {args.json}")
    if args.png:
        Path(args.png).parent.mkdir(parents=True, exist_ok=True)
        report.plot(args.png)
        print(f"Wrote {args.png}")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, so a bad size fails when parsed, naming the flag."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def pod_size(text: str) -> int:
    """argparse type for --pod: a pod's number of IPUs, a power of two, optionally spelled podN (pod16): the
    rule `IPUConfig.from_pretrained(pod_type=...)` and `optimum-ipu config show` apply (`n_ipu_from_pod_type`).
    Another count of IPUs is --n-ipu's."""
    from optimum_ipu.configuration import IPUConfigError
    from optimum_ipu.configuration.legacy import n_ipu_from_pod_type

    number = text.lower().removeprefix("pod")
    try:
        return n_ipu_from_pod_type(f"pod{number}")
    except IPUConfigError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a pod: give a power of two, e.g. 16 or pod16 (or any count of IPUs with --n-ipu)"
        ) from None


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `plan` on the `optimum-ipu` parser."""
    parser = subparsers.add_parser(
        "plan",
        help="Check an IPU layout's memory and estimate its throughput on a simulated IPU system.",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("model", help=f"config folder, config.json, or a preset ({', '.join(PRESETS)}).")
    parser.add_argument(
        *spellings("--ipu-config"),
        required=True,
        help="IPU config: Hub id (Graphcore/bert-base-ipu) or path.",
    )
    pods = parser.add_mutually_exclusive_group()
    pods.add_argument(
        *spellings("--pod", "--pod-type"),
        dest="pod",
        type=pod_size,
        default=None,
        help="Total IPUs as a pod size: 16, pod16, 64 ...",
    )
    pods.add_argument(
        *spellings("--n-ipu"),
        type=positive_int,
        default=None,
        help="Total IPUs (replicas = n_ipu / ipus_per_replica).",
    )
    parser.add_argument(
        *spellings("--micro-batch"), type=positive_int, default=1, help="Samples per micro-batch (default 1)."
    )
    parser.add_argument(
        *spellings("--seq-len"),
        type=positive_int,
        default=None,
        help=f"Sequence length of text models, or feature frames of speech models (20 ms each; default "
        f"{DEFAULT_SEQ_LEN}).",
    )
    parser.add_argument(
        *spellings("--image-size"),
        type=positive_int,
        default=None,
        help="Image side of vision models (default: config).",
    )
    parser.add_argument(
        "--hardware", choices=("mk2", "bow"), default="mk2", help="IPU generation (default mk2)."
    )
    parser.add_argument(
        "--task", choices=tuple(TASKS), default=None, help="Head to plan (default: from the config)."
    )
    parser.add_argument("--optimizer", choices=("adamw", "adam", "lamb", "sgd"), default=None,
                        help="The optimizer whose state training keeps (default adamw).")  # fmt: skip
    parser.add_argument("--fp32", action="store_true", help="Compute in fp32 instead of fp16.")
    parser.add_argument(
        *spellings("--fp32-optimizer-state"),
        action="store_true",
        help="Price fp32 optimizer state in an fp16 run (gradient accumulator and both moments: 4 + 4 + 4 "
        "bytes per weight, PopTorch's defaults) instead of Optimum Graphcore's fp16 accumulator and first "
        "moment beside an fp32 second moment (2 + 2 + 4), which IPUTrainer uses.",
    )
    parser.add_argument(
        "--inference", action="store_true", help="Plan (sharded) inference instead of training."
    )
    parser.add_argument(
        "--pipelined",
        action="store_true",
        help="With --inference: pipelined inference (PopTorch's default for a model placed on several IPUs; "
        "the stages overlap across device iterations) instead of sharded (Optimum Graphcore's).",
    )
    parser.add_argument(
        *spellings("--generation-max-length"),
        type=positive_int,
        default=None,
        help="With --inference on an encoder-decoder task: price a generation of up to this many tokens (the "
        "decoder's start token included; the KV cache's length). Default: the config's max_length, else 20.",
    )
    parser.add_argument(
        # The spellings 0.x accepted, in that order: argparse names the flag by all of them in its errors.
        # `--num-beams` is the documented one (FlagHelpFormatter shows it); `--generation_num_beams` is
        # the training argument's name.
        "--num_beams",
        "--num-beams",
        "--generation_num_beams",
        dest="num_beams",
        type=positive_int,
        default=None,
        help="Beams of the generation (default 1, greedy): the decoder runs on micro-batch x beams rows.",
    )
    parser.add_argument(
        *spellings("--use-cross-cache"),
        action="store_true",
        help="Generation: compute the cross-attention keys/values once per batch (Optimum Graphcore's "
        "use_cross_cache, T5 and Whisper) instead of every step.",
    )
    parser.add_argument(
        *spellings("--on-device-generation-steps"),
        type=positive_int,
        default=None,
        help="Generation: tokens the decoder makes on the IPUs per host call, choosing them there (Optimum "
        "Graphcore's on_device_generation_steps; default: one host call per token).",
    )
    parser.add_argument(
        "--overrides", default=None, help='Like --ipu_config_overrides: "k1=v1,k2=[0.1 0.2]".'
    )
    parser.add_argument(
        "--auto", action="store_true", help="Search the fastest layers_per_ipu / matmul_proportion."
    )
    parser.add_argument("--json", default=None, help="Write the report (or the proposal) as JSON here.")
    parser.add_argument("--png", default=None, help="Draw memory bars and the pipeline timeline here.")
    parser.add_argument(
        *spellings("--no-cache"), action="store_true", help="Trace again instead of using a cached profile."
    )
    parser.set_defaults(run=run)
