"""fp16 compute at fp32 speed on hosts without fp16 arithmetic: the IPU's matmuls with fp32 partials.

An IPU trains with fp16 weights, activations and gradients, and its matrix units (AMP, SLIC)
multiply fp16 values with fp32 partial sums before writing an fp16 result. Most CPUs have no fp16
arithmetic: torch's fp16 matrix multiply runs at 1-3 GFLOP/s there against 50-100 in fp32 (AMD Zen
1-4, Intel client parts, older Xeons; only AVX512-FP16 or AMX parts are fast), so a plain `.half()`
model trains 4-40x slower than in fp32.

`FP32PartialsMode` is a `TorchFunctionMode`: while it is active, every call of a function of the
matmul family (`F.linear`, `@` / `torch.matmul`, `bmm`, `addmm`, `baddbmm`, `einsum`, the
convolutions, `F.scaled_dot_product_attention`; `_CONVERTED` lists them) that has an fp16 tensor
argument is computed from exact fp32 copies of its tensors, and its result is rounded to fp16. That
is the IPU's arithmetic for these ops (fp16 values, fp32 partials, fp16 result); it is bit-identical
on every CPU (fp32 products of fp16 values are exact; only the fp32 summation order may differ between
BLAS builds) and runs at fp32 speed. Tensors stay fp16 in memory. Functions outside the family keep
torch's fp16 kernels, which compute each element in fp32 and round it once, as an IPU's fp16 vertex
does; measured on an AVX2 CPU they run within 1.6x of fp32.

The backward of a converted call is the fp32 graph its forward built: the gradient that reaches the
call's fp16 output is copied to fp32 once, the fp32 graph runs natively (no Python per backward op),
and each input's gradient is rounded to fp16 once. Those are the same values as converting each
backward matmul on its own (`test_fp16_compute.py` checks it bit for bit against written-out
references), but the backward of a whole model runs without leaving torch's engine. The cost is
memory: a converted call keeps the fp32 copies of its inputs until its backward (twice their fp16
size). With gradients off (inference, evaluation) nothing is kept.

The weights are converted once per block, not once per call: given the model's weights, the mode
keeps the fp32 copy of each weight's storage for as long as it is active (one device iteration of
training, GA micro-batches' forwards and backwards with the weights unchanged, or one inference
call) and reads every view of it from that copy. A weight changed in place while the mode is active
(its version counter moves) is converted again. Other tensors (activations) are converted at every
call: one can be rewritten without its version counter moving (a pipeline stage's receive buffer,
written by the communication backend), so no copy of one is trusted past the call that made it.

Only Python-level calls are seen: a matmul that torch runs from inside another C++ op (an RNN, the
fused fast path of `nn.MultiheadAttention` in evaluation) keeps torch's fp16 kernel. Its values are
the same (fp32 accumulation, one rounding); only its speed is torch's.

`enable_half_partials` (Optimum Graphcore's default True) asks the IPU to accumulate matmul partials
in fp16. This backend does not emulate that: partial sums are fp32, which is at least as accurate,
and the trainer says so once in the log and in the compile report.

The mode is chosen per run by `resolve_fp16_compute`: "emulated" (this layer) on CPUs by default,
"native" (torch's fp16 kernels) on CUDA; the training argument `--fp16_compute` or the environment
variable `OPTIMUM_IPU_FP16_COMPUTE` forces either.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Iterator

import torch
from torch.autograd.function import once_differentiable
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

__all__ = [
    "FP16_COMPUTE_CHOICES",
    "FP32PartialsMode",
    "fp16_compute_context",
    "recomputed_in_same_mode",
    "resolve_fp16_compute",
]

ENVIRONMENT_VARIABLE = "OPTIMUM_IPU_FP16_COMPUTE"
FP16_COMPUTE_CHOICES = ("auto", "emulated", "native")


def _functions(*names: str) -> frozenset:
    """The functions named `module.attribute` that exist in this torch build (a few are recent)."""
    found = set()
    for name in names:
        owner, _, attribute = name.rpartition(".")
        module = {"torch": torch, "Tensor": torch.Tensor, "F": torch.nn.functional, "linalg": torch.linalg}[
            owner
        ]
        if hasattr(module, attribute):
            found.add(getattr(module, attribute))
    return frozenset(found)


# The matmul family as Python calls it: functions and the Tensor methods that reach the same kernels.
_CONVERTED = _functions(
    "F.linear", "F.bilinear", "torch.matmul", "Tensor.matmul", "Tensor.__matmul__", "Tensor.__rmatmul__",
    "linalg.matmul", "torch.mm", "Tensor.mm", "torch.bmm", "Tensor.bmm", "torch.addmm", "Tensor.addmm",
    "torch.baddbmm", "Tensor.baddbmm", "torch.addbmm", "Tensor.addbmm", "torch.mv", "Tensor.mv",
    "torch.addmv", "Tensor.addmv", "torch.dot", "Tensor.dot", "torch.inner", "Tensor.inner",
    "torch.einsum", "torch.tensordot", "F.conv1d", "F.conv2d", "F.conv3d", "F.conv_transpose1d",
    "F.conv_transpose2d", "F.conv_transpose3d", "F.scaled_dot_product_attention",
)  # fmt: skip


def _tensors_of(args, kwargs) -> list[torch.Tensor]:
    """The tensors among the arguments, in order: positional ones (also inside a list), then keywords."""
    found = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def _with_tensors(args, kwargs, tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
    """`args` and `kwargs` with their tensors replaced, in `_tensors_of`'s order, by `tensors`."""
    replacements = iter(tensors)

    def swap(value):
        if isinstance(value, torch.Tensor):
            return next(replacements)
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            return type(value)(next(replacements) if isinstance(v, torch.Tensor) else v for v in value)
        return value

    new_args = tuple(swap(a) for a in args)
    return new_args, {key: swap(value) for key, value in kwargs.items()}


class FP32PartialsMode(TorchFunctionMode):
    """Compute fp16 matmuls, convolutions and attention from fp32 copies; round results to fp16.

    Only calls with at least one fp16 tensor argument are converted, so an fp32 model (or fp32 parts
    of a model, such as a loss computed in fp32) runs unchanged under the mode. `out=` calls are left
    to torch's kernel (none appears in transformers' forward).
    """

    def __init__(self, weights: Iterable[torch.Tensor] = ()):
        super().__init__()
        # Held for the mode's life, so no other tensor can get a weight's storage address meanwhile.
        self._weights = {
            w.untyped_storage().data_ptr(): w for w in weights if w.dtype == torch.float16 and w.numel()
        }
        self._fp32: dict[int, tuple[int, torch.Tensor]] = {}  # weight storage address -> (version, copy)

    def _up(self, value: torch.Tensor) -> torch.Tensor:
        """An fp16 tensor as fp32; a view of a weight from its storage's copy. Other tensors as they are."""
        if value.dtype != torch.float16:
            return value
        address = value.untyped_storage().data_ptr()
        version = _version(value) if address in self._weights else None
        if version is None:  # not a weight, or no version counter to prove it unchanged
            return value.float()
        cached = self._fp32.get(address)
        if cached is None or cached[0] != version:
            cached = self._fp32[address] = (version, _storage_as_fp32(value))
        return cached[1].as_strided(value.size(), value.stride(), value.storage_offset())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _CONVERTED or "out" in kwargs:
            return func(*args, **kwargs)
        tensors = _tensors_of(args, kwargs)
        if not any(t.dtype == torch.float16 for t in tensors):
            return func(*args, **kwargs)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return _FP32Call.apply(self, func, args, kwargs, *tensors)
        fp32_args, fp32_kwargs = _with_tensors(args, kwargs, [self._up(t) for t in tensors])
        return func(*fp32_args, **fp32_kwargs).half()


def _as_saved(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class _FP32Call(torch.autograd.Function):
    """One converted call: its fp32 graph is built in forward and run by backward.

    The fp32 graph keeps what it saves itself, out of reach of saved-tensor hooks around the call (a
    recomputation checkpoint's): a checkpoint would otherwise recompute its block again from inside
    this call's backward, once per converted call, and the fp32 graph's saves belong to no block.
    """

    @staticmethod
    def forward(ctx, mode: FP32PartialsMode, func, args, kwargs, *tensors):
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_as_saved, _as_saved):
            copies = [mode._up(t).detach().requires_grad_(t.requires_grad) for t in tensors]
            fp32_args, fp32_kwargs = _with_tensors(args, kwargs, copies)
            out = func(*fp32_args, **fp32_kwargs)
        ctx.copies, ctx.out, ctx.dtypes = copies, out, [t.dtype for t in tensors]
        return out.detach().half()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        wanted = [c for c in ctx.copies if c.requires_grad]
        grads = iter(torch.autograd.grad(ctx.out, wanted, grad.float()))
        rounded = [next(grads).to(d) if c.requires_grad else None for c, d in zip(ctx.copies, ctx.dtypes)]
        return (None, None, None, None, *rounded)


def recomputed_in_same_mode(function: Callable) -> Callable:
    """`function` (about to be checkpointed) made to recompute under the fp16 compute of its forward.

    torch runs a backward with torch function modes switched off, so a recomputation (the forward of
    a checkpointed block, run again inside the backward) would leave `FP32PartialsMode` and compute in
    torch's fp16 kernels: slower, other bits in the last place, and refused by torch's non-reentrant
    checkpoint, which compares what the recomputation saves with what the forward saved. Every
    `torch.utils.checkpoint.checkpoint` of a forward that may run under the mode passes its function
    through this: called while the mode is switched off, it switches the forward's mode back on.
    """
    mode = next(
        (m for m in reversed(_get_current_function_mode_stack()) if isinstance(m, FP32PartialsMode)), None
    )
    if mode is None:
        return function

    @functools.wraps(function)
    def run(*args, **kwargs):
        if torch._C._is_torch_function_mode_enabled():  # the forward itself: the mode is already on
            return function(*args, **kwargs)
        with mode:
            return function(*args, **kwargs)

    return run


def recompute_transformers_checkpoints_in_same_mode(model: torch.nn.Module) -> None:
    """Make transformers' own gradient checkpointing (if enabled on `model`) recompute under the mode.

    transformers keeps the checkpoint function of a layer in `_gradient_checkpointing_func`; each is
    wrapped once so that the function it checkpoints goes through `recomputed_in_same_mode`.
    """
    for module in model.modules():
        checkpoint = getattr(module, "_gradient_checkpointing_func", None)
        if checkpoint is None or getattr(checkpoint, "_recomputes_in_same_mode", False):
            continue

        def same_mode(function, *args, _checkpoint=checkpoint, **kwargs):
            return _checkpoint(recomputed_in_same_mode(function), *args, **kwargs)

        same_mode._recomputes_in_same_mode = True
        module._gradient_checkpointing_func = same_mode


def _storage_as_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """The whole fp16 storage under `tensor`, as a flat fp32 tensor (any view of it is a stride away)."""
    storage = tensor.untyped_storage()
    whole = torch.empty(0, dtype=torch.float16, device=tensor.device)
    return whole.set_(storage, 0, (storage.nbytes() // 2,), (1,)).float()


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter (moves on every in-place write), None where it has none."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def resolve_fp16_compute(requested: str | None, device: torch.device | str) -> str:
    """Pick "emulated" or "native" fp16 compute for a run on `device`.

    Args:
        requested: "auto", "emulated", "native", or None (= "auto"). A non-auto value wins; else the
            environment variable `OPTIMUM_IPU_FP16_COMPUTE`; else the device decides: "native" on
            CUDA (its fp16 units are fast), "emulated" elsewhere (same bits on every CPU).

    Raises:
        ValueError: for a value outside `FP16_COMPUTE_CHOICES`, naming where it came from.
    """
    source = "--fp16_compute"
    choice = requested or "auto"
    if choice == "auto" and os.environ.get(ENVIRONMENT_VARIABLE):
        choice, source = os.environ[ENVIRONMENT_VARIABLE].strip().lower(), ENVIRONMENT_VARIABLE
    if choice not in FP16_COMPUTE_CHOICES:
        raise ValueError(
            f"{source}={choice!r} is not a fp16 compute mode: use one of {', '.join(FP16_COMPUTE_CHOICES)} "
            "(emulated: fp16 values computed with fp32 partials, fast on any CPU; native: torch's fp16 kernels)."
        )
    if choice == "auto":
        return "native" if torch.device(device).type == "cuda" else "emulated"
    return choice


@contextlib.contextmanager
def fp16_compute_context(mode: str, weights: Iterable[torch.Tensor] = ()) -> Iterator[None]:
    """Run the enclosed forward/backward with `mode` ("emulated" enters `FP32PartialsMode`).

    Args:
        weights: tensors that stay the same inside the block (the model's parameters): converted to
            fp32 once for the block instead of at every op that reads them.
    """
    if mode == "emulated":
        with FP32PartialsMode(weights):
            yield
    else:
        yield
