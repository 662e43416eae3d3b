"""fp16 compute at fp32 speed on hosts without fp16 arithmetic: the IPU's matmuls with fp32 partials.

An IPU trains with fp16 weights, activations and gradients, and its matrix units (AMP, SLIC)
multiply fp16 values with fp32 partial sums before writing an fp16 result. Most CPUs have no fp16
arithmetic: torch's fp16 matrix multiply runs at 1-3 GFLOP/s there against 50-100 in fp32 (AMD Zen
1-3, Intel client parts, older Xeons; only AVX512-FP16 or AMX parts are fast), so a plain `.half()`
model trains 15-40x slower than in fp32.

`FP32PartialsMode` is a `TorchDispatchMode`: while it is active, every aten op of the matmul family
(forward and backward, as autograd runs them) whose inputs are fp16 is computed from exact fp32
copies of those inputs and its result is rounded to fp16. That is the IPU's arithmetic for these ops
(fp16 values, fp32 partials, fp16 result), it is bit-identical on every CPU (fp32 products of fp16
values are exact; only the fp32 summation order may differ between BLAS builds), and it runs at fp32
speed. Tensors stay fp16 in memory. Ops outside the family keep their fp16 kernels: measured on an
AVX2 CPU, fp16 elementwise ops, softmax and layer norm run within 1.6x of fp32 (gelu is the worst),
while matmuls are ~40x and CPU flash attention 3x slower; converting the cheap ones would cost more
in casts than it saves.

The weights are converted once per block, not once per op: given the model's weights, the mode
keeps the fp32 copy of each weight's storage for as long as it is active (one device iteration of
training, GA micro-batches' forwards and backwards with the weights unchanged, or one inference
call) and reads every view of it (the transposed weight of a forward, the weight of an input
gradient) from that copy. A weight changed in place while the mode is active (its version counter
moves) is converted again. The values are the same as converting per op, so results are bit-identical;
the cost is the fp32 copies held while the block runs (twice the fp16 weights' size). Other tensors
(activations, gradients) are converted at every op: one can be rewritten without its version counter
moving (a pipeline stage's receive buffer, written by the communication backend), so no copy of one
is trusted past the op that made it.

`enable_half_partials` (Optimum Graphcore's default True) asks the IPU to accumulate matmul partials
in fp16. This backend does not emulate that: partial sums are fp32, which is at least as accurate,
and the trainer says so once in the log and in the compile report.

The mode is chosen per run by `resolve_fp16_compute`: "emulated" (this layer) on CPUs by default,
"native" (torch's fp16 kernels) on CUDA; the training argument `--fp16_compute` or the environment
variable `OPTIMUM_IPU_FP16_COMPUTE` forces either.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["FP16_COMPUTE_CHOICES", "FP32PartialsMode", "fp16_compute_context", "resolve_fp16_compute"]

ENVIRONMENT_VARIABLE = "OPTIMUM_IPU_FP16_COMPUTE"
FP16_COMPUTE_CHOICES = ("auto", "emulated", "native")

_aten = torch.ops.aten


def _ops(*names: str) -> frozenset:
    """The overload packets that exist in this torch build (names differ a little across releases)."""
    return frozenset(getattr(_aten, name) for name in names if hasattr(_aten, name))


# Whole overload packets: every overload (.default, .out excluded below) of these ops is converted.
_CONVERTED = _ops(
    "mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "_addmm_activation",
    "convolution", "convolution_backward",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_attention_math",
)  # fmt: skip
# Outputs that are fp32 in torch's own fp16 kernels (the attention's log-sum-exp): left fp32.
_FP32_OUTPUTS = {"_scaled_dot_product_flash_attention_for_cpu": (1,)}


def _down(value, index: int, keep: tuple[int, ...]):
    if isinstance(value, torch.Tensor) and value.dtype == torch.float32 and index not in keep:
        return value.half()
    return value


class FP32PartialsMode(TorchDispatchMode):
    """Compute fp16 matmuls, convolutions and attention from fp32 copies; round results to fp16.

    Only ops with at least one fp16 tensor input are converted, so an fp32 model (or fp32 parts of
    a model, such as a loss computed in fp32) runs unchanged under the mode. In-place and `out=`
    variants are left alone (none of them appears in transformers' forward or backward).
    """

    def __init__(self, weights: Iterable[torch.Tensor] = ()):
        super().__init__()
        # Held for the mode's life, so no other tensor can get a weight's storage address meanwhile.
        self._weights = {
            w.untyped_storage().data_ptr(): w for w in weights if w.dtype == torch.float16 and w.numel()
        }
        self._fp32: dict[int, tuple[int, torch.Tensor]] = {}  # weight storage address -> (version, copy)

    def _up(self, value):
        """fp16 tensors (also inside lists and tuples) as fp32; a view of a weight from its storage's copy."""
        if isinstance(value, torch.Tensor) and value.dtype == torch.float16:
            address = value.untyped_storage().data_ptr()
            version = _version(value) if address in self._weights else None
            if version is None:  # not a weight, or no version counter to prove it unchanged
                return value.float()
            cached = self._fp32.get(address)
            if cached is None or cached[0] != version:
                cached = self._fp32[address] = (version, _storage_as_fp32(value))
            return cached[1].as_strided(value.size(), value.stride(), value.storage_offset())
        if isinstance(value, (list, tuple)):
            return type(value)(self._up(v) for v in value)
        return value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        # CPU flash attention with a mask insists on its own dtype rules: masked attention stays native.
        masked = packet.__name__.startswith("_scaled_dot_product") and kwargs.get("attn_mask") is not None
        if packet in _CONVERTED and not masked and "out" not in kwargs and _has_half(args):
            out = func(*self._up(args), **self._up(kwargs))
            keep = _FP32_OUTPUTS.get(packet.__name__, ())
            if isinstance(out, (tuple, list)):
                return type(out)(_down(o, i, keep) for i, o in enumerate(out))
            return _down(out, 0, keep)
        return func(*args, **kwargs)


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


def _has_half(args) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.dtype == torch.float16:
                return True
        elif isinstance(a, (list, tuple)) and _has_half(a):
            return True
    return False


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
