"""`poptorch.optim`: SGD, Adam, AdamW, LAMB and RMSprop with PopTorch's extra arguments.

Each is torch's optimizer (LAMB: the runtime's) plus what PopTorch adds: `loss_scaling` (the loss is
multiplied before backward, the gradients divided before the update: the runtime's `LossScaler`),
`max_grad_norm` (global-norm clipping before the update), `accum_type` and the momentum types
(fp32 or fp16), `velocity_scaling`. On fp16 parameters (`model.half()`) the update is computed in
fp32 from the runtime's fp32 gradient sums and written back to fp16, with stochastic rounding when
`opts.Precision.enableStochasticRounding(True)`. `accum_type` is the gradient accumulator's type:
with fp16 the runtime's `GradientAccumulator` sums the loss-scaled micro-batch gradients in fp16, at
the scale in use (automatic loss scaling changes it), as IPUTrainer's fp16 training does; the momentum types
(`velocity_accum_type`, `first/second_order_momentum_accum_type`) keep that state in fp16 between
steps; the update itself is computed in fp32. torch optimizers passed as they are work too, on fp32 models.
As on PopTorch, an argument given as None takes its default, Adam, AdamW and LAMB take
`bias_correction` (False: the moments are used without dividing by 1 - beta^t), RMSprop takes
`use_tf_variant` (TensorFlow's RMSprop), and every optimizer here is a `poptorch.optim.Optimizer`.
"""

from __future__ import annotations

import functools
import math
import types
import weakref
from typing import Any

import torch

from optimum_ipu.poptorch._logging import logger
from optimum_ipu.runtime.optimizers import LAMB as _RuntimeLAMB
from optimum_ipu.runtime.optimizers import fp32_working_copies, load_keeping_state_types
from optimum_ipu.runtime.rounding import rounding_generator

__all__ = ["LAMB", "SGD", "Adam", "AdamW", "Optimizer", "RMSprop", "VariableAttributes"]

_ACCUM_TYPES = (torch.float32, torch.float16)
_FUNCTIONS = (types.FunctionType, types.MethodType, functools.partial)
AMSGRAD = "Only non-amsgrad Adam/AdamW optimizers are supported."  # PopTorch's message


def _given(**arguments: Any) -> dict[str, Any]:
    """The arguments the user gave: PopTorch's optimizers read `None` as "torch's default"."""
    return {k: v for k, v in arguments.items() if v is not None}


def _unhooked(step):
    """`step` (a parent class's, bound) without torch's hook wrapper: torch wraps the `step` of every optimizer
    class it instantiates with one that runs the instance's step hooks, so a subclass calling its parent's
    step would run a user's hooks twice once a plain torch optimizer of that class exists."""
    if getattr(step, "hooked", False) and hasattr(step, "__wrapped__"):
        return step.__wrapped__.__get__(step.__self__)
    return step


def _check_accum(**types: Any) -> None:
    for name, dtype in types.items():
        if dtype is not None and dtype not in _ACCUM_TYPES:
            raise AssertionError(
                f"Accumulation types must be either torch.float32 or torch.float16 ({name}={dtype})."
            )


class VariableAttributes:
    """Which of an optimizer's attributes may change after the model compiles (`setOptimizer`).

    PopTorch's rule: the attributes given to a `poptorch.optim` constructor are variables; the others are
    constants of the compiled program, and a `setOptimizer` that changes one is refused
    (`_optimizer_use.check_constants_kept`). `markAsVariable` / `markAsConstant` change that before compiling.
    """

    def __init__(self, variable: list[str] | None = None, all_attributes: list[str] | None = None):
        self._variable = set(variable or [])
        self._all = set(all_attributes or [])

    def isConstant(self, attr: str) -> bool:
        return attr in self._all and attr not in self._variable

    def markAsConstant(self, attr: str) -> None:
        self._check_known(attr)
        self._variable.discard(attr)

    def markAsVariable(self, attr: str) -> None:
        self._check_known(attr)
        self._variable.add(attr)

    def _check_known(self, attr: str) -> None:
        if self._all and attr not in self._all:
            raise AssertionError(f"Unknown attribute {attr}, allowed values: {sorted(self._all)}")


def _given_names(arguments: dict[str, Any]) -> list[str]:
    """The constructor arguments the user gave (not None), from its `locals()`: PopTorch's variables."""
    return [name for name, value in arguments.items() if value is not None and name not in ("self", "params", "__class__")]


# A `poptorch.optim` optimizer a training model has compiled with -> {id(parameter): its name in that
# model}, which `state_dict`'s `ipu_state` and `ipu_param` name tensors by (`Optimizer.state_dict`).
_COMPILED_WITH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_IPU_KEYS = ("ipu_state", "ipu_param")
# A hyper-parameter of a group -> the name `ipu_param` gives it (PopTorch's names where it has one).
_IPU_PARAM_NAMES = {"lr": "learningRate", "weight_decay": "weightDecay", "momentum": "momentum",
                    "dampening": "dampening", "eps": "eps", "alpha": "alpha"}  # fmt: skip


def loss_scaling_of(optimizer) -> float:
    """The loss scale `optimizer` carries (`loss_scaling`, one of PopTorch's variable attributes; 1 when
    it has none, as a torch optimizer)."""
    return float(getattr(optimizer, "loss_scaling", 1.0) or 1.0)


def note_compiled(optimizer, model) -> None:
    """A training model of `model` compiled with `optimizer`: its `state_dict()` carries the device's state."""
    if isinstance(optimizer, Optimizer):
        _COMPILED_WITH[optimizer] = {id(p): name for name, p in model.named_parameters()}


class Optimizer:
    """PopTorch's base class of its optimizers: every optimizer of `poptorch.optim` is one (programs use it
    in annotations and `isinstance` checks).

    Its `state_dict()` is torch's plus PopTorch's `ipu_state` and `ipu_param` entries: None until a training
    model using it compiles, then the device's optimizer state (`"<state>___<parameter>"`: torch's state
    names, e.g. `exp_avg___linear.weight`) and hyper-parameters (`"learningRate___specific___<parameter>"`,
    `weightDecay`, `momentum`, `beta1`, `beta2`, `eps`, ..., and `lossScaling_FLOAT`), as 0-dim or full
    tensors. PopTorch's keys are PopART's tensor names; programs save and load the dict whole, which works
    alike. `load_state_dict` takes only such a dict, as PopTorch's does.
    """

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        names = _COMPILED_WITH.get(self)
        if names is None:
            return {"ipu_state": None, "ipu_param": None, **state}
        return {"ipu_state": self._ipu_state(names), "ipu_param": self._ipu_param(names), **state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            raise RuntimeError("Cannot load optimizer state dictionary because it is empty.")
        if any(key not in state_dict for key in _IPU_KEYS):
            raise RuntimeError(
                "Only IPU optimizer states can be loaded onto the IPU. This state dict has no 'ipu_state' / "
                f"'ipu_param': it comes from a torch optimizer. Load it into a torch.optim.{type(self).__name__} "
                "(PopTorch trains with those too), or load a state dict saved from a poptorch.optim optimizer."
            )
        load_keeping_state_types(self, super().load_state_dict, {k: v for k, v in state_dict.items() if k not in _IPU_KEYS})

    def _ipu_state(self, names: dict[int, str]) -> dict[str, torch.Tensor]:
        return {
            f"{key}___{names[id(param)]}": value.detach().clone()
            for param, state in self.state.items()
            if id(param) in names
            for key, value in state.items()
            if isinstance(value, torch.Tensor)
        }

    def _ipu_param(self, names: dict[int, str]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for group in self.param_groups:
            values = {_IPU_PARAM_NAMES[k]: v for k, v in group.items() if k in _IPU_PARAM_NAMES}
            if isinstance(group.get("betas"), (tuple, list)):
                values["beta1"], values["beta2"] = group["betas"]
            for param in group["params"]:
                if id(param) in names:
                    for key, value in values.items():
                        if isinstance(value, (int, float)) and not isinstance(value, bool):
                            out[f"{key}___specific___{names[id(param)]}"] = torch.tensor(float(value))
        out["lossScaling_FLOAT"] = torch.tensor(loss_scaling_of(self))
        return out

    def __getstate__(self) -> dict[str, Any]:
        """torch's state plus PopTorch's attributes (loss scaling, clipping, types), so pickling keeps them."""
        state = super().__getstate__()
        extra = {
            k: v
            for k, v in self.__dict__.items()
            # not the functions a learning-rate scheduler puts on the instance (its wrapped `step`)
            if k not in state and not k.startswith("_optimizer_") and not isinstance(v, _FUNCTIONS)
        }
        return {**state, **extra}


class _IPUMixin(Optimizer):
    """PopTorch's extra arguments, and `step(gradients=...)` for fp16 parameters."""

    stochastic_rounding = False

    def _ipu_init(self, loss_scaling, max_grad_norm, accum_type=None, variables=(), **accum_types) -> None:
        if loss_scaling is not None and not loss_scaling > 0:
            raise ValueError(f"loss_scaling must be > 0, got {loss_scaling}.")
        _check_accum(accum_type=accum_type, **accum_types)
        self.loss_scaling = float(loss_scaling) if loss_scaling is not None else 1.0
        self.max_grad_norm = float(max_grad_norm) if max_grad_norm is not None else math.inf
        self.accum_type = accum_type or torch.float32
        self.accum_types = {k: v for k, v in accum_types.items() if v is not None}
        attributes = [*self.defaults, "loss_scaling"]
        self.variable_attrs = VariableAttributes([n for n in variables if n in attributes], attributes)

    @torch.no_grad()
    def step(self, closure=None, gradients: dict | None = None):
        """One update; `gradients` maps fp16 parameters to their fp32 gradients (the runtime's sums).

        The update runs in fp32: fp16 weights on fp32 working copies (written back to fp16, with
        stochastic rounding when it is on), state kept in fp16 by an accumulation type on fp32 copies
        (stored back in fp16). The gradients are what the runtime's accumulator holds (of its
        `accum_type`), unscaled.
        """
        with fp32_working_copies(self, gradients or {}, self.stochastic_rounding, rounding_generator(self)):
            self._store_state(fp16=False)
            loss = _unhooked(super().step)(closure)
        self._store_state(fp16=True)
        return loss

    def _state_type(self, key: str) -> torch.dtype | None:
        """The accumulation type PopTorch gives optimizer state `key` (None: fp32)."""
        types = self.accum_types
        if key == "momentum_buffer":  # SGD's velocity, RMSprop's momentum
            return types.get("velocity_accum_type") or types.get("first_order_momentum_accum_type")
        if key in ("exp_avg", "grad_avg"):
            return types.get("first_order_momentum_accum_type")
        if key in ("exp_avg_sq", "square_avg"):
            return types.get("second_order_momentum_accum_type")
        return None

    def _store_state(self, fp16: bool) -> None:
        """State tensors with an fp16 accumulation type: fp16 between steps, fp32 during one."""
        if torch.float16 not in self.accum_types.values():
            return
        for state in self.state.values():
            for key, value in state.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.is_floating_point()
                    and value.dim() > 0
                    and self._state_type(key) == torch.float16
                ):
                    state[key] = value.half() if fp16 else value.float()


class SGD(_IPUMixin, torch.optim.SGD):
    """torch SGD plus `loss_scaling`, `velocity_scaling`, `max_grad_norm`, `accum_type`, `velocity_accum_type`."""

    def __init__(self, params, lr: float | None = 0.01, momentum: float | None = None,
                 dampening: float | None = None, weight_decay: float | None = None, nesterov: bool | None = None,
                 maximize: bool | None = None, foreach=None, differentiable: bool | None = None,
                 loss_scaling: float | None = None, velocity_scaling: float | None = None,
                 use_combined_accum: bool | None = None, max_grad_norm: float | None = None,
                 accum_type: torch.dtype | None = None, velocity_accum_type: torch.dtype | None = None):  # fmt: skip
        variables = _given_names(locals())
        super().__init__(params, **_given(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, maximize=maximize, foreach=foreach, differentiable=differentiable))  # fmt: skip
        self._ipu_init(loss_scaling, max_grad_norm, accum_type, variables, velocity_accum_type=velocity_accum_type)
        # velocity_scaling scales the stored velocity on the IPU and is divided out again: same update. PopTorch
        # uses it in the combined variant only, and says so when it is given to the separate one.
        if velocity_scaling is not None and not use_combined_accum:
            logger.warning(
                "velocity_scaling=%s has no effect with the separate SGD variant (use_combined_accum=False, the "
                "default): only the combined variant scales its velocity. Drop it, or pass use_combined_accum=True.",
                velocity_scaling,
            )
        self.velocity_scaling = float(velocity_scaling) if velocity_scaling is not None else 1.0
        # The combined variant keeps one tensor for the accumulated gradient and the velocity; what it changes
        # here is the Mean reduction's strategy (`runtime.optimizers.keeps_running_mean` reads it).
        self.use_combined_accum = bool(use_combined_accum)


class _BiasCorrection:
    """Adam's update with PopTorch's `bias_correction=False`: the moments are used as they are, not
    divided by 1 - beta^t (torch's optimizers always correct; with True, torch's own step runs)."""

    bias_correction = True
    decoupled_weight_decay = False  # AdamW: True

    @torch.no_grad()
    def step(self, closure=None):
        if self.bias_correction:
            return _unhooked(super().step)(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, decay = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if group.get("maximize") else p.grad
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                if decay and self.decoupled_weight_decay:
                    p.mul_(1 - lr * decay)
                elif decay:
                    grad = grad.add(p, alpha=decay)
                state["exp_avg"].lerp_(grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(group["eps"]), value=-lr)
        return loss


class _AdamFamily(_IPUMixin, _BiasCorrection):
    """Adam and AdamW's arguments: torch's (None: torch's default), PopTorch's, and `bias_correction`."""

    def __init__(self, params, lr: float | None = None, betas=None, eps: float | None = None,
                 weight_decay: float | None = None, amsgrad: bool | None = None, foreach=None,
                 maximize: bool | None = None, capturable: bool | None = None, differentiable: bool | None = None,
                 fused=None, loss_scaling: float | None = None, bias_correction: bool | None = None,
                 accum_type: torch.dtype | None = None, first_order_momentum_accum_type: torch.dtype | None = None,
                 second_order_momentum_accum_type: torch.dtype | None = None,
                 max_grad_norm: float | None = None):  # fmt: skip
        variables = _given_names(locals())
        if amsgrad:
            raise ValueError(AMSGRAD)
        super().__init__(params, **_given(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=foreach,
                         maximize=maximize))  # fmt: skip
        self.bias_correction = bias_correction is not False
        self._ipu_init(loss_scaling, max_grad_norm, accum_type, variables,
                       first_order_momentum_accum_type=first_order_momentum_accum_type,
                       second_order_momentum_accum_type=second_order_momentum_accum_type)  # fmt: skip


class Adam(_AdamFamily, torch.optim.Adam):
    """torch Adam plus `loss_scaling`, `max_grad_norm`, `bias_correction`, accumulation types."""


class AdamW(_AdamFamily, torch.optim.AdamW):
    """torch AdamW plus `loss_scaling`, `max_grad_norm`, `bias_correction`, accumulation types."""

    decoupled_weight_decay = True


class _TensorFlowVariant:
    """RMSprop as TensorFlow computes it, PopTorch's `use_tf_variant=True`: the mean square starts at 1, eps
    is added inside the square root, and with momentum the learning rate is folded into the momentum
    buffer (buffer = momentum x buffer + lr x gradient / rms; weight -= buffer). False: torch's own step."""

    use_tf_variant = False

    @torch.no_grad()
    def step(self, closure=None):
        if not self.use_tf_variant:
            return _unhooked(super().step)(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, alpha, eps, momentum = group["lr"], group["alpha"], group["eps"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if group.get("maximize") else p.grad
                if group["weight_decay"]:
                    grad = grad.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
                    if momentum > 0:
                        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if group["centered"]:
                        state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                square = state["square_avg"].mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
                if group["centered"]:
                    mean = state["grad_avg"].lerp_(grad, 1 - alpha)
                    rms = square.addcmul(mean, mean, value=-1).add_(eps).sqrt_()
                else:
                    rms = square.add(eps).sqrt_()
                if momentum > 0:
                    buffer = state["momentum_buffer"].mul_(momentum).addcdiv_(grad, rms, value=lr)
                    p.sub_(buffer)
                else:
                    p.addcdiv_(grad, rms, value=-lr)
        return loss


class RMSprop(_IPUMixin, _TensorFlowVariant, torch.optim.RMSprop):
    """torch RMSprop plus `loss_scaling`, `max_grad_norm`, accumulation types and `use_tf_variant`."""

    def __init__(self, params, lr: float | None = None, alpha: float | None = None, eps: float | None = None,
                 weight_decay: float | None = None, momentum: float | None = None, centered: bool | None = None,
                 foreach=None, maximize: bool | None = None, differentiable: bool | None = None,
                 loss_scaling: float | None = None,
                 accum_type: torch.dtype | None = None, first_order_momentum_accum_type: torch.dtype | None = None,
                 second_order_momentum_accum_type: torch.dtype | None = None,
                 max_grad_norm: float | None = None, use_tf_variant: bool | None = None):  # fmt: skip
        variables = _given_names(locals())
        super().__init__(params, **_given(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                         centered=centered, foreach=foreach, maximize=maximize))  # fmt: skip
        self.use_tf_variant = bool(use_tf_variant)
        self._ipu_init(loss_scaling, max_grad_norm, accum_type, variables,
                       first_order_momentum_accum_type=first_order_momentum_accum_type,
                       second_order_momentum_accum_type=second_order_momentum_accum_type)  # fmt: skip


class LAMB(Optimizer, _RuntimeLAMB):
    """LAMB (You et al.): the runtime's implementation, with PopTorch's arguments and defaults (None: the
    default: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, bias correction on, max weight norm
    65500)."""

    def __init__(self, params, lr: float | None = None, betas=None, eps: float | None = None,
                 weight_decay: float | None = None, bias_correction: bool | None = None,
                 loss_scaling: float | None = None, max_weight_norm: float | None = None,
                 accum_type: torch.dtype | None = None, first_order_momentum_accum_type: torch.dtype | None = None,
                 second_order_momentum_accum_type: torch.dtype | None = None,
                 max_grad_norm: float | None = None):  # fmt: skip
        variables = _given_names(locals())
        _check_accum(accum_type=accum_type, first_order_momentum_accum_type=first_order_momentum_accum_type,
                     second_order_momentum_accum_type=second_order_momentum_accum_type)  # fmt: skip
        super().__init__(params, lr=1e-3 if lr is None else lr, betas=betas or (0.9, 0.999),
                         eps=1e-8 if eps is None else eps, weight_decay=1e-2 if weight_decay is None else weight_decay,
                         bias_correction=bias_correction is not False,
                         max_weight_norm=max_weight_norm if max_weight_norm is not None else 65500.0,
                         accum_type=accum_type or torch.float32,
                         first_order_momentum_accum_type=first_order_momentum_accum_type or torch.float32,
                         second_order_momentum_accum_type=second_order_momentum_accum_type or torch.float32)  # fmt: skip
        self.bias_correction = bias_correction is not False
        self.loss_scaling = float(loss_scaling) if loss_scaling is not None else 1.0
        self.max_grad_norm = float(max_grad_norm) if max_grad_norm is not None else math.inf
        attributes = [*self.defaults, "loss_scaling"]
        self.variable_attrs = VariableAttributes([n for n in variables if n in attributes], attributes)
