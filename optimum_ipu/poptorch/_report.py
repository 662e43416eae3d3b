"""The compile report of a PopTorch model: per-IPU memory and estimated throughput, as the user placed it.

`compile()` (or the first call) traces one micro-batch; while it runs, every module notes the block
(`BeginBlock` / `Block`) it ran in. A module whose sub-modules all ran in one block belongs to that
block, so the blocks become a stage plan (block name, module paths, IPU) the cost model prices with
the options' batch arithmetic, memory proportions, optimizer-state location and the model's
precision: the path IPUTrainer's compile report takes (`optimum_ipu/compiling.py`). An IPU that
overflows fails the compile with Poplar's out-of-memory message and the table.
"""

from __future__ import annotations

import contextlib
from collections.abc import Container, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from optimum_ipu._once import warn_once
from optimum_ipu.compiling import CompileResult, report_layout
from optimum_ipu.costmodel.memory import IPUOutOfMemoryError, memory_check_from_environment
from optimum_ipu.costmodel.workload import StateTypes, Workload
from optimum_ipu.pipelining.stage_plan import Block, StagePlan
from optimum_ipu.poptorch._logging import Error, logger
from optimum_ipu.runtime.batches import batch_size_of

__all__ = ["PopTorchOutOfMemoryError", "compile_report", "recording_module_blocks", "stage_plan_from_blocks"]

# PopTorch's default share of tile memory for matmul/conv temporaries when none is set for an IPU.
DEFAULT_AVAILABLE_MEMORY_PROPORTION = 0.6
_ROOT = "model"  # the user's module inside the adapter the cost model calls


class PopTorchOutOfMemoryError(Error, IPUOutOfMemoryError):
    """A placed model that does not fit on some IPU: a `poptorch.Error` and optimum-ipu's `IPUOutOfMemoryError`."""


@contextlib.contextmanager
def recording_module_blocks(model: nn.Module, trace: list) -> Iterator[dict[str, int]]:
    """While active, each module of `model` that runs records the index of the block it ran in (in `trace`)."""
    blocks: dict[str, int] = {}

    def note(path: str):
        def hook(_module, _args) -> None:
            blocks.setdefault(path, len(trace) - 1)

        return hook

    # Registered after the BeginBlock hooks, so a module starting a block is recorded in its own block.
    handles = [m.register_forward_pre_hook(note(path)) for path, m in model.named_modules()]
    try:
        yield blocks
    finally:
        for handle in handles:
            handle.remove()


def nearest_ancestor_run(path: str, ran: Container[str]) -> str:
    """The nearest ancestor of module `path` among the modules that ran ("" for the root): containers
    such as `ModuleList` never run, so a module's caller is the closest ancestor that did."""
    while path:
        path = path.rpartition(".")[0]
        if path in ran:
            return path
    return ""


def stage_plan_from_blocks(
    model: nn.Module, module_blocks: dict[str, int], entries: list[tuple[str | None, int]], ipus: int
) -> StagePlan:
    """The stage plan of the blocks the forward entered: each block owns the largest modules run wholly in it."""

    def within(path: str, root: str) -> bool:
        return not root or path == root or path.startswith(root + ".")

    def caller(path: str) -> str:
        return nearest_ancestor_run(path, module_blocks)

    spans = {path: {b for p, b in module_blocks.items() if within(p, path)} for path in module_blocks}
    owned: dict[int, list[str]] = {}
    for path, span in spans.items():
        if len(span) == 1 and (not path or len(spans[caller(path)]) > 1):
            owned.setdefault(next(iter(span)), []).append(_join(_ROOT, path))
    embeddings = {_join(_ROOT, p) for p, m in model.named_modules() if isinstance(m, nn.Embedding)}
    blocks = []
    for index, (user_id, ipu) in enumerate(entries):
        paths = owned.get(index)
        if not paths:
            continue
        kind = "embedding" if not blocks and any(within(e, p) for p in paths for e in embeddings) else "layer"
        blocks.append(Block(user_id or f"Block {index}", tuple(paths), ipu, kind))
    return StagePlan(tuple(blocks), ipus)


def _join(root: str, path: str) -> str:
    return f"{root}.{path}" if path else root


class _CalledWithOneMicroBatch(nn.Module):
    """The user's module called as the cost model calls a model: one micro-batch as keyword arguments."""

    spec: pytree.TreeSpec  # on the class made for each model (the cost model copies the instance)

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, **micro: Any) -> Any:
        args, kwargs = pytree.tree_unflatten([micro[str(i)] for i in range(len(micro))], self.spec)
        return self.model(*args, **kwargs)


def _adapter(model: nn.Module, spec: pytree.TreeSpec) -> nn.Module:
    """`model` behind `_CalledWithOneMicroBatch`, under the model's class name (the report's title)."""
    cls = type(type(model).__name__, (_CalledWithOneMicroBatch,), {"spec": spec})
    return cls(model)


def _optimizer_name(optimizer) -> str:
    name = type(optimizer).__name__.lower() if optimizer is not None else "sgd"
    for known in ("adamw", "adam", "lamb"):
        if name.startswith(known):
            return known
    return "sgd"  # SGD and RMSprop hold one state tensor per weight at most


def _state_types(optimizer) -> StateTypes:
    """The optimizer's state types (`StateTypes.of_optimizer`); SGD's fp32 when there is none."""
    return StateTypes.all_fp32() if optimizer is None else StateTypes.of_optimizer(optimizer)


def compile_report(
    model: nn.Module,
    plan: StagePlan,
    options,
    micro_leaves: list[Any],
    spec: pytree.TreeSpec,
    *,
    training: bool,
    optimizer,
    num_ipus: int,
    recomputed: bool,
    memory_check: str = "auto",
) -> CompileResult:
    """Price `plan` under `options` with the cost model (logged like IPUTrainer's); overflow is an Error."""
    proportions = options.available_memory_proportion
    location = options.TensorLocations._values.get("location_optimizer", {})
    first = next(model.parameters())
    micro = {  # floating inputs in the model's precision, as the executable feeds them
        str(i): leaf.to(first.dtype) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() else leaf
        for i, leaf in enumerate(micro_leaves)
    }
    workload = Workload(
        micro_batch_size=batch_size_of(micro),
        gradient_accumulation_steps=options.Training.gradient_accumulation if training else 1,
        replication_factor=options.replication_factor,
        device_iterations=options.device_iterations,
        ipus_per_replica=plan.ipus_per_replica,
        matmul_proportion=tuple(
            float(proportions.get(f"IPU{i}", DEFAULT_AVAILABLE_MEMORY_PROPORTION))
            for i in range(plan.ipus_per_replica)
        ),
        optimizer_state_offchip=not location.get("onChip", True),
        replicated_tensor_sharding=bool(location.get("useReplicatedTensorSharding", False)),
        recompute_checkpoint_every_layer=recomputed,
        training=training,
        pipelined_inference=not training and not options._is_sharded(),
        optimizer=_optimizer_name(optimizer),
        fp32=first.dtype != torch.float16,
        state_types=_state_types(optimizer),
    )
    try:
        return report_layout(
            _adapter(model, spec),
            plan,
            workload,
            micro_batch=micro,
            num_ipus=num_ipus,
            memory_check=memory_check,
        )
    except IPUOutOfMemoryError as error:
        raise PopTorchOutOfMemoryError(str(error), type="popart_memory_allocation_err") from None


def report_of_compile(model, trace, options, training: bool, optimizer, num_ipus: int, recomputed: bool):
    """The cost model's memory table and throughput for the blocks as placed (logged), or None for a
    model with no weights; a model the cost model cannot trace still runs, with a warning. A layout the
    memory model is sure does not fit raises `PopTorchOutOfMemoryError`."""
    if next(model.parameters(), None) is None:
        return None  # no weights: nothing to place, no memory to report
    plan = stage_plan_from_blocks(model, trace.module_blocks, trace.entries, num_ipus)
    check = memory_check_from_environment()  # a bad value is the user's error, not a failed estimate
    try:
        return compile_report(
            model, plan, options, trace.micro, trace.spec, training=training, optimizer=optimizer,
            num_ipus=num_ipus * options.replication_factor, recomputed=recomputed, memory_check=check,
        )  # fmt: skip
    except PopTorchOutOfMemoryError:
        raise
    except Exception as error:  # noqa: BLE001 - the estimate is a report; the model still runs
        logger.warning("No compile report for this model (the cost model could not trace it): %s", error)
        return None


def _estimate(result, call: str):
    """The cost model's report of the compiled layout (None before a call has run, or without one)."""
    if result is None or getattr(result, "report", None) is None:
        return None
    warn_once(logger, "PoplarExecutor.%s() answers with the cost model's estimate for an IPU: there is no IPU "
              "to time here.", call)  # fmt: skip
    return result.report


def latency(result, options) -> tuple[float, float, float]:
    """`getLatency()`: (min, max, average) seconds per device iteration of the last call, as PopTorch reports.

    There is no IPU to time: the figure is the cost model's estimated call time for the compiled layout
    divided by its device iterations (so min = max = average), said once in the log; (0, 0, 0) before the
    first call (`result` None), as PopTorch's, or when the cost model could not price the model.
    """
    report = _estimate(result, "getLatency")
    if report is None:
        return (0.0, 0.0, 0.0)
    per_iteration = report.performance.call_time / max(1, options.device_iterations)
    return (per_iteration, per_iteration, per_iteration)


def cycle_count(result, options, compiled: bool) -> int:
    """`cycleCount()`: IPU cycles of the last call (the first replica's), as PopTorch reports with
    `logCycleCount(True)`: the cost model's estimated device time of the call (without the host's) times
    the chip's clock."""
    if not options._values.get("log_cycle_count", False):
        raise Error("Cycle count logging is disabled. Please set option logCycleCount to True to enable.")
    if not compiled:
        raise Error("Please run the model at least once before obtaining cycle count.")
    report = _estimate(result, "cycleCount")
    if report is None:
        return 0
    device = report.performance.call_time - report.performance.host_time
    return int(round(device * report.hardware.clock_hz))
