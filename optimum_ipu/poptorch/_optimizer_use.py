"""The optimizer as a PopTorch training model uses it: checked at wrap, its hyper-parameters read only at
`trainingModel(...)` and `setOptimizer(...)`, and the settings a training call takes from it
(`training_settings`: loss scale, clipping norm, accumulator type, rounding), derived here once for
compile and `setOptimizer` alike.

PopTorch copies the optimizer's hyper-parameters to the device when the model is wrapped and again at
`setOptimizer`; a change made to the optimizer in between does not reach the device. So every call
here runs with the hyper-parameters last set (`hyperparameters_as_set`), and says once that they
differ from the optimizer's current ones.

PopTorch runs none of the optimizer's Python code: it reads the attributes of SGD, Adam, AdamW, RMSprop or
LAMB (torch's or its own) and runs its own implementation of that algorithm on the device. A subclass that
overrides `step()` is therefore trained by its parent's algorithm, with a warning (`native_step`).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from optimum_ipu._once import warn_once
from optimum_ipu.poptorch import optim
from optimum_ipu.poptorch._logging import Error, logger
from optimum_ipu.poptorch.enums import MeanReductionStrategy
from optimum_ipu.poptorch.optim import _IPUMixin
from optimum_ipu.poptorch.options import device_seed
from optimum_ipu.runtime.loss_scaling import LossScaler
from optimum_ipu.runtime.optimizers import accumulator_dtype, keeps_running_mean
from optimum_ipu.runtime.rounding import draw_rounding_from, rounding_generator

__all__ = [
    "apply_reduction_strategy",
    "check_constants_kept",
    "constant_hyperparameters",
    "check_optimizer_parameters",
    "hyperparameters",
    "hyperparameters_as_set",
    "max_norm",
    "native_step",
    "warn_if_subclassed",
    "training_settings",
]


# A group's entries that are not the optimizer's hyper-parameters: its parameters, and the rounding the options
# decide (`training_settings` writes it into the groups of an optimizer that keeps it there, as LAMB does).
_NOT_HYPERPARAMETERS = ("params", "stochastic_rounding")


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's hyper-parameters (everything but its parameters and the options' rounding)."""
    return [{k: v for k, v in group.items() if k not in _NOT_HYPERPARAMETERS} for group in optimizer.param_groups]


@contextlib.contextmanager
def hyperparameters_as_set(optimizer: torch.optim.Optimizer, as_set: list[dict[str, Any]]) -> Iterator[None]:
    """While active, `optimizer`'s groups hold `as_set` (the hyper-parameters of the last wrap or
    `setOptimizer`); its current ones are put back after."""
    groups = optimizer.param_groups
    current = hyperparameters(optimizer)
    if current != as_set:
        logger.warning(
            "The optimizer's hyper-parameters changed since it was given to the model; as on PopTorch "
            "the model keeps the old ones until you call model.setOptimizer(optimizer)."
        )
    for group, values in zip(groups, as_set):
        group.update(values)
    try:
        yield
    finally:
        for group, values in zip(groups, current):
            group.update(values)


# The per-group hyper-parameters PopTorch's optimizers read onto the device. A torch optimizer has no record of
# what it was given, so PopTorch judges its constants by value (`_optimizer_attributes.py`): these are
# constants at the values below (AdamW's weight decay at torch's 1e-2), betas and alpha always, lr never.
_CONSTANT_AT = {"weight_decay": 0.0, "momentum": 0.0, "velocity_scaling": 1.0, "dampening": 0.0, "eps": 1e-8,
                "max_weight_norm": 65500.0}  # fmt: skip
_ALWAYS_CONSTANT = ("betas", "alpha")
_DEVICE_HYPERPARAMETERS = ("lr", *_CONSTANT_AT, *_ALWAYS_CONSTANT)


def constant_hyperparameters(optimizer, as_set: list[dict[str, Any]], auto_loss_scaling: bool = False) -> dict:
    """The hyper-parameters a model compiles as constants, with their values: {(group, name): value}, and
    `loss_scaling` under (None, "loss_scaling").

    PopTorch's rule (docs, "Constant attributes"; `_optimizer_attributes.py`): a `poptorch.optim` optimizer's
    attributes it was not given (`variable_attrs`); a torch optimizer's at the values of `_CONSTANT_AT`, its
    betas and alpha always, its lr never. `loss_scaling` is a variable under automatic loss scaling, and a
    torch optimizer's is a constant only at 1. `as_set`: the groups' hyper-parameters in force.
    """
    attributes = getattr(optimizer, "variable_attrs", None)
    if isinstance(attributes, optim.VariableAttributes):
        def constant(name: str, value: Any) -> bool:  # noqa: ARG001 - the same signature as below
            return attributes.isConstant(name) and not (name == "loss_scaling" and auto_loss_scaling)
    else:
        decay = 1e-2 if isinstance(optimizer, torch.optim.AdamW) else 0.0

        def constant(name: str, value: Any) -> bool:
            if name == "loss_scaling":
                return value == 1.0 and not auto_loss_scaling
            if name in _ALWAYS_CONSTANT:
                return True
            return name in _CONSTANT_AT and value == (decay if name == "weight_decay" else _CONSTANT_AT[name])

    constants = {
        (index, name): group[name]
        for index, group in enumerate(as_set)
        for name in _DEVICE_HYPERPARAMETERS
        if name in group and constant(name, group[name])
    }
    if constant("loss_scaling", optim.loss_scaling_of(optimizer)):
        constants[None, "loss_scaling"] = optim.loss_scaling_of(optimizer)
    return constants


def check_constants_kept(compiled: dict[str, Any], optimizer) -> None:
    """An `Error` if `optimizer` (given to `setOptimizer` after compiling) changes a hyper-parameter the model
    compiled as a constant (`constant_hyperparameters`); nothing is changed then."""
    groups = hyperparameters(optimizer)
    for (index, name), value in compiled.items():
        if index is None:
            new = optim.loss_scaling_of(optimizer)
        else:
            new = groups[index].get(name, value) if index < len(groups) else value
        if new == value:
            continue
        where = "" if index is None else f" of parameter group {index}"
        raise Error(
            f"The optimizer attribute {name}{where} was compiled as a constant ({value}) and cannot change to {new}: "
            "PopTorch makes constants of the attributes a poptorch.optim optimizer was not given (a torch "
            "optimizer's left at their defaults, except lr). Give it to the optimizer's constructor, or call "
            f"optimizer.variable_attrs.markAsVariable({name!r}) before the model compiles (model.destroy() and "
            "wrap the model again to recompile)."
        )


def check_optimizer_parameters(model: nn.Module, optimizer) -> None:
    """An `Error` if `optimizer` holds tensors that are not parameters of `model`.

    The wrapper runs `model` and steps `optimizer`: a tensor the optimizer holds that the model does not
    would get no gradient, and a model parameter it does not hold is never updated, so an optimizer
    built on another module's parameters trains nothing, silently. A subset of the model's parameters
    is fine (the others stay frozen).
    """
    own = {id(p) for p in model.parameters()}
    held = {id(p): p for group in getattr(optimizer, "param_groups", []) for p in group["params"]}
    foreign = [p for key, p in held.items() if key not in own]
    if not foreign:
        return
    shapes = ", ".join(str(list(p.shape)) for p in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
    name = type(optimizer).__name__
    raise Error(
        f"{len(foreign)} of the optimizer's {len(held)} parameters are not parameters of the model "
        f"({type(model).__name__}) (shapes {shapes}): the optimizer would update tensors the model does not use, "
        "and the model's weights would never change. Build the optimizer from the wrapped model's parameters: "
        f"optimizer = {name}(model.parameters(), ...), with `model` the module given to poptorch.trainingModel."
    )


def max_norm(optimizer) -> float:
    """The global gradient norm `poptorch.optim`'s `max_grad_norm` clips to (0: no clipping)."""
    value = getattr(optimizer, "max_grad_norm", float("inf"))
    return 0.0 if value == float("inf") else float(value)


def training_settings(
    optimizer, options, current: LossScaler | None = None, generators: dict | None = None
) -> dict[str, Any]:
    """What a training call takes from `optimizer` under `options`: `TrainingExecutable.use_optimizer`'s
    keyword arguments.

    - the loss scale: the optimizer's `loss_scaling` (one of PopTorch's variable attributes, so a new
      value given by `setOptimizer` is in force from the next call), automatic when the options say
      so; `current`, the scaler in use, is kept when the value is unchanged, so an automatic scale
      carries on through a `setOptimizer` that only changes the learning rate;
    - the clipping norm (`max_grad_norm`, inf: none), the gradient accumulator's type (`accum_type`);
    - stochastic rounding as the options set it (`Precision.enableStochasticRounding`), given to a
      `poptorch.optim` optimizer and to the fp16 update of a torch optimizer alike, with the
      model's device generators (`generators`, kept by the model from its compile on), started from the
      options' `device_seed`.
    """
    rounding = bool(options._Popart._values.get("enableStochasticRounding", False))
    draw_rounding_from(optimizer, {} if generators is None else generators, device_seed(options))
    if isinstance(optimizer, _IPUMixin):
        optimizer.stochastic_rounding = rounding
    for group in optimizer.param_groups:
        if "stochastic_rounding" in group:
            group["stochastic_rounding"] = rounding
    scale = optim.loss_scaling_of(optimizer)
    auto = bool(options.Training.automatic_loss_scaling)
    keep = current is not None and current.auto == auto and current.initial_scale == scale
    return {
        "loss_scaler": current if keep else LossScaler(scale, auto=auto),
        "max_grad_norm": max_norm(optimizer),
        "accumulator_dtype": accumulator_dtype(optimizer),
        "stochastic_rounding": rounding,
        "rounding_generator": rounding_generator(optimizer),
    }


def apply_reduction_strategy(optimizer, options, compiled: bool) -> None:
    """The Mean reduction's strategy as PopTorch's optimizer handling sets it (`_optimizer_attributes.py`).

    An optimizer whose gradient accumulator keeps a running mean (`keeps_running_mean`: an fp16
    `accum_type`) needs `MeanReductionStrategy.Running`: before compiling, PopTorch writes it into the
    options (so they read back what runs); once compiled without it, the executable cannot change, and a
    `setOptimizer` with such an optimizer is refused, with PopTorch's message.
    """
    if not keeps_running_mean(optimizer):
        return
    training = options.Training
    if not compiled:
        frozen = training.__dict__.get("_is_frozen", False)
        training._set_frozen(False)
        training._store(meanAccumulationAndReplicationReductionStrategy=MeanReductionStrategy.Running)
        training._set_frozen(frozen)
    elif training.meanAccumulationAndReplicationReductionStrategy != MeanReductionStrategy.Running:
        raise ValueError(
            "Invalid optimizer: the new optimizer would require changing options.Training."
            "meanAccumulationAndReplicationReductionStrategy to poptorch.MeanReductionStrategy.Running but the "
            "executable is already compiled. Keep the compiled optimizer's accum_type (torch.float32), or "
            "compile with an optimizer whose accum_type is torch.float16 (model.destroy() and call again)."
        )


# The algorithms PopTorch implements on the device, most derived first (poptorch.optim's subclass torch's).
_NATIVE = (
    optim.SGD, optim.Adam, optim.AdamW, optim.RMSprop, optim.LAMB,
    torch.optim.SGD, torch.optim.AdamW, torch.optim.Adam, torch.optim.RMSprop,
)  # fmt: skip


def native_class(optimizer) -> type | None:
    """The PopTorch algorithm `optimizer` runs as: the nearest of `_NATIVE` among its classes (None: another
    torch optimizer, whose own step runs)."""
    return next((cls for cls in type(optimizer).__mro__ if cls in _NATIVE), None)


def warn_if_subclassed(optimizer) -> None:
    """Say once per class, when a model takes `optimizer` (wrap, `setOptimizer`), that a subclass's Python
    code will not run (`native_step`), in PopTorch's words, so programs and tests matching them work."""
    native = native_class(optimizer)
    if native is None or type(optimizer) is native:
        return
    warn_once(
        logger,
        f"Optimizer `{type(optimizer).__name__}` subclassed from classes in poptorch.optim or torch.optim are "
        "unlikely to behave as intended. Poptorch does not run Python optimizer code directly; it runs "
        f"{native.__module__.split('.')[0]}.optim.{native.__name__}'s algorithm with the subclass's attributes "
        "(learning rate, loss scaling, ...). Put custom update code in the model, or use the parent class.",
        key=("optimizer subclass", type(optimizer)),
    )


@contextlib.contextmanager
def native_step(optimizer) -> Iterator[None]:
    """While active, `optimizer.step` is its PopTorch algorithm's (`native_class`), not a subclass's own:
    PopTorch never runs an optimizer's Python code (`warn_if_subclassed` says so when the model takes it)."""
    native = native_class(optimizer)
    if native is None or type(optimizer) is native:
        yield
        return
    own = vars(optimizer).get("step")
    optimizer.step = types.MethodType(native.step, optimizer)
    try:
        yield
    finally:
        if own is None:
            del optimizer.step
        else:
            optimizer.step = own
