"""`optimum.graphcore.modeling_utils` on optimum-ipu: `to_pipelined`, `get_layer_ipu`, `Pipelined*` classes.

Optimum Graphcore's `to_pipelined(model, ipu_config)` returned the model itself, turned into a
pipelined subclass, so notebooks call model methods on the result:
`model = to_pipelined(model, ipu_config).parallelize().half()`. Here a pipelined model is a
handle around the unchanged module (`optimum_ipu.pipelining.PipelinedModel`); the view returned by
this `to_pipelined` keeps the old call pattern by passing every other attribute to the module.
"""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any

from torch import nn

from optimum_ipu._once import warn_once
from optimum_ipu.pipelining import PipelinedModel
from optimum_ipu.pipelining import to_pipelined as _to_pipelined
from optimum_ipu.pipelining.placement import ipu_of_each_layer

__all__ = ["PipelinedModelView", "get_layer_ipu", "to_pipelined"]

logger = logging.getLogger(__name__)


class PipelinedModelView:
    """What Optimum Graphcore's `to_pipelined` returned: the model, plus `parallelize()`/`deparallelize()`.

    Calling the view calls the model; any other attribute (`eval`, `half`, `config`,
    `save_pretrained`, ...) is the model's. `parallelize()` and `deparallelize()` return the view, so
    they chain as before. The underlying `PipelinedModel` is `view.pipelined`.
    """

    def __init__(self, pipelined: PipelinedModel):
        object.__setattr__(self, "pipelined", pipelined)

    @property
    def ipu_config(self):
        return self.pipelined.ipu_config

    def parallelize(self, **kwargs: Any) -> PipelinedModelView:
        """Lay the model out on its IPUs; the original's model-specific keywords have no effect here."""
        if kwargs:
            logger.warning(
                "parallelize(%s): these options of Optimum Graphcore's hand-written pipelined models have no "
                "effect on the simulated IPU; the IPU config decides the layout.", ", ".join(sorted(kwargs))
            )  # fmt: skip
        self.pipelined.parallelize()
        return self

    def deparallelize(self) -> PipelinedModelView:
        """Undo `parallelize()`, giving back the plain transformers modules (without the BeginBlocks a
        PopTorch wrapper put on them: `_poptorch_module`)."""
        from optimum_ipu.poptorch import removeBlocks  # compat sits above poptorch: called late

        self.pipelined.deparallelize()
        removeBlocks(self.pipelined.module)
        return self

    def __call__(self, *args, **kwargs):
        return self.pipelined.module(*args, **kwargs)

    def _poptorch_module(self) -> nn.Module:
        """The module `poptorch.trainingModel(view)` / `inferenceModel(view)` wrap (Optimum Graphcore's
        inference notebooks wrap the view itself): once parallelized, its blocks start with PopTorch's
        `BeginBlock` on their IPUs, as Optimum Graphcore's `parallelize()` annotated them, so the compile
        sees the layout the IPU config gives."""
        module = self.pipelined.module
        from optimum_ipu.poptorch import BeginBlock, removeBlocks  # compat sits above poptorch: called late

        removeBlocks(module)
        if self.pipelined.is_parallelized:
            for block in self.pipelined.plan.blocks:
                BeginBlock(module.get_submodule(block.modules[0]), block.name, ipu_id=block.ipu)
        return module

    def __getattr__(self, name: str):
        value = getattr(self.pipelined.module, name)
        if not callable(value) or getattr(value, "__self__", None) is not self.pipelined.module:
            return value

        @functools.wraps(value)
        def chained(*args: Any, **kwargs: Any) -> Any:
            """The module's method; where it returns the module (`eval`, `half`, `to`, ...) the view
            comes back instead, so `to_pipelined(...).half().parallelize()` chains as in the original."""
            result = value(*args, **kwargs)
            return self if result is self.pipelined.module else result

        return chained

    def detachFromDevice(self) -> None:
        """Optimum Graphcore's generation models freed their compiled encoder and decoder here. A view runs
        its module directly, holding no compiled program or IPU between calls: there is nothing to free."""
        warn_once(
            logger,
            "detachFromDevice() on a to_pipelined model frees nothing: the simulated IPUs hold no compiled "
            "program between calls, and the model stays usable."
        )

    def attachToDevice(self) -> None:
        """Nothing to attach (see `detachFromDevice`)."""

    def destroy(self) -> None:
        """Nothing to free (see `detachFromDevice`); the model stays usable."""
        self.detachFromDevice()

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.pipelined.module, name, value)

    def __repr__(self) -> str:
        return f"PipelinedModelView({self.pipelined.module.__class__.__name__}, {self.pipelined.plan.ipus_per_replica} IPUs)"


def to_pipelined(model: nn.Module, ipu_config, force: bool = False):
    """Optimum Graphcore's `to_pipelined(model, ipu_config, force=False)`, on optimum-ipu's pipelining.

    Args:
        model: a transformers model, or a user's model that subclasses `PipelineMixin`.
        ipu_config: its `IPUConfig`; the config's current mode (`train()`/`eval()`) picks the layout.
        force: place an architecture without a cut spec with the generic cut
            (as `force=True` in `optimum_ipu.to_pipelined`).

    Returns:
        As the original: for a class registered with `register`, that class built with
        `from_transformers(model, ipu_config)`; for a `PipelineMixin` model, a copy carrying a copy of
        `ipu_config`. Otherwise a `PipelinedModelView`: call `.parallelize()` on it, then use it as the model.
    """
    from optimum_ipu.compat.poptorch_helpers import PipelineMixin, pipelined_class_for

    registered = pipelined_class_for(model)
    if registered is not None:
        return registered.from_transformers(model, ipu_config)
    if isinstance(model, PipelineMixin):
        clone = copy.deepcopy(model)
        clone.ipu_config = copy.deepcopy(ipu_config)
        return clone
    return PipelinedModelView(_to_pipelined(model, ipu_config, force=force))


def get_layer_ipu(ipu_config, target_number_of_layers: int | list[int] | None = None) -> list[int]:
    """The IPU index of every layer under `ipu_config`'s `layers_per_ipu`, in layer order.

    Args:
        ipu_config: an `IPUConfig` (its current mode's `layers_per_ipu` and `ipus_per_replica`).
        target_number_of_layers: the model's layer count, or the layers themselves (an `nn.ModuleList` or
            a list, as Optimum Graphcore's models and notebooks pass `self.encoder.layer`): their number
            counts. With no wildcard in `layers_per_ipu` it may be omitted (it is then their sum).
    """
    layers_per_ipu = list(ipu_config.layers_per_ipu)
    if target_number_of_layers is not None and not isinstance(target_number_of_layers, int):
        target_number_of_layers = len(target_number_of_layers)
    if target_number_of_layers is None:
        if -1 in layers_per_ipu:
            raise ValueError(
                f"layers_per_ipu={layers_per_ipu} has a -1 wildcard, so get_layer_ipu needs the model's layer "
                "count: pass target_number_of_layers=model.config.num_hidden_layers."
            )
        target_number_of_layers = sum(layers_per_ipu)
    return ipu_of_each_layer(target_number_of_layers, layers_per_ipu, ipu_config.ipus_per_replica)


def _pipelined_class(name: str) -> type:
    """An Optimum Graphcore `Pipelined<Model>` class name for an architecture optimum-ipu places.

    The original classes were transformers subclasses built with `from_transformers(model, ipu_config)`
    or `from_pretrained_transformers(name, ipu_config)`; both keep working and return a
    `PipelinedModelView`. Instantiating the class directly has no equivalent.
    """
    transformers_name = name.removeprefix("Pipelined")

    def from_transformers(cls, model: nn.Module, ipu_config) -> PipelinedModelView:
        return to_pipelined(model, ipu_config)

    def from_pretrained_transformers(
        cls, model_name_or_path: str, ipu_config, *args, **kwargs
    ) -> PipelinedModelView:
        import transformers

        model = getattr(transformers, transformers_name).from_pretrained(model_name_or_path, *args, **kwargs)
        return to_pipelined(model, ipu_config)

    def __new__(cls, *args, **kwargs):
        from optimum_ipu.compat._names import NoEquivalentError

        raise NoEquivalentError(
            f"`{name}(config)` built a pipelined subclass of transformers' {transformers_name}; optimum-ipu "
            f"places the unchanged model instead. Build `transformers.{transformers_name}(config)` (or "
            f"`.from_pretrained(...)`) and call `to_pipelined(model, ipu_config).parallelize()`, or use "
            f"`{name}.from_transformers(model, ipu_config)`."
        )

    return type(
        name,
        (),
        {
            "__module__": "optimum.graphcore",
            "__doc__": f"`{transformers_name}` placed on IPUs: use `from_transformers` or `from_pretrained_transformers`.",
            "__new__": __new__,
            "from_transformers": classmethod(from_transformers),
            "from_pretrained_transformers": classmethod(from_pretrained_transformers),
        },
    )


def __getattr__(name: str):
    from optimum_ipu.compat._tables import PIPELINED_SUPPORTED

    if name in PIPELINED_SUPPORTED:
        cls = _pipelined_class(name)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
