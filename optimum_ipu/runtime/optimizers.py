"""IPU optimizers: AdamW and LAMB that update fp16 weights through fp32 arithmetic.

PopTorch's optimizers run on the device next to fp16 weights. Their update is computed in fp32, the
state is kept in fp32 or fp16, and the new weight is written back to fp16 with stochastic rounding.
These classes do the same on the host, with PopTorch's three state types:

* `accum_type`: the gradient accumulator, which sums the micro-batch gradients of one update (the
  executable reads it: `TrainingExecutable`, `gradients.GradientAccumulator`);
* `first_order_momentum_accum_type`: Adam's first moment (`exp_avg`);
* `second_order_momentum_accum_type`: its second moment (`exp_avg_sq`).

Optimum Graphcore trained fp16 with fp16, fp16 and fp32 (`trainer.py`'s `create_optimizer` in 0.7);
`IPUTrainer` does the same. The defaults here are PopTorch's: all fp32. On fp32 parameters the
AdamW update is the standard decoupled-weight-decay rule (Loshchilov & Hutter), and LAMB is the
layer-wise trust-ratio rule of You et al. (2019).

`step(gradients=...)` takes fp32 gradients for fp16 parameters (the executable's fp32 reduction:
an fp16 `.grad` would flush small values to zero); a parameter with neither is skipped, which is
how a loss-scaling overflow skips an update. Stochastic rounding draws from the optimizer's own
generator, seeded once and saved with its state: the update is the same on every replica (the
IPU's identical-seeds rule) and a resumed run rounds as the uninterrupted one would.

Loading a state dict keeps every tensor in the dtype it was saved in: torch's
`Optimizer.load_state_dict` casts state to the parameter's dtype, which would turn the fp32 moments
of fp16 weights into fp16 and flush most of `exp_avg_sq` to zero.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import weakref
from collections.abc import Iterator, Mapping

import torch
from torch.optim.adamw import adamw

from optimum_ipu.runtime.fp16_compute import lend_fp32_memory
from optimum_ipu.runtime.kept_tensors import kept_tensor
from optimum_ipu.runtime.rounding import chunk_views, rounding_generator, update_in_chunks, write_back

STATE_TYPES = (torch.float32, torch.float16)


def _state_types(accum: torch.dtype, first: torch.dtype, second: torch.dtype) -> dict[str, torch.dtype]:
    types = dict(
        accum_type=accum, first_order_momentum_accum_type=first, second_order_momentum_accum_type=second
    )
    for name, dtype in types.items():
        if dtype not in STATE_TYPES:
            raise ValueError(f"{name}={dtype}: an optimizer state type is torch.float32 or torch.float16.")
    return types


@contextlib.contextmanager
def fp32_working_copies(
    optimizer: torch.optim.Optimizer,
    gradients: Mapping[torch.Tensor, torch.Tensor],
    stochastic_rounding: bool,
    generator: torch.Generator | None,
) -> Iterator[None]:
    """While active, each fp16 parameter of `optimizer` that `gradients` holds is an fp32 working copy
    with its fp32 gradient as `.grad`, so a torch optimizer's own `step()` updates it in fp32; on exit
    the new values are written back to fp16, stochastically rounded (from `generator`, in the order of
    the optimizer's parameters, on CPU) when `stochastic_rounding` is on, to nearest otherwise.

    The fp16 update of any optimizer written for fp32 weights: PopTorch's (`poptorch.optim`) and a
    plain torch optimizer given to a PopTorch model or to `IPUTrainer` alike (`TrainingExecutable`).
    """
    halves = [p for group in optimizer.param_groups for p in group["params"] if p in gradients]
    stored = [p.data for p in halves]
    copies = fp32_copies(optimizer, halves)
    for p, copy in zip(halves, copies):
        p.data = copy
        p.grad = gradients[p]
    try:
        yield
    finally:
        values = [p.data for p in halves]
        for p, data in zip(halves, stored):
            p.grad = None
            p.data = data
        with torch.no_grad():
            if stochastic_rounding:
                for p, value in zip(halves, values):
                    write_back(p, value, True, generator if p.device.type == "cpu" else None)
            elif halves:
                torch._foreach_copy_(halves, values)  # round to nearest, in one pass for all weights
        # The working copies are idle until the next update: within a host call, the next micro-batches' fp32
        # copies of the weights may be made in their memory.
        lend_fp32_memory(halves, copies)


def fp32_copies(
    optimizer: torch.optim.Optimizer, tensors: list[torch.Tensor], owners: list[torch.Tensor] | None = None,
    kind: str = "weight",
) -> list[torch.Tensor]:
    """The exact fp32 values of `tensors`: an fp32 tensor is itself, an fp16 one is copied into a tensor
    kept on `optimizer` from one update to the next (per `kind` of tensor of each of `owners`, the
    parameters they belong to; by default the tensors themselves).

    An update's working copies are 4 bytes per fp16 value, made once (`kept_tensors`) and filled in one
    pass for all tensors. They are scratch: the write-back rounds the weights' in place.
    """
    kept: dict[tuple[str, torch.Tensor], torch.Tensor] = optimizer.__dict__.setdefault("_fp32_copies", {})
    copies, sources, targets = [], [], []
    for tensor, owner in zip(tensors, tensors if owners is None else owners):
        if tensor.dtype == torch.float32:
            copies.append(tensor)
            continue
        copy = kept_tensor(kept, (kind, owner), tensor.shape, torch.float32, tensor.device)
        copies.append(copy)
        sources.append(tensor.detach())
        targets.append(copy)
    if targets:
        torch._foreach_copy_(targets, sources)
    return copies


def _updated_in_chunks(p: torch.Tensor, state: dict) -> bool:
    """Whether AdamW updates `p` chunk by chunk (`update_in_chunks`): an fp16 weight on the CPU whose
    moments (`state`) split alike, all contiguous. Moments loaded from a run whose weight was laid out
    otherwise keep their strides, and such a weight is updated whole."""
    return (
        p.dtype == torch.float16 and p.device.type == "cpu" and p.is_contiguous()
        and all(state[k].is_contiguous() and state[k].shape == p.shape for k in ("exp_avg", "exp_avg_sq"))
    )  # fmt: skip


def load_keeping_state_types(optimizer: torch.optim.Optimizer, load, state_dict: dict) -> None:
    """`load(state_dict)` (torch's `Optimizer.load_state_dict`), then undo its cast of the state to the
    parameters' dtypes: each tensor stays as it was saved (the fp32 moments of fp16 weights stay fp32, as
    the update that reads them needs)."""
    saved = {index: dict(values) for index, values in state_dict.get("state", {}).items()}
    load(state_dict)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, values in saved.items():
        p = params[int(index)]
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and key != "step":
                optimizer.state[p][key] = value.to(p.device)


def accumulator_dtype(optimizer: torch.optim.Optimizer) -> torch.dtype:
    """The gradient accumulator's type an optimizer asks for: its `accum_type` (PopTorch's and the IPU
    optimizers' one value for every group) when fp16, else fp32. accelerate's wrapper is looked through."""
    optimizer = getattr(optimizer, "optimizer", optimizer)
    return torch.float16 if getattr(optimizer, "accum_type", None) == torch.float16 else torch.float32


def keeps_running_mean(optimizer: torch.optim.Optimizer, dtype: torch.dtype | None = None) -> bool:
    """PopTorch's rule (`_optimizer_attributes.py`): an fp16 gradient accumulator (`dtype`, by default the
    optimizer's `accum_type`) keeps a running mean of the micro-batch gradients under a Mean reduction
    (`MeanReductionStrategy.Running`), except for the combined-accumulator SGD variant."""
    dtype = accumulator_dtype(optimizer) if dtype is None else dtype
    return dtype == torch.float16 and not getattr(getattr(optimizer, "optimizer", optimizer), "use_combined_accum", False)


# Per step function (the class's, or one set on the instance, such as an LR scheduler's wrapper): whether
# it takes `gradients=`. Read at every fp16 update, where `inspect.signature` cost 17-90 us, 1-2 % of a
# small program's update (the seed program's 50 updates per host call).
_TAKES_GRADIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def takes_fp32_gradients(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer.step` takes the fp32 gradients of fp16 weights itself (`step(gradients=...)`)."""
    step = optimizer.step
    function = getattr(step, "__func__", step)
    try:
        return _TAKES_GRADIENTS[function]
    except KeyError:
        pass
    except TypeError:  # a step that cannot be weakly referenced: read each time
        return "gradients" in inspect.signature(step).parameters
    takes = _TAKES_GRADIENTS[function] = "gradients" in inspect.signature(step).parameters
    return takes


class IPUOptimizer(torch.optim.Optimizer):
    """Shared handling: fp32 gradients and working copies, accumulator dtype, write-back rounding."""

    def __init__(self, params, defaults: dict, seed: int = 0):
        if defaults["lr"] < 0:
            raise ValueError(f"Invalid learning rate: {defaults['lr']}")
        beta1, beta2 = defaults["betas"]
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"Invalid betas {defaults['betas']}: each must be in [0, 1).")
        super().__init__(params, defaults)
        # The executable reads the accumulator type here (PopTorch's: one value for every group).
        self.accum_type = defaults["accum_type"]
        self.rounding_seed = int(seed)
        self._gradients: dict[torch.Tensor, torch.Tensor] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        """The stochastic-rounding generator of `device` (`rounding.rounding_generator`)."""
        return rounding_generator(self, device)

    def _grad(self, p: torch.Tensor) -> torch.Tensor | None:
        """`p`'s fp32 gradient for this step: the one handed to `step()`, else `p.grad`."""
        grad = self._gradients.get(p)
        if grad is None and p.grad is not None:
            grad = p.grad.float()
        return grad

    @contextlib.contextmanager
    def _with_gradients(self, gradients) -> Iterator[None]:
        """Within this context `_grad` reads the fp32 `gradients` (a mapping parameter -> tensor)."""
        self._gradients = dict(gradients or {})
        try:
            yield
        finally:
            self._gradients = {}

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["stochastic_rounding"] = {
            "seed": self.rounding_seed,
            "generators": {device: g.get_state() for device, g in self.__dict__.get("_rounding_generators", {}).items()},
        }
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        rounding = state_dict.pop("stochastic_rounding", None)
        load_keeping_state_types(self, super().load_state_dict, state_dict)
        if rounding is not None:
            self.rounding_seed = int(rounding["seed"])
            self.__dict__.pop("_rounding_generators", None)
            for device, generator_state in rounding["generators"].items():
                self._generator(torch.device(device)).set_state(generator_state)

    def _state(self, p: torch.Tensor, group: dict) -> dict:
        """`p`'s step count and two moments (in the group's moment types), created on its first update."""
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(
                p, dtype=group["first_order_momentum_accum_type"], memory_format=torch.preserve_format
            )
            state["exp_avg_sq"] = torch.zeros_like(
                p, dtype=group["second_order_momentum_accum_type"], memory_format=torch.preserve_format
            )
        return state

    def _moments(self, p: torch.Tensor, group: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
        state = self._state(p, group)
        state["step"] += 1
        return state["exp_avg"], state["exp_avg_sq"], int(state["step"].item())

    @staticmethod
    def _update_moments(exp_avg, exp_avg_sq, grad32, beta1, beta2):
        m = exp_avg.float().mul_(beta1).add_(grad32, alpha=1 - beta1)
        v = exp_avg_sq.float().mul_(beta2).addcmul_(grad32, grad32, value=1 - beta2)
        exp_avg.copy_(m)
        exp_avg_sq.copy_(v)
        return m, v


class AdamW(IPUOptimizer):
    """AdamW with fp32 math on fp16 (or fp32) parameters.

    Args:
        params: parameters or param groups.
        lr, betas, eps, weight_decay: as `torch.optim.AdamW`.
        bias_correction: apply Adam's bias correction.
        accum_type: dtype of the gradient accumulator (torch.float32 or torch.float16), which the
            executable sums an update's micro-batch gradients in.
        first_order_momentum_accum_type, second_order_momentum_accum_type: dtypes of the two moments.
        stochastic_rounding: round fp16 weight writes stochastically (the IPU training default).
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        bias_correction: bool = True,
        accum_type: torch.dtype = torch.float32,
        first_order_momentum_accum_type: torch.dtype = torch.float32,
        second_order_momentum_accum_type: torch.dtype = torch.float32,
        stochastic_rounding: bool = True,
        seed: int = 0,
    ):
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
            stochastic_rounding=stochastic_rounding,
            **_state_types(accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type),
        )  # fmt: skip
        super().__init__(params, defaults, seed)

    @torch.no_grad()
    def step(self, closure=None, gradients=None):
        """One update; `gradients` maps fp16 parameters to their fp32 gradients (see module doc)."""
        loss = closure() if closure is not None else None
        with self._with_gradients(gradients):
            for group in self.param_groups:
                params = [p for p in group["params"] if p.grad is not None or p in self._gradients]
                if not params:
                    continue
                self._fused_step(group, params)
        return loss

    def _fused_step(self, group: dict, params: list[torch.Tensor]) -> None:
        """All of a group's tensors through torch's fused AdamW kernel, on exact fp32 values.

        fp32 weights are updated in place, all in one call. An fp16 weight on the CPU is updated chunk by
        chunk (`update_in_chunks`): the kernel runs on an fp32 copy of each chunk and the matching slices
        of the gradient and the moments, so the copy, the update and the rounding stay in the cache. Copies
        are exact (`p.float()`), so this is the same update as `_step_one`, at the speed of one fused pass
        instead of a dozen elementwise ones; fp16 weights draw their rounding in the order of `params`.
        """
        states = [self._state(p, group) for p in params]
        grads = [self._grad(p) for p in params]
        chunked = [_updated_in_chunks(p, state) for p, state in zip(params, states)]
        if not any(chunked):
            self._fused_whole(group, params, states, grads)
            return
        fp32 = [i for i, p in enumerate(params) if p.dtype == torch.float32]
        if fp32:  # no rounding: one call for all of them
            self._fused_whole(group, [params[i] for i in fp32], [states[i] for i in fp32], [grads[i] for i in fp32])
        for p, state, grad, in_chunks in zip(params, states, grads, chunked):
            if in_chunks:
                self._fused_chunks(group, p, state, grad)
            elif p.dtype != torch.float32:
                self._fused_whole(group, [p], [state], [grad])

    def _fused_whole(self, group: dict, params: list, states: list[dict], grads: list) -> None:
        """`params` through one call of the fused kernel (one per step count without bias correction), fp16
        ones on whole fp32 working copies."""
        beta1, beta2 = group["betas"]
        weights = fp32_copies(self, params)  # p itself when p is fp32: updated in place
        exp_avgs = fp32_copies(self, [state["exp_avg"] for state in states], params, "exp_avg")
        exp_avg_sqs = fp32_copies(self, [state["exp_avg_sq"] for state in states], params, "exp_avg_sq")
        steps = [state["step"] for state in states]
        # The kernel counts each step before it runs: its step is the state's plus one.
        calls = {None: range(len(params))} if group["bias_correction"] else {}
        for i, step in enumerate(steps):
            if not group["bias_correction"]:
                calls.setdefault(float(step) + 1, []).append(i)
        for step, chosen in calls.items():
            adamw(
                [weights[i] for i in chosen], [grads[i] for i in chosen], [exp_avgs[i] for i in chosen],
                [exp_avg_sqs[i] for i in chosen], [], [steps[i] for i in chosen],
                fused=weights[0].device.type in ("cpu", "cuda"), amsgrad=False, beta1=beta1, beta2=beta2,
                maximize=False, **_kernel_settings(group, step),
            )  # fmt: skip
        # fp16 moments: the fp32 results stored back (rounded to nearest), in one pass.
        stored = [(state[key], value) for state, m, v in zip(states, exp_avgs, exp_avg_sqs)
                  for key, value in (("exp_avg", m), ("exp_avg_sq", v)) if state[key] is not value]  # fmt: skip
        if stored:
            torch._foreach_copy_([moment for moment, _ in stored], [value for _, value in stored])
        for p, weight in zip(params, weights):
            if weight is not p:
                write_back(p, weight, group["stochastic_rounding"], self._generator(p.device))

    def _fused_chunks(self, group: dict, p: torch.Tensor, state: dict, grad: torch.Tensor) -> None:
        """An fp16 weight on the CPU through the fused kernel, chunk by chunk (`update_in_chunks`)."""
        beta1, beta2 = group["betas"]
        state["step"] += 1  # once per update, as torch's fused AdamW counts before its kernel
        step = [state["step"]]
        grads = chunk_views(grad.contiguous())
        exp_avgs, exp_avg_sqs = chunk_views(state["exp_avg"]), chunk_views(state["exp_avg_sq"])
        options = dict(amsgrad=False, beta1=beta1, beta2=beta2, maximize=False, grad_scale=None, found_inf=None,
                       **_kernel_settings(group, float(state["step"])))  # fmt: skip

        def update(i: int, weight: torch.Tensor) -> None:
            m, v = exp_avgs[i], exp_avg_sqs[i]
            # fp16 moments through fp32 copies, stored back rounded to nearest, as the whole update does
            m32 = m if m.dtype == torch.float32 else m.float()
            v32 = v if v.dtype == torch.float32 else v.float()
            torch._fused_adamw_([weight], [grads[i]], [m32], [v32], [], step, **options)
            if m32 is not m:
                m.copy_(m32)
            if v32 is not v:
                v.copy_(v32)

        update_in_chunks(p, update, group["stochastic_rounding"], self._generator(p.device))

    def _step_one(self, group: dict, p: torch.Tensor) -> None:
        """One tensor, written out: the reference rule (and the only one without bias correction)."""
        beta1, beta2 = group["betas"]
        grad = self._grad(p)
        exp_avg, exp_avg_sq, step = self._moments(p, group)
        m, v = self._update_moments(exp_avg, exp_avg_sq, grad, beta1, beta2)
        c1 = 1 - beta1**step if group["bias_correction"] else 1.0
        c2 = 1 - beta2**step if group["bias_correction"] else 1.0
        weight = p.float()
        weight.mul_(1 - group["lr"] * group["weight_decay"])
        denom = (v.sqrt() / math.sqrt(c2)).add_(group["eps"])
        weight.addcdiv_(m, denom, value=-group["lr"] / c1)
        write_back(p, weight, group["stochastic_rounding"], self._generator(p.device))


def _kernel_settings(group: dict, step: float | None) -> dict[str, float]:
    """The learning rate, eps and weight decay that give torch's fused AdamW kernel `group`'s update at `step`.

    The kernel always corrects Adam's bias: it moves a weight by lr / c1 x m / (sqrt(v) / sqrt(c2) + eps), with
    c = 1 - beta^step. Without correction (PopTorch's `bias_correction=False`, Optimum Graphcore's AdamW) the
    update is lr x m / (sqrt(v) + eps): the same expression with lr x c1 / sqrt(c2) and eps / sqrt(c2) given,
    and the weight decay scaled so that the kernel's lr x weight_decay stays the group's. The same rule as
    `AdamW._step_one`, at the speed of one fused pass; fp32 operations in another order, as with correction.
    """
    lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
    if group["bias_correction"]:
        return {"lr": lr, "eps": eps, "weight_decay": decay}
    beta1, beta2 = group["betas"]
    root_c2 = math.sqrt(1 - beta2**step) if beta2 else 1.0
    kernel_lr = lr * (1 - beta1**step) / root_c2
    return {"lr": kernel_lr, "eps": eps / root_c2, "weight_decay": decay * lr / kernel_lr if kernel_lr else decay}


class LAMB(IPUOptimizer):
    """LAMB: Adam's direction scaled per tensor by the trust ratio ||w|| / ||update||.

    Args:
        params, lr, betas, eps, weight_decay: as AdamW.
        bias_correction: False gives `--lamb_no_bias_correction`.
        max_weight_norm: clip ||w|| in the trust ratio (None: no clipping).
        accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type,
            stochastic_rounding: as AdamW.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        bias_correction: bool = True,
        max_weight_norm: float | None = None,
        accum_type: torch.dtype = torch.float32,
        first_order_momentum_accum_type: torch.dtype = torch.float32,
        second_order_momentum_accum_type: torch.dtype = torch.float32,
        stochastic_rounding: bool = True,
        seed: int = 0,
    ):
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
            max_weight_norm=max_weight_norm, stochastic_rounding=stochastic_rounding,
            **_state_types(accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type),
        )  # fmt: skip
        super().__init__(params, defaults, seed)

    @torch.no_grad()
    def step(self, closure=None, gradients=None):
        """One update; `gradients` maps fp16 parameters to their fp32 gradients (see module doc)."""
        loss = closure() if closure is not None else None
        with self._with_gradients(gradients):
            self._lamb_step()
        return loss

    def _lamb_step(self) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                grad = self._grad(p)
                if grad is None:
                    continue
                exp_avg, exp_avg_sq, step = self._moments(p, group)
                m, v = self._update_moments(exp_avg, exp_avg_sq, grad, beta1, beta2)
                if group["bias_correction"]:
                    m = m / (1 - beta1**step)
                    v = v / (1 - beta2**step)
                weight = p.float()
                update = m / (v.sqrt() + group["eps"]) + group["weight_decay"] * weight
                w_norm = weight.norm()
                if group["max_weight_norm"] is not None:
                    w_norm = w_norm.clamp(max=group["max_weight_norm"])
                u_norm = update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                weight.sub_(update * (group["lr"] * trust))
                write_back(p, weight, group["stochastic_rounding"], self._generator(p.device))
