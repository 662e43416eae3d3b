"""A replica's pipeline stages as processes, run with `torch.distributed.pipelining`.

On the IPU, the IPUs of a replica hold consecutive stages of the model and work at the same time on
different micro-batches of an accumulation. `PipelineStages` gives one process one stage of that
pipeline: the processes of a stage group (one per IPU of the replica) run the GA micro-batches of a
weight update through torch's `PipelineStage` and `ScheduleGPipe` / `Schedule1F1B`, with
`n_microbatches = gradient_accumulation_steps`.

How a stage runs its part of the model, without re-implementing any architecture's forward: every
process holds the whole model and every micro-batch, and each stage calls the model's own forward
with three temporary changes (undone after each call):

- the layer `nn.ModuleList` holds only this stage's layers (`StagePlan`: layers on IPU k are stage k);
- on every stage but the first, the embeddings module returns the hidden state received from the
  previous stage instead of embedding the inputs (the model then builds its attention mask from the
  micro-batch's `attention_mask` as usual);
- on every stage but the last, the forward stops right after the stage's last layer: its raw output
  (before any final norm or pooler) is what the stage sends on, in the model's dtype (fp16 for an
  fp16 model).

The last stage runs the heads and the model's own loss from the micro-batch's labels. So only hidden
states (forward) and their gradients (backward) cross between processes; the attention mask, the
labels and any other input are read by each stage from its own copy of the micro-batch.

Supported: the encoder families with a single embeddings module and their task heads on the last IPU
(BERT, RoBERTa, DistilBERT with question answering, sequence or token classification; ViT image
classification). A head tied to the word embedding (masked LM) sits on IPU 0 next to the embedding
and GPT-2 has two embedding modules: both are a clear `ValueError`; run them in one process.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from optimum_ipu.runtime.distributed import hold_process_groups
from optimum_ipu.runtime.loss_scaling import scaled_loss

SUPPORTED_MODEL_TYPES = ("bert", "roberta", "distilbert", "vit")
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}

LossFn = Callable[[nn.Module, dict[str, Any]], torch.Tensor]


def model_loss(model: nn.Module, micro_batch: dict[str, Any]) -> torch.Tensor:
    """The model's own loss for `micro_batch` (computed from its labels)."""
    outputs = model(**micro_batch)
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs[0]
    if loss is None:
        raise ValueError(
            f"{type(model).__name__} returned no loss: the micro-batch has no labels (keys: {sorted(micro_batch)})."
        )
    return loss


class _StageOutput(Exception):  # noqa: N818 - control flow, not an error
    """Raised by a hook after this stage's last module: carries its output out of the model's forward."""

    def __init__(self, hidden: torch.Tensor):
        super().__init__()
        self.hidden = hidden


def _first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        return next(iter(output.values()))
    return output[0]


def _raise_output(_module: nn.Module, _args: Any, output: Any) -> None:
    raise _StageOutput(_first_tensor(output))


def _set_submodule(root: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, name, module)


def check_supported(pipelined) -> None:
    """Raise a `ValueError` naming the limitation when `pipelined` cannot run as stage processes."""
    model = pipelined.module
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    plan = pipelined.plan
    last = plan.ipus_per_replica - 1
    fix = "Run it in one process (the single-process simulation pipelines every model)."
    if model_type not in SUPPORTED_MODEL_TYPES or len(pipelined.spec.embeddings) != 1:
        raise ValueError(
            f"Pipeline stages as processes support the encoder families {', '.join(SUPPORTED_MODEL_TYPES)} "
            f"(one embeddings module, task heads on the last IPU), not {type(model).__name__} "
            f"(model_type {model_type!r}). {fix}"
        )
    on_first = [b.name for b in plan.blocks if b.kind == "head" and b.ipu != last]
    if on_first:
        raise ValueError(
            f"{type(model).__name__} has a head tied to the word embedding ({', '.join(on_first)}) placed on IPU 0 "
            f"beside it: its stage would need the last layer's output back on the first stage, which a "
            f"pipeline of stage processes does not do. {fix}"
        )
    counts = plan.layers_per_ipu()
    empty = [k for k in range(1, last) if counts[k] == 0]
    if empty:
        raise ValueError(
            f"layers_per_ipu={counts} leaves IPU {empty[0]} of the pipeline without a layer; every IPU between "
            "the first and the last needs one to run as a stage process."
        )


class _StageModule(nn.Module):
    """The model's own forward, reduced to one stage (see the module docstring).

    Called by `PipelineStage` with the received hidden state (none on the first stage) and the
    micro-batch as keyword arguments. The model is held without being registered, so this module's
    own `parameters()` are empty: the stage's parameters are the model's, updated in place.
    """

    def __init__(self, pipelined, stage: int, loss_fn: LossFn):
        super().__init__()
        plan = pipelined.plan
        model = pipelined.module
        self.__dict__["model"] = model
        self.stage = stage
        self.is_first = stage == 0
        self.is_last = stage == plan.ipus_per_replica - 1
        self.loss_fn = loss_fn
        self.shared: dict[str, Any] = {}  # micro-batch values without a batch dimension
        self.hidden_dtype: torch.dtype | None = None

        self.embeddings_path = pipelined.path_of(pipelined.spec.embeddings[0])
        self.layers_path = pipelined.path_of(pipelined.spec.layers)
        layers = model.get_submodule(self.layers_path)
        mine = [layers[i] for i, b in enumerate(plan.layer_blocks) if b.ipu == stage]
        self.__dict__["stage_layers"] = nn.ModuleList(mine)
        self.__dict__["stop_after"] = mine[-1] if mine else model.get_submodule(self.embeddings_path)

    @property
    def embeddings(self) -> nn.Module:
        return self.model.get_submodule(self.embeddings_path)

    @contextlib.contextmanager
    def _as_stage(self, received: torch.Tensor | None) -> Iterator[None]:
        model = self.model
        all_layers = model.get_submodule(self.layers_path)
        _set_submodule(model, self.layers_path, self.stage_layers)
        embeddings = self.embeddings
        patched = received is not None
        if patched:
            previous = embeddings.__dict__.get("forward")
            embeddings.forward = lambda *_args, **_kwargs: received
        hook = None if self.is_last else self.stop_after.register_forward_hook(_raise_output)
        try:
            yield
        finally:
            if hook is not None:
                hook.remove()
            if patched:
                if previous is None:
                    del embeddings.forward
                else:
                    embeddings.forward = previous
            _set_submodule(model, self.layers_path, all_layers)

    def hidden_like(self, micro_batch: dict[str, Any]) -> torch.Tensor:
        """An empty tensor shaped as the hidden state between stages (the embeddings' output).

        The probe draws no random number from the training streams (embedding dropout is forked off).
        """
        device = next(self.model.parameters()).device
        forked = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
        with forked, torch.no_grad(), self._as_stage(None):
            hook = self.embeddings.register_forward_hook(_raise_output)
            try:
                self.model(**micro_batch, **self.shared)
            except _StageOutput as out:
                return torch.empty_like(out.hidden)
            finally:
                hook.remove()
        raise RuntimeError(f"{type(self.model).__name__} never called its embeddings {self.embeddings_path}.")

    def message_examples(self, first: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(what this stage receives, what it sends) for micro-batches like `first`: the hidden state, and
        the one-element loss on the last stage."""
        hidden = self.hidden_like(first)
        self.hidden_dtype = hidden.dtype
        example = hidden.requires_grad_(True)
        return example, torch.empty(1, requires_grad=True) if self.is_last else example

    def forward(self, *received: torch.Tensor, **micro_batch: Any) -> torch.Tensor:
        micro_batch = {**micro_batch, **self.shared}
        with self._as_stage(received[0] if received else None):
            if self.is_last:
                return self.loss_fn(self.model, micro_batch).float().reshape(1)
            try:
                self.model(**micro_batch)
            except _StageOutput as out:
                hidden = out.hidden
                return hidden if hidden.dtype == self.hidden_dtype else hidden.to(self.hidden_dtype)
        raise RuntimeError(f"stage {self.stage} of {type(self.model).__name__} never ran its last module.")


class StageRunner:
    """This process's stage of a replica's pipeline, run with `torch.distributed.pipelining`: the one
    runner both front ends use, whatever cuts the model's forward into stages.

    Every process of the stage group holds the whole model and is given every micro-batch; it computes,
    and accumulates gradients for, its own stage's parameters only. How the forward is cut is the
    stage module's: `_StageModule` here (a transformers encoder's layer list, for `IPUTrainer`), or
    PopTorch's traced blocks (`poptorch._stages`). A stage module is an `nn.Module` called by
    `PipelineStage` with the received tensor (none on the first stage) and the micro-batch as keyword
    arguments, returning what it sends (the one-element loss on the last stage), with the attributes
    `is_last` and `shared` (micro-batch values without a batch dimension), and the method
    `message_examples(first)` (what it receives and sends, shaped for micro-batches like `first`).
    The runner scales the last stage's loss (`loss_scaling.scaled_loss`).

    Args:
        model: the whole model; its parameters are updated in place, and each process keeps all of them.
        module: this stage's stage module.
        owners: id(parameter or buffer) -> the stage that computes (and updates) it.
        stage: this process's stage, its rank in `group`.
        num_stages: stages in the pipeline.
        group: the process group of this replica's stages (None: the default group).
        n_microbatches: micro-batches per run (the gradient accumulation steps).
        schedule: "gpipe" (all forwards, then all backwards) or "1f1b" (needs n_microbatches >=
            num_stages); both give the same gradients.
    """

    def __init__(
        self,
        model: nn.Module,
        module: nn.Module,
        owners: dict[int, int],
        stage: int,
        num_stages: int,
        group: dist.ProcessGroup | None,
        n_microbatches: int,
        schedule: str = "gpipe",
    ):
        if dist.get_world_size(group) != num_stages or dist.get_rank(group) != stage:
            raise ValueError(
                f"stage {stage} of {num_stages} must be rank {stage} of a group of {num_stages} processes, "
                f"got rank {dist.get_rank(group)} of {dist.get_world_size(group)}."
            )
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}.")
        if schedule == "1f1b" and n_microbatches < num_stages:
            raise ValueError(
                f"the 1F1B schedule needs n_microbatches >= {num_stages} stages, got {n_microbatches}."
            )
        self.model = model
        self.module = module
        self.stage = stage
        self.num_stages = num_stages
        self.loss_scale = 1.0  # of the run in progress (`run`)
        self.group = group
        self.n_microbatches = n_microbatches
        self.schedule_name = schedule
        self._owner = owners
        self._params = [p for p in model.parameters() if owners.get(id(p)) == stage]
        first = next(model.parameters(), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self._signature: tuple | None = None
        self._schedule = None
        hold_process_groups(self)

    def release_process_groups(self) -> None:
        """Drop the group and the torch stage and schedule built on it (at exit: `runtime.distributed`)."""
        self.group = None
        self._schedule, self._signature = None, None

    # -- ownership ----------------------------------------------------------------------------

    def owns(self, param: torch.Tensor) -> bool:
        """Whether this stage computes `param`'s gradient and updates it."""
        return self._owner.get(id(param)) == self.stage

    def owned_parameters(self) -> list[nn.Parameter]:
        """The parameters this stage computes gradients for (and updates)."""
        return list(self._params)

    # -- running ------------------------------------------------------------------------------

    def _build(self, first: dict[str, torch.Tensor]) -> None:
        """A `PipelineStage` and a schedule for micro-batches shaped like `first` (static shapes)."""
        received, sent = self.module.message_examples(first)
        pipeline_stage = PipelineStage(
            self.module,
            self.stage,
            self.num_stages,
            self.device,
            input_args=() if self.stage == 0 else (received,),
            output_args=sent,
            group=self.group,
        )
        self._schedule = SCHEDULES[self.schedule_name](
            pipeline_stage, self.n_microbatches, loss_fn=self._scaled_loss, scale_grads=False
        )

    def _scaled_loss(self, output: torch.Tensor, _target: torch.Tensor) -> torch.Tensor:
        """What the last stage backpropagates for one micro-batch: its loss x the loss scale, in fp32."""
        return scaled_loss(output.sum(), self.loss_scale)

    def run(self, micro_batches: Sequence[dict[str, Any]], loss_scale: float = 1.0) -> torch.Tensor:
        """Forward and backward of every micro-batch through the pipeline, stages working concurrently.

        Each micro-batch's loss x `loss_scale` (in fp32) is backpropagated on its own, as
        `loss_scaler.scale_loss(loss).backward()` does in one process: gradients are summed over the
        micro-batches, not averaged, into this stage's parameters' `.grad` (post-accumulate-grad hooks
        fire, so `GradientAccumulator` catches fp16 gradients). Every process of the group must call
        it with the same micro-batches.

        Returns:
            The unscaled loss of each micro-batch, fp32, shape [n_microbatches], on every rank of the
            group (broadcast from the last stage).
        """
        if len(micro_batches) != self.n_microbatches:
            raise ValueError(f"expected {self.n_microbatches} micro-batches, got {len(micro_batches)}.")
        batched = [k for k, v in micro_batches[0].items() if isinstance(v, torch.Tensor) and v.dim() > 0]
        signature = tuple((k, tuple(micro_batches[0][k].shape), micro_batches[0][k].dtype) for k in batched)
        for mb in micro_batches[1:]:
            if tuple((k, tuple(mb[k].shape), mb[k].dtype) for k in batched) != signature:
                raise ValueError("the micro-batches of a pipeline run must all have the same shapes.")
        self.module.shared = {k: v for k, v in micro_batches[0].items() if k not in batched}
        if signature != self._signature:
            self._build({k: micro_batches[0][k] for k in batched})
            self._signature = signature
        # The schedule splits its inputs back into micro-batches along dim 0, in order.
        inputs = {k: torch.cat([mb[k] for mb in micro_batches]).to(self.device) for k in batched}
        self.loss_scale = float(loss_scale)
        self.model.train()
        target = torch.zeros(self.n_microbatches, device=self.device)
        try:
            output = self._schedule.step(target=target, **inputs)
        finally:
            self.module.shared = {}
        losses = output.detach().float().reshape(-1) if self.stage == self.num_stages - 1 else None
        if losses is None:
            losses = torch.empty(self.n_microbatches, device=self.device)
        dist.broadcast(losses, group_src=self.num_stages - 1, group=self.group)
        return losses.cpu()

    # -- weights ------------------------------------------------------------------------------

    @torch.no_grad()
    def broadcast_weights(self) -> None:
        """Copy every parameter and buffer from the stage that owns it to every rank of the group.

        After it, each process holds the whole up-to-date model (to save it or evaluate with it).
        Tensors are sent flattened, one collective per owning stage, dtype and device.
        """
        model = self.model
        tensors = list(dict.fromkeys([*model.parameters(), *model.buffers()]))
        groups: dict[tuple[int, torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in tensors:
            groups.setdefault((self._owner[id(t)], t.dtype, t.device), []).append(t)
        for (owner, dtype, device), members in groups.items():
            mine = owner == self.stage
            parts = _broadcast_flat(members if mine else None, [t.shape for t in members], dtype, device, owner,
                                    self.group)  # fmt: skip
            if not mine:
                for t, part in zip(members, parts):
                    t.copy_(part)

    def broadcast_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        """Copy each parameter's optimizer state from the stage that owns it to every rank of the group.

        Each stage's optimizer only updates (and keeps moments for) its own parameters; before rank 0
        writes `optimizer.pt` it must hold every stage's, so the checkpoint resumes in any layout.
        The layout of the state (keys in order, non-tensor values, each tensor's shape and dtype) goes
        as one small object; the tensors go flattened, one collective per owning stage and dtype
        (pickling hundreds of MB of moments would cost seconds at every save).
        """
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper -> the optimizer
        params = list(dict.fromkeys(self.model.parameters()))
        for owner in range(self.num_stages):
            mine = owner == self.stage
            layout: list[dict | None] = [None]
            if mine:
                layout = [{i: {k: _TensorSpec(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v
                               for k, v in optimizer.state[p].items()}
                           for i, p in enumerate(params) if self._owner[id(p)] == owner and p in optimizer.state}]  # fmt: skip
            dist.broadcast_object_list(layout, group_src=owner, group=self.group)
            states = layout[0]
            tensors = [(i, k, spec) for i, state in states.items() for k, spec in state.items()
                       if isinstance(spec, _TensorSpec)]  # fmt: skip
            for dtype in dict.fromkeys(spec.dtype for *_, spec in tensors):
                members = [(i, k, spec) for i, k, spec in tensors if spec.dtype == dtype]
                sent = [optimizer.state[params[i]][k] for i, k, _ in members] if mine else None
                parts = _broadcast_flat(sent, [spec.shape for *_, spec in members], dtype, self.device, owner,
                                        self.group)  # fmt: skip
                if not mine:
                    for (i, k, _), part in zip(members, parts):
                        states[i][k] = part.to(params[i].device, copy=True)  # its own storage
            if not mine:
                for i, state in states.items():  # keys in the owner's order
                    optimizer.state[params[i]] = state


class PipelineStages(StageRunner):
    """`IPUTrainer`'s stage processes: the runner on a `PipelinedModel`, whose stage plan (layers on IPU k
    run on stage k) cuts the model's own forward (`_StageModule`).

    Args:
        pipelined: the model's `PipelinedModel`, already parallelized (or never): its `StagePlan` gives
            the stages, and the parameters are read here, so build the stages after `parallelize()`.
        stage, num_stages, group, n_microbatches, schedule: as `StageRunner`'s; `num_stages` must equal
            the plan's `ipus_per_replica`.
        loss_fn: `(model, micro_batch) -> loss` run on the last stage (the model is already reduced to
            that stage); defaults to the model's own loss from the micro-batch's labels.
    """

    def __init__(
        self,
        pipelined,
        stage: int,
        num_stages: int,
        group: dist.ProcessGroup | None,
        n_microbatches: int,
        loss_fn: LossFn | None = None,
        schedule: str = "gpipe",
    ):
        check_supported(pipelined)
        plan = pipelined.plan
        if num_stages != plan.ipus_per_replica:
            raise ValueError(
                f"num_stages={num_stages} but the stage plan has {plan.ipus_per_replica} IPUs per replica."
            )
        self.pipelined = pipelined
        super().__init__(
            pipelined.module, _StageModule(pipelined, stage, loss_fn or model_loss), _owners(pipelined), stage,
            num_stages, group, n_microbatches, schedule,
        )  # fmt: skip


def _owners(pipelined) -> dict[int, int]:
    """id(tensor) -> the stage that computes it, for every parameter and buffer of the model."""
    plan = pipelined.plan
    owners: dict[int, int] = {}
    named = list(pipelined.module.named_parameters()) + list(pipelined.module.named_buffers())
    for name, tensor in named:
        ipu = plan.ipu_of_module(name.rpartition(".")[0])
        owners.setdefault(id(tensor), 0 if ipu is None else ipu)
    return owners


class _TensorSpec(NamedTuple):
    """Stands for a tensor of the optimizer state in the layout object; the data follows flattened."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def _broadcast_flat(tensors: Sequence[torch.Tensor] | None, shapes: Sequence[Sequence[int]], dtype: torch.dtype,
                    device: torch.device, src: int, group: dist.ProcessGroup | None) -> list[torch.Tensor]:  # fmt: skip
    """Send `tensors` (given on rank `src` of `group`, None elsewhere) to every rank in one message.

    Returns views of the received buffer shaped as `shapes`, on every rank.
    """
    sizes = [math.prod(shape) for shape in shapes]
    if tensors is not None:
        flat = torch.cat([t.detach().reshape(-1).to(device) for t in tensors])
    else:
        flat = torch.empty(sum(sizes), dtype=dtype, device=device)
    dist.broadcast(flat, group_src=src, group=group)
    return [part.view(shape) for part, shape in zip(flat.split(sizes), shapes)]
