"""Optimum Graphcore 0.7's PopTorch helpers, on optimum-ipu's `poptorch`.

- `PipelineMixin`: the mixin of a user's own pipelined model (`class MyModel(MyBase, PipelineMixin)`),
  whose `parallelize()` places layers with `poptorch.BeginBlock`; `ipu_config` attribute,
  `from_transformers` / `from_pretrained_transformers` / `from_model`, `deparallelize()` removing
  the blocks and hooks `parallelize()` added.
- `BertPipelineMixin`: that mixin with Optimum Graphcore's BERT placement (embeddings, then the encoder layers).
- `register(transformers_cls)`: makes `to_pipelined(model, ipu_config)` build such a class.
- `recomputation_checkpoint(module)`: checkpoints the module's outputs (`poptorch.recomputationCheckpoint`).
- `to_poptorch_dataloader(for_training)`: decorates a trainer method so the `torch.utils.data.DataLoader`
  it builds is a `poptorch.DataLoader` with the trainer's options.
- `get_poplar_executor(task, model, ipu_config, fp16)`: the model placed, cast and wrapped in
  `poptorch.inferenceModel` with the config's inference options; optimum-ipu adds `training=True`
  (and `optimizer=`) for `poptorch.trainingModel` with its training options.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import numpy as np
import torch
from torch import nn

import optimum_ipu.poptorch as poptorch
from optimum_ipu.configuration import IPUConfig, IPUConfigError

__all__ = [
    "BertPipelineMixin",
    "PipelineMixin",
    "get_poplar_executor",
    "pipelined_class_for",
    "recomputation_checkpoint",
    "register",
    "to_poptorch_dataloader",
]

_REGISTRY: dict[type, type] = {}


def register(transformers_cls: type | None = None):
    """Class decorator: `to_pipelined(model, ipu_config)` on a `transformers_cls` model builds this class.

    Without an argument, the registered class is the decorated class's first base other than `PipelineMixin`.
    """

    def wrapper(cls: type) -> type:
        original = transformers_cls
        if original is None:
            original = next((base for base in cls.__bases__ if base is not PipelineMixin), None)
            if original is None:
                raise ValueError(f"Was not able to find original transformers class for {cls}")
        _REGISTRY[original] = cls
        return cls

    return wrapper


def pipelined_class_for(model: nn.Module) -> type | None:
    """The class registered with `register` for `model`'s class, if any."""
    return _REGISTRY.get(type(model))


class PipelineMixin:
    """Mixin of a pipelined model: it carries an `ipu_config`, and `parallelize()` places its layers.

    A subclass overrides `parallelize()`: call `super().parallelize()` first, then annotate layers
    with `poptorch.BeginBlock(layer, "name", ipu_id=k)` and append the handles of any hooks it adds
    (e.g. `recomputation_checkpoint(layer)`) to `self._hooks`, which `deparallelize()` removes.
    """

    @classmethod
    def from_transformers(cls, model: nn.Module, ipu_config: IPUConfig):
        """A new `cls` built from `model.config`, with `model`'s weights and a copy of `ipu_config`."""
        pipelined = cls(copy.deepcopy(model.config))
        if getattr(model, "generation_config", None) is not None:
            pipelined.generation_config = copy.deepcopy(model.generation_config)
        pipelined.load_state_dict(model.state_dict())
        pipelined.ipu_config = copy.deepcopy(ipu_config)
        pipelined.training = model.training
        return pipelined

    @classmethod
    def from_pretrained_transformers(
        cls, model_name_or_path: str, ipu_config: IPUConfig, *model_args, **kwargs
    ):
        """`cls.from_pretrained(model_name_or_path, ...)` with a copy of `ipu_config` attached."""
        pipelined = cls.from_pretrained(model_name_or_path, *model_args, **kwargs)
        pipelined.ipu_config = copy.deepcopy(ipu_config)
        return pipelined

    @classmethod
    def from_model(cls, model: nn.Module):
        """A copy of `model` turned into `cls`, with a default `IPUConfig` (so `parallelize()` runs)."""
        clone = copy.deepcopy(model)
        clone.__class__ = cls
        clone.ipu_config = IPUConfig()
        return clone

    def _has_ipu_config_check(self) -> None:
        if getattr(self, "_ipu_config", None) is None:
            raise AttributeError("No IPUConfig was found. Please set the ipu_config attribute")

    @property
    def ipu_config(self) -> IPUConfig:
        """The model's `IPUConfig` (an error if none was set)."""
        self._has_ipu_config_check()
        return self._ipu_config

    @ipu_config.setter
    def ipu_config(self, value: IPUConfig) -> None:
        if not isinstance(value, IPUConfig):
            raise TypeError(f"ipu_config must be an instance of IPUConfig, but {type(value)} was provided")
        self._ipu_config = value

    def parallelize(self):
        """Start placing the model on IPUs (subclasses add their `BeginBlock`s after calling this)."""
        self._hooks = []
        self._has_ipu_config_check()
        return self

    def deparallelize(self):
        """Undo `parallelize()`: remove its hooks and every block annotation (call before `save_pretrained`)."""
        for handle in getattr(self, "_hooks", []):
            handle.remove()
        self._hooks = []
        for module in self.modules():
            if module is not self:
                poptorch.removeBlocks(module)
        return self

    def get_ipu_config(self) -> IPUConfig:
        """The model's `IPUConfig` (the same as the `ipu_config` attribute)."""
        return self.ipu_config

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameters of the model (only trainable ones, and without `nn.Embedding` weights, if asked)."""
        embedding = {f"{name}.weight" for name, m in self.named_modules() if isinstance(m, nn.Embedding)}
        return sum(
            p.numel()
            for name, p in self.named_parameters()
            if (p.requires_grad or not only_trainable) and not (exclude_embeddings and name in embedding)
        )


class BertPipelineMixin(PipelineMixin):
    """Optimum Graphcore's BERT placement, as a mixin for a user's own BERT class (the packed-BERT notebooks:
    `class PipelinedPackedBertForSequenceClassification(BertForSequenceClassification, BertPipelineMixin)`).

    `parallelize()` starts a block for the embeddings on IPU 0 and one per encoder layer on the IPU
    `get_layer_ipu` gives it under the config's `layers_per_ipu`, checkpointing every layer's output but the
    last when `recompute_checkpoint_every_layer` is set; the subclass then adds its head's block. The
    original also swapped in a fused-QKV attention and, with `embedding_serialization_factor` > 1, a
    serialized embedding: both compute the same values, so the layers stay as they are here.
    """

    def parallelize(self):
        from optimum_ipu.compat.modeling import get_layer_ipu

        super().parallelize()
        bert = self.bert
        layers = bert.encoder.layer
        bert.embeddings = poptorch.BeginBlock(bert.embeddings, "Embedding", ipu_id=0)
        layer_ipu = get_layer_ipu(self.ipu_config, len(layers))
        for index, (layer, ipu) in enumerate(zip(layers, layer_ipu)):
            if self.ipu_config.recompute_checkpoint_every_layer and index != len(layers) - 1:
                self._hooks.append(recomputation_checkpoint(layer))
            layers[index] = poptorch.BeginBlock(layer, f"Encoder{index}", ipu_id=ipu)
        return self


def recomputation_checkpoint(module: nn.Module) -> torch.utils.hooks.RemovableHandle:
    """Checkpoint `module`'s outputs (`poptorch.recomputationCheckpoint`): the handle removes the hook."""

    def checkpoint_outputs(module, inputs, outputs):
        if isinstance(outputs, torch.Tensor):
            return poptorch.recomputationCheckpoint(outputs)
        if isinstance(outputs, tuple):
            return tuple(
                poptorch.recomputationCheckpoint(y) if isinstance(y, torch.Tensor) else y for y in outputs
            )
        return None

    return module.register_forward_hook(checkpoint_outputs)


class _WorkerInit:
    """Seeds NumPy in each data-loader worker from the training seed (picklable, for worker processes)."""

    def __init__(self, seed: int):
        self.seed = seed

    def __call__(self, worker_id: int) -> None:
        np.random.seed((self.seed + worker_id) % np.iinfo(np.uint32).max)


def to_poptorch_dataloader(for_training: bool = False):
    """Decorate a trainer method so every `torch.utils.data.DataLoader(...)` it builds is a `poptorch.DataLoader`.

    The object the method is bound to provides the options (`self.opts` in training, `self.eval_opts`
    otherwise) and `self.args` (`dataloader_drop_last`, `dataloader_mode`, `seed`), as Optimum
    Graphcore's trainer did; training always drops an incomplete last combined batch. Only code that
    reads `torch.utils.data.DataLoader` at call time is redirected.
    """

    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            options = self.opts if for_training else self.eval_opts
            bound = {
                "drop_last": True if for_training else self.args.dataloader_drop_last,
                "mode": getattr(self.args, "dataloader_mode", poptorch.DataLoaderMode.Sync),
                "worker_init_fn": _WorkerInit(self.args.seed),
            }

            class _BoundDataLoader(poptorch.DataLoader):
                def __init__(self, dataset, *loader_args, **loader_kwargs):
                    super().__init__(options, dataset, *loader_args, **{**bound, **loader_kwargs})

            _BoundDataLoader.__name__ = _BoundDataLoader.__qualname__ = "DataLoader"
            original = torch.utils.data.DataLoader
            torch.utils.data.DataLoader = _BoundDataLoader
            try:
                return method(self, *args, **kwargs)
            finally:
                torch.utils.data.DataLoader = original

        return wrapper

    return decorate


def _load_config(ipu_config: IPUConfig | str | dict | None) -> IPUConfig:
    if isinstance(ipu_config, str):
        return IPUConfig.from_pretrained(ipu_config)
    if isinstance(ipu_config, dict):
        return IPUConfig.from_dict(ipu_config)
    if not isinstance(ipu_config, IPUConfig):
        raise ValueError(
            f"ipu_config must be an IPUConfig, string, or a dictionary, got {type(ipu_config).__name__}."
        )
    return ipu_config


def _placed(model: nn.Module, ipu_config: IPUConfig, kwargs: dict[str, Any], training: bool) -> nn.Module:
    """`model` placed by `parallelize()`: a registered or mixin class as the original did, else optimum-ipu's cut."""
    from optimum_ipu.compat.modeling import PipelinedModelView, to_pipelined

    if isinstance(model, PipelineMixin) and training:
        model.ipu_config = (
            ipu_config  # train the user's own module, so its optimizer's parameters are the ones run
        )
        placed = model
    else:
        placed = to_pipelined(model, ipu_config)
    placed.parallelize(**kwargs)
    return placed.pipelined.module if isinstance(placed, PipelinedModelView) else placed


def get_poplar_executor(
    task: str,
    model: nn.Module,
    ipu_config: IPUConfig | str | dict | None = None,
    fp16: bool = True,
    for_generation: bool = False,
    *,
    training: bool = False,
    optimizer: torch.optim.Optimizer | None = None,
) -> poptorch.PoplarExecutor:
    """`model` placed on its IPUs and wrapped for PopTorch with `ipu_config`'s options.

    As Optimum Graphcore 0.7 (inference): the config in `eval()` mode with one device iteration and
    one replica, `to_pipelined(model, ipu_config).parallelize(**inference_parallelize_kwargs)`, cast
    to fp16 unless `fp16=False`, `poptorch.inferenceModel(model.eval(), to_options(for_inference=True))`
    with sharded execution. `task` is not read (nor was it).

    optimum-ipu's addition, `training=True`: the config in `train()` mode,
    `parallelize(**parallelize_kwargs)`, and `poptorch.trainingModel(model.train(), to_options(),
    optimizer)` (PopTorch's SGD with lr 0.01 when `optimizer` is None). A `PipelineMixin` model is
    trained in place (the original copied it for inference, which it still does), so an optimizer
    built on `model.parameters()` updates the model you hold.
    """
    if for_generation:
        raise NotImplementedError(
            "get_poplar_executor(for_generation=True): on-device generation is not simulated; use the "
            "model's own generate() on CPU/GPU."
        )
    given = ipu_config
    ipu_config = _load_config(ipu_config)
    if training:
        ipu_config.train()
        parallelize_kwargs = ipu_config.parallelize_kwargs
    else:
        ipu_config.eval()
        parallelize_kwargs = ipu_config.inference_parallelize_kwargs
        ipu_config.inference_device_iterations = 1
        if not parallelize_kwargs.get("use_cond_encoder", False):
            ipu_config.inference_replication_factor = 1
    if not fp16:
        ipu_config.enable_half_partials = False
    try:
        placed = _placed(model, ipu_config, dict(parallelize_kwargs), training)
    except Exception as error:
        raise IPUConfigError(
            "The model and ipu_config seem to be incompatible, please try a different IPU config or customize it "
            f"for the model. The config provided is '{given}'\n{error}"
        ) from error
    if fp16:
        placed.half()
    if training:
        return poptorch.trainingModel(placed.train(), ipu_config.to_options(), optimizer=optimizer)
    opts = ipu_config.to_options(for_inference=True)
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    return poptorch.inferenceModel(placed.eval(), opts)
