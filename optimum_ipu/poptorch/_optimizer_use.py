"""The optimizer as a PopTorch training model uses it: checked at wrap, its hyper-parameters read only at
`trainingModel(...)` and `setOptimizer(...)`, and the settings a training call takes from it
(`training_settings`: loss scale, clipping norm, accumulator type, rounding), derived here once for
compile and `setOptimizer` alike.

PopTorch copies the optimizer's hyper-parameters to the device when the model is wrapped and again at
`setOptimizer`; a change made to the optimizer in between does not reach the device. So every call
here runs with the hyper-parameters last set (`hyperparameters_as_set`), and says once that they
differ from the optimizer's current ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from optimum_ipu.poptorch._logging import Error, logger
from optimum_ipu.poptorch.optim import _IPUMixin
from optimum_ipu.runtime.loss_scaling import LossScaler
from optimum_ipu.runtime.optimizers import accumulator_dtype
from optimum_ipu.runtime.rounding import rounding_generator

__all__ = [
    "check_optimizer_parameters",
    "hyperparameters",
    "hyperparameters_as_set",
    "max_norm",
    "training_settings",
]


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's hyper-parameters (everything but its parameters)."""
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


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


def training_settings(optimizer, options, current: LossScaler | None = None) -> dict[str, Any]:
    """What a training call takes from `optimizer` under `options`: `TrainingExecutable.use_optimizer`'s
    keyword arguments.

    - the loss scale: the optimizer's `loss_scaling` (one of PopTorch's variable attributes, so a new
      value given by `setOptimizer` is in force from the next call), automatic when the options say
      so; `current`, the scaler in use, is kept when the value is unchanged, so an automatic scale
      carries on through a `setOptimizer` that only changes the learning rate;
    - the clipping norm (`max_grad_norm`, inf: none), the gradient accumulator's type (`accum_type`);
    - stochastic rounding as the options set it (`Precision.enableStochasticRounding`), given to a
      `poptorch.optim` optimizer and to the fp16 update of a torch optimizer alike, with the
      optimizer's own rounding generator.
    """
    rounding = bool(options._Popart._values.get("enableStochasticRounding", False))
    if isinstance(optimizer, _IPUMixin):
        optimizer.stochastic_rounding = rounding
    for group in optimizer.param_groups:
        if "stochastic_rounding" in group:
            group["stochastic_rounding"] = rounding
    scale = float(getattr(optimizer, "loss_scaling", 1.0) or 1.0)
    auto = bool(options.Training.automatic_loss_scaling)
    keep = current is not None and current.auto == auto and current.initial_scale == scale
    return {
        "loss_scaler": current if keep else LossScaler(scale, auto=auto),
        "max_grad_norm": max_norm(optimizer),
        "accumulator_dtype": accumulator_dtype(optimizer),
        "stochastic_rounding": rounding,
        "rounding_generator": rounding_generator(optimizer),
    }
