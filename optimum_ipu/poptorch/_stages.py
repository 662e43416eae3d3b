"""A pipelined PopTorch training model as stage processes under torchrun: one pipeline stage per process.

`torchrun --nproc_per_node P` with a model split by `BeginBlock` / `Block` / `Stage` into N pipeline
stages (`PipelinedExecution`) and `replicationFactor(R)` not a multiple of P runs P / N pipelines side
by side (each runs R x N / P of the replicas), each pipeline over N consecutive ranks, through the
runtime's `StageRunner` (`torch.distributed.pipelining`, GPipe over the GA micro-batches), the runner
`IPUTrainer`'s stage processes use.

How a stage runs an arbitrary user module (the technique of `runtime.stages`, without its
transformers-specific module swaps): every process holds the whole model and every micro-batch; a
compile-time trace of one micro-batch notes which stage each module runs in. Stage k then runs the
user's own forward with temporary hooks (undone after each call):

- each largest module that runs wholly on an earlier stage returns zeros shaped as its traced output
  (a placeholder: nothing of an earlier stage is computed);
- the first module that runs on stage k (the `BeginBlock`'ed layer) gets, as its first argument, the
  tensor received from stage k-1 instead of the placeholder-made one;
- on every stage but the last, the first module of stage k+1 raises before it runs, carrying its
  first argument out: that is what stage k sends on.

The last stage runs to the end: the outputs and the loss (`_outputs.find_loss`). So exactly one tensor
crosses each boundary, the first argument of the module that starts the stage; everything else a
stage reads is computed on that stage or is an input of the micro-batch. A forward where another tensor
crosses (a skip connection from stage 0 to stage 1) would silently read a placeholder, so the compile
runs each stage on the traced boundary input and compares what it sends (and, on the last stage, the
outputs) with the one-process forward; a mismatch is a `poptorch.Error` naming the stage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils import _pytree as pytree

from optimum_ipu.call_layout import CallLayout
from optimum_ipu.poptorch._annotations import recording_ipus
from optimum_ipu.poptorch._logging import Error
from optimum_ipu.poptorch._report import nearest_ancestor_run
from optimum_ipu.poptorch.enums import AutoStage
from optimum_ipu.runtime.stages import StageRunner, _StageOutput

__all__ = ["TracedStages", "PopTorchStages", "plan_stages"]

RUN_IN_ONE_PROCESS = (
    "Run the program in one process (pipelined execution is simulated there too), or place the block boundary "
    "(poptorch.BeginBlock) where only the block's input crosses from one stage to the next."
)


@dataclass
class TracedStages:
    """Which stage each module of the model runs in, from one traced micro-batch.

    Attributes:
        num_stages: pipeline stages, in the order the forward visits them.
        boundaries: path of the first module run on stage k, for k >= 1 (index k - 1): its first
            argument is what crosses from stage k - 1.
        placeholders: path -> (stage, zeros shaped as each call's output) of every largest module run
            wholly on one stage; later stages replay the zeros instead of running it.
        owners: id(parameter or buffer) -> the stage that computes (and updates) it.
        sent: the traced boundary inputs (index k - 1 for boundary k), for the shapes of the messages.
    """

    num_stages: int
    boundaries: list[str]
    placeholders: dict[str, tuple[int, list[Any]]] = field(default_factory=dict)
    owners: dict[int, int] = field(default_factory=dict)
    sent: list[torch.Tensor] = field(default_factory=list)


def _first_tensor_arg(args: tuple) -> torch.Tensor | None:
    return args[0] if args and isinstance(args[0], torch.Tensor) else None


def _stage_keys(entries: list[tuple[str | None, int]], strategy) -> list[Any]:
    """A key per block entry; entries with the same key are one pipeline stage (PopTorch's stage rules)."""
    keys: list[Any] = []
    segment, previous = -1, None
    for user_id, ipu in entries:
        if ipu != previous:
            segment, previous = segment + 1, ipu
        named = [
            i
            for i, stage in enumerate(strategy.stages)
            if user_id is not None and str(user_id) in stage.blocks
        ]
        if named:
            keys.append(("stage", named[0]))
        elif strategy.auto_stage == AutoStage.AutoIncrement:
            keys.append(("segment", segment))
        else:
            keys.append(("ipu", ipu))
    return keys


def plan_stages(model: nn.Module, args: tuple, kwargs: dict, strategy, num_stages: int) -> TracedStages:
    """Trace one micro-batch (in eval mode, no grad) and lay the model out as `num_stages` stage processes.

    Raises `poptorch.Error` when the forward does not visit the stages once each in order, when a
    weight is used on two stages, or when a tensor other than the boundary module's input crosses a
    boundary (each stage run alone on the traced boundary input differs from the one-process forward).
    """
    calls: list[tuple[str, int]] = []  # (module path, block entry index) per module call, in call order
    first_args: dict[str, list[torch.Tensor | None]] = {}
    outputs: dict[str, list[Any]] = {}

    def pre(path: str, trace: list):
        def hook(_module, hook_args) -> None:
            calls.append((path, len(trace) - 1))
            arg = _first_tensor_arg(hook_args)
            first_args.setdefault(path, []).append(None if arg is None else arg.detach().clone())

        return hook

    def post(path: str):
        def hook(_module, _args, output) -> None:
            outputs.setdefault(path, []).append(
                pytree.tree_map(lambda t: torch.zeros_like(t) if isinstance(t, torch.Tensor) else t, output)
            )

        return hook

    with recording_ipus() as trace:
        handles = []
        for path, module in model.named_modules():
            handles.append(module.register_forward_pre_hook(pre(path, trace)))  # after BeginBlock's own hook
            handles.append(module.register_forward_hook(post(path)))
        try:
            plain = model(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()

    keys = _stage_keys(list(trace), strategy)
    order: list[Any] = []
    for _path, entry in calls:
        if not order or order[-1] != keys[entry]:
            if keys[entry] in order:
                raise Error(
                    f"The forward returns to an earlier pipeline stage (block entries {[k for _, k in trace]}): "
                    f"stage processes run the {num_stages} stages one after another, each once. {RUN_IN_ONE_PROCESS}"
                )
            order.append(keys[entry])
    if len(order) != num_stages:
        raise Error(
            f"The forward runs modules on {len(order)} pipeline stages, but the placement has {num_stages}: stage "
            f"processes need a module on every stage. {RUN_IN_ONE_PROCESS}"
        )
    stage_of = {key: k for k, key in enumerate(order)}

    spans: dict[str, set[int]] = {}
    boundaries: list[str] = []
    boundary_calls: dict[str, int] = {}
    for index, (path, entry) in enumerate(calls):
        stage = stage_of[keys[entry]]
        if stage == len(boundaries) + 1:  # the first module of a new stage
            boundaries.append(path)
            boundary_calls[path] = sum(1 for p, _ in calls[:index] if p == path)
        parts = path.split(".") if path else []
        for depth in range(len(parts) + 1):
            spans.setdefault(".".join(parts[:depth]), set()).add(stage)
    sent = []
    for k, path in enumerate(boundaries, start=1):
        arg = first_args[path][boundary_calls[path]]
        if arg is None:
            raise Error(
                f"Stage {k} starts at {path or type(model).__name__}, whose first argument is not a tensor: stage "
                f"processes send the first argument of the module that starts a stage. {RUN_IN_ONE_PROCESS}"
            )
        if boundary_calls[path]:
            raise Error(
                f"Stage {k} starts at a later call of {path}: stage processes need its first call there."
            )
        sent.append(arg)

    called = {path for path, _ in calls}

    def caller(path: str) -> str:
        return nearest_ancestor_run(path, called)

    placeholders = {
        path: (next(iter(span)), outputs[path])
        for path, span in spans.items()
        if path in called and path and len(span) == 1 and len(spans[caller(path)]) > 1
    }
    plan = TracedStages(num_stages, boundaries, placeholders, {}, sent)
    reached = _check_only_boundaries_cross(model, args, kwargs, plan, plain)
    plan.owners = _owners(model, spans, reached)
    return plan


def _owners(model: nn.Module, spans: dict[str, set[int]], reached: dict[int, set[int]]) -> dict[int, int]:
    """id(tensor) -> its stage: for a weight, the stage whose forward reads it (a weight read on two stages
    is an error); for a buffer or a weight no stage reads, the first stage its module runs on."""
    stages: dict[int, set[int]] = {}
    names: dict[int, str] = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        names.setdefault(id(tensor), name)
        stages.setdefault(id(tensor), set()).update(spans.get(name.rpartition(".")[0], set()))
    owners = {}
    for key, used in stages.items():
        read = reached.get(key, set())
        if len(read) > 1:
            raise Error(
                f"The weight {names[key]} is used on pipeline stages {sorted(read)}: each stage process computes "
                f"the gradients of its own stage's weights only, so a weight shared between stages (a tied "
                f"embedding and head, say) cannot run as stage processes. {RUN_IN_ONE_PROCESS}"
            )
        owners[key] = next(iter(read)) if read else min(used, default=0)
    return owners


def _weights_reached(result: Any) -> set[int]:
    """id() of every tensor with a gradient (a weight) that `result` is computed from (its autograd graph)."""
    found, seen = set(), set()
    todo = []
    for t in _leaves(result):
        if t.grad_fn is not None:
            todo.append(t.grad_fn)
        elif t.requires_grad:
            found.add(id(t))
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: the leaf its gradient goes to
        if variable is not None:
            found.add(id(variable))
        todo.extend(next_node for next_node, _ in node.next_functions)
    return found


def _leaves(output: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6, equal_nan=True)


def _check_only_boundaries_cross(
    model: nn.Module, args: tuple, kwargs: dict, plan: TracedStages, plain: Any
) -> dict[int, set[int]]:
    """Each stage, run alone on the traced tensor it receives, sends what the one-process forward had there.

    Returns id(weight) -> the stages whose forward reads it (from each stage's autograd graph: a weight
    read functionally, outside its module, counts too).
    """
    reached: dict[int, set[int]] = {}
    for stage in range(plan.num_stages):
        received = plan.sent[stage - 1] if stage else None
        last = stage == plan.num_stages - 1
        where = f"the boundary at {plan.boundaries[stage - 1]}" if stage else "its start"
        with running_stage(model, plan, stage, received), torch.enable_grad():
            try:
                result = model(*args, **kwargs)
            except _StageOutput as out:
                result = out.hidden
        for key in _weights_reached(result):
            reached.setdefault(key, set()).add(stage)
        if last:
            expected, got = _leaves(plain), _leaves(result)
            same = len(expected) == len(got) and all(_same(a, b) for a, b in zip(expected, got))
            what = "the model's outputs"
        else:
            same = isinstance(result, torch.Tensor) and _same(result, plan.sent[stage])
            what = f"the input of {plan.boundaries[stage]} (what it sends to stage {stage + 1})"
        if not same:
            raise Error(
                f"Pipeline stage {stage} (from {where}) computes {what} differently as a stage process than in one "
                f"process: it reads a tensor computed on an earlier stage other than the input of the module that "
                f"starts it (a skip connection across a block boundary), and under torchrun only that input crosses "
                f"from one stage process to the next. {RUN_IN_ONE_PROCESS}"
            )
    return reached


@contextlib.contextmanager
def running_stage(
    model: nn.Module, plan: TracedStages, stage: int, received: torch.Tensor | None
) -> Iterator[None]:
    """While active, `model`'s forward is stage `stage`'s part (see the module docstring)."""
    replaced: list[nn.Module] = []
    handles = []
    for path, (owner, zeros) in plan.placeholders.items():
        if owner < stage:
            module = model.get_submodule(path)
            calls = iter(range(1 << 30))

            def replay(*_args: Any, _zeros=zeros, _calls=calls, **_kwargs: Any) -> Any:
                value = _zeros[next(_calls) % len(_zeros)]
                return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value)

            module.forward = replay
            replaced.append(module)
    if stage and received is not None:
        done = [False]

        def take(_module, args):
            if not done[0]:
                done[0] = True
                return (received, *args[1:])
            return None

        handles.append(model.get_submodule(plan.boundaries[stage - 1]).register_forward_pre_hook(take))
    if stage < plan.num_stages - 1:

        def stop(_module, args):
            raise _StageOutput(args[0])

        handles.append(model.get_submodule(plan.boundaries[stage]).register_forward_pre_hook(stop))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module in replaced:
            del module.forward


class _StageForward(nn.Module):
    """The user's forward reduced to one stage, as `PipelineStage` calls it (received tensor, micro-batch).

    The wrapper is held without being registered: this module's own `parameters()` are empty, the
    stage's parameters are the user's, updated in place.
    """

    def __init__(self, wrapper, plan: TracedStages, stage: int):
        super().__init__()
        self.__dict__["wrapper"] = wrapper
        self.plan = plan
        self.stage = stage
        self.is_first = stage == 0
        self.is_last = stage == plan.num_stages - 1
        self.shared: dict[str, Any] = {}  # micro-batch values without a batch dimension

    def forward(self, *received: torch.Tensor, **micro: Any) -> torch.Tensor:
        micro = {**micro, **self.shared}
        model = self.wrapper._user_model
        with running_stage(model, self.plan, self.stage, received[0] if received else None):
            if self.is_last:
                return self.wrapper._training_loss(micro).float().reshape(1)
            try:
                self.wrapper._run_user_model(micro)
            except _StageOutput as out:
                return out.hidden
        raise Error(
            f"Pipeline stage {self.stage} of {type(model).__name__} never reached the next stage's module."
        )

    def message_examples(self, first: dict[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(what this stage receives, what it sends), shaped as the traced boundary inputs (static shapes)."""
        device = next(self.wrapper._user_model.parameters()).device

        def example(tensor: torch.Tensor) -> torch.Tensor:
            return torch.empty_like(tensor, device=device).requires_grad_(tensor.is_floating_point())

        received = example(self.plan.sent[self.stage - 1]) if self.stage else None
        return received, torch.empty(1, requires_grad=True) if self.is_last else example(
            self.plan.sent[self.stage]
        )


class PopTorchStages(StageRunner):
    """This process's stage of a PopTorch model's pipeline: the runtime's `StageRunner` (the runner
    `IPUTrainer`'s stage processes use) on the stages a trace found (`TracedStages`), GPipe over the GA
    micro-batches. The stage module replays earlier stages' modules as placeholders (`_StageForward`);
    each weight belongs to the stage whose forward reads it."""

    def __init__(
        self, wrapper, plan: TracedStages, stage: int, group: dist.ProcessGroup, n_microbatches: int
    ):
        self.plan = plan
        super().__init__(
            wrapper._user_model, _StageForward(wrapper, plan, stage), plan.owners, stage, plan.num_stages, group,
            n_microbatches, schedule="gpipe",
        )  # fmt: skip


def gather_stage_outputs(stages: PopTorchStages, processes, recorded: list, call) -> list:
    """Every replica's outputs in the runtime's [DI][R][GA] order, on every process, from the pipelines'
    last stages (the only ones that ran the model's end); `recorded` is this process's, `call` the
    wrapper's `HostCall`."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, recorded if stages.module.is_last else None)
    di, ga, r, _ = call.counts()
    pipelines = processes.layout.data_parallel
    pipeline = CallLayout(di, r // pipelines, ga)  # each pipeline's own replicas
    ends = [gathered[p * stages.num_stages + stages.num_stages - 1] for p in range(pipelines)]
    return [ends[p][pipeline.first_micro_batch(d, k) + g] for d in range(di) for p in range(pipelines)
            for k in range(pipeline.replication_factor) for g in range(ga)]  # fmt: skip
