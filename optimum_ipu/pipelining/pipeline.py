"""`to_pipelined`: place a model's blocks on the IPUs of a pipeline, reversibly.

A pipelined model is the same `nn.Module` with a stage plan. `parallelize()` applies what the plan
and the IPU config ask for (serialized embedding and tied head, a recomputation checkpoint after
every layer, each IPU's blocks on a torch device) and `deparallelize()` undoes each change exactly:
the original module objects come back, and no state_dict key ever changes.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from optimum_ipu.pipelining.serialized import SerializedEmbedding, SerializedLinear
from optimum_ipu.pipelining.spec import CutSpec, base_model_path, generic_spec, spec_for
from optimum_ipu.pipelining.stage_plan import StagePlan, build_stage_plan
from optimum_ipu.runtime.batches import move_to

logger = logging.getLogger(__name__)


class UnsupportedModelError(ValueError):
    """The model has no registered cut spec and `force` was not set."""


def _set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, module)


def default_ipu_devices(ipus_per_replica: int) -> list[torch.device]:
    """Torch device standing in for each IPU: `cuda:(k mod n)` when GPUs exist, else the CPU."""
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return [torch.device(f"cuda:{k % count}") for k in range(ipus_per_replica)]
    return [torch.device("cpu")] * ipus_per_replica


def _checkpointed(module: nn.Module, forward: Callable) -> Callable:
    """`forward` with a recomputation checkpoint: activations inside are recomputed in backward."""

    def run(*args, **kwargs):
        if module.training and torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)

    return run


# The PipelinedModel whose layout a module carries now: one module, one layout at a time.
_LAID_OUT_BY: weakref.WeakKeyDictionary[nn.Module, weakref.ref] = weakref.WeakKeyDictionary()


class PipelinedModel:
    """A model, its stage plan, and the reversible changes that lay it out on IPUs.

    Calling the handle calls the model. The handle holds no parameters of its own: `module` is the
    user's model, unchanged in class and in state_dict keys.

    Args:
        model: a transformers (or plain PyTorch) model.
        ipu_config: the `IPUConfig`; its current mode (`train()` / `eval()`) picks the values used.
        spec: where the model's embeddings and layers live.
    """

    def __init__(self, model: nn.Module, ipu_config, spec: CutSpec):
        self.module = model
        self.ipu_config = ipu_config
        self.spec = spec
        self.plan: StagePlan = self._build_plan()
        self._undo: list[Callable[[], None]] = []
        self._laid_out = False

    def _build_plan(self) -> StagePlan:
        return build_stage_plan(
            self.module, self.spec, self.ipu_config.layers_per_ipu, self.ipu_config.ipus_per_replica
        )

    @property
    def is_parallelized(self) -> bool:
        """Whether the module carries this pipelined model's layout now (another one may have taken it over)."""
        return self._laid_out

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # -- applying and undoing -------------------------------------------------------------------

    def parallelize(self, devices: list[torch.device] | None = None) -> PipelinedModel:
        """Apply the plan for the IPU config's current mode; a no-op plan change re-applies cleanly."""
        if self.is_parallelized:
            self.deparallelize()
        self._take_over_module()
        self.plan = self._build_plan()
        logger.info("\n%s", self.plan.allocation_table())
        self._serialize_embedding()
        if self.ipu_config.recompute_checkpoint_every_layer:
            self._add_recompute_checkpoints()
        self._place_on_devices(devices or default_ipu_devices(self.plan.ipus_per_replica))
        self._laid_out = True
        return self

    def deparallelize(self) -> PipelinedModel:
        """Undo `parallelize()` in reverse order, restoring the original module objects."""
        while self._undo:
            self._undo.pop()()
        self._laid_out = False
        return self

    def _take_over_module(self) -> None:
        """Undo the layout another pipelined model gave this module (a model an IPUTrainer trained, then
        handed to `pipeline()` with its own IPU config): layouts do not stack. The other one lays the
        model out again when it is used next (IPUTrainer does, at each training or evaluation call)."""
        owner = _LAID_OUT_BY.get(self.module)
        other = owner() if owner is not None else None
        if other is not None and other is not self and other.is_parallelized:
            logger.info("The model carried another IPU layout (an IPUTrainer's or a pipeline's); undoing it first.")
            other.deparallelize()
        _LAID_OUT_BY[self.module] = weakref.ref(self)

    def path_of(self, spec_path: str) -> str:
        """The dotted path in `module` of a path the cut spec gives relative to the base model."""
        return ".".join(p for p in (base_model_path(self.module), spec_path) if p)

    def _serialization_factor(self) -> int:
        splits = self.ipu_config.serialized_embedding_splits_per_ipu
        if splits:
            return int(sum(splits))
        return int(self.ipu_config.embedding_serialization_factor or 1)

    def _serialize_embedding(self) -> None:
        factor = self._serialization_factor()
        if factor > 1 and self.spec.word_embedding is not None:
            path = self.path_of(self.spec.word_embedding)
            table = self.module.get_submodule(path)
            if not isinstance(table, nn.Embedding):
                raise TypeError(f"{path} is a {type(table).__name__}, expected nn.Embedding to serialize.")
            weight = table.weight
            for module_path, module in list(self.module.named_modules(remove_duplicate=False)):
                # Every module reading the table: the embedding itself, the copies an encoder-decoder
                # model's encoder and decoder hold (sharing the weight), and a head tied to it, which is
                # as large as the table and serialized the same way.
                if isinstance(module, nn.Embedding) and module.weight is weight:
                    self._replace(module_path, SerializedEmbedding(module, factor))
                elif isinstance(module, nn.Linear) and module.weight is weight:
                    self._replace(module_path, SerializedLinear(module, factor))
        self._serialize_projection()

    def _serialize_projection(self) -> None:
        """An output projection not tied to the word embedding (MT5's LM head), serialized by
        `projection_serialization_factor` or `serialized_projection_splits_per_ipu` (their sum)."""
        splits = getattr(self.ipu_config, "serialized_projection_splits_per_ipu", None)
        factor = (
            int(sum(splits))
            if splits
            else int(getattr(self.ipu_config, "projection_serialization_factor", 1) or 1)
        )
        path = untied_output_projection(self.module)
        if factor > 1 and path is not None:
            self._replace(path, SerializedLinear(self.module.get_submodule(path), factor))

    def _replace(self, path: str, module: nn.Module) -> None:
        original = self.module.get_submodule(path)
        _set_submodule(self.module, path, module)
        self._undo.append(lambda: _set_submodule(self.module, path, original))

    def _add_recompute_checkpoints(self) -> None:
        # A KV cache would be written a second time when a layer is recomputed in backward. The stacks
        # of an encoder-decoder model (T5's) hold configs of their own.
        configs = {id(c): c for m in self.module.modules() if (c := getattr(m, "config", None)) is not None}
        for config in configs.values():
            if getattr(config, "use_cache", False) is True:
                config.use_cache = False
                self._undo.append(lambda c=config: setattr(c, "use_cache", True))
        for block in self.plan.layer_blocks:
            layer = self.module.get_submodule(block.modules[0])
            layer.forward = _checkpointed(layer, layer.forward)
            self._undo.append(lambda m=layer: m.__dict__.pop("forward", None))

    def _place_on_devices(self, devices: list[torch.device]) -> None:
        if len(devices) < self.plan.ipus_per_replica:
            raise ValueError(
                f"{len(devices)} devices given for {self.plan.ipus_per_replica} IPUs per replica."
            )
        if len(set(devices)) == 1:
            # Every IPU maps to the same torch device: move once, no per-block hooks on the hot path.
            self.module.to(devices[0])
            return
        for block in self.plan.blocks:
            device = devices[block.ipu]
            for path in block.modules:
                module = self.module.get_submodule(path)
                module.to(device)
                handle = module.register_forward_pre_hook(
                    lambda _m, args, kwargs, d=device: (move_to(args, d), move_to(kwargs, d)),
                    with_kwargs=True,
                )
                self._undo.append(handle.remove)
        # Parameters held directly by a module no block owns (Wav2Vec2's `masked_spec_embed`, a
        # weighted layer sum's `layer_weights`) live with the first IPU's blocks.
        for name, param in self.module.named_parameters():
            if self.plan.ipu_of_module(name.rpartition(".")[0]) is None:
                param.data = param.data.to(devices[0])


def untied_output_projection(model: nn.Module) -> str | None:
    """Path of `model`'s output projection (`get_output_embeddings()`) when it is an `nn.Linear` whose
    weight is not shared with an input embedding (MT5's LM head); None otherwise."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, nn.Linear) or type(head) is not nn.Linear:
        return None
    if any(isinstance(m, nn.Embedding) and m.weight is head.weight for m in model.modules()):
        return None
    return next((path for path, m in model.named_modules() if m is head), None)


def to_pipelined(
    model: nn.Module, ipu_config, force: bool = False, *, force_to_pipelined: bool | None = None
) -> PipelinedModel:
    """Wrap `model` in a `PipelinedModel` for `ipu_config` (nothing is changed until `parallelize()`).

    The signature is Optimum Graphcore's `to_pipelined(model, ipu_config, force=False)`; that one
    returns the model's view (`optimum.graphcore.modeling_utils`), this one the `PipelinedModel`.

    Args:
        model: the model to lay out. A model whose class defines `parallelize()` and `deparallelize()`
            (Optimum Graphcore's `PipelineMixin`) places itself: a `SelfPlacedModel` runs its blocks
            where its `BeginBlock`s put them.
        ipu_config: an `IPUConfig`.
        force: for an architecture without a registered cut spec, guess one from the module tree
            (the largest `nn.ModuleList` is the layer list) instead of failing.
        force_to_pipelined: the earlier name of `force` (IPUTrainer's argument keeps this name, as
            Optimum Graphcore's does); it still acts, with a warning.
    """
    if force_to_pipelined is not None:
        warnings.warn(
            "to_pipelined(force_to_pipelined=...) is now to_pipelined(force=...), Optimum Graphcore's name; "
            "the old keyword still acts.",
            FutureWarning,
            stacklevel=2,
        )
        force = force or force_to_pipelined
    # Imported here: SelfPlacedModel subclasses PipelinedModel.
    from optimum_ipu.pipelining.self_placed import SelfPlacedModel, places_itself

    if places_itself(model):
        return SelfPlacedModel(model, ipu_config)
    spec = spec_for(model)
    if spec is None:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        if not force:
            from optimum_ipu.pipelining.spec import CUT_SPECS

            raise UnsupportedModelError(
                f"No pipelined version of {type(model).__name__} (model_type {model_type!r}); supported: "
                f"{', '.join(sorted(CUT_SPECS))}. Pass force=True (IPUTrainer: force_to_pipelined=True) to place it with the generic "
                "cut (largest nn.ModuleList = layers, embeddings on IPU 0, the rest on the last IPU)."
            )
        spec = generic_spec(model)
        logger.warning("Placing %s with the generic cut: layers at %r.", type(model).__name__, spec.layers)
    return PipelinedModel(model, ipu_config, spec)
