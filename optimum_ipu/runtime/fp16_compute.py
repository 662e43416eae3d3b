"""fp16 compute at fp32 speed on hosts without fp16 arithmetic: the IPU's matmuls with fp32 partials.

An IPU trains with fp16 weights, activations and gradients, and its matrix units (AMP, SLIC)
multiply fp16 values with fp32 partial sums before writing an fp16 result. Most CPUs have no fp16
arithmetic: torch's fp16 matrix multiply runs at 1-3 GFLOP/s there against 50-100 in fp32 (AMD Zen
1-3, Intel client parts, older Xeons; only AVX512-FP16 or AMX parts are fast), so a plain `.half()`
model trains 15-40x slower than in fp32.

`FP32Partials` is a context: while it is active, every op of the matmul family (`mm`, `addmm`,
`bmm`, `baddbmm`, `mv`, `addmv`, `dot`, `convolution`, CPU flash attention) called with an fp16
input is computed from exact fp32 copies of its inputs, and its result is rounded to fp16. The
copies and the rounding are ordinary autograd ops, so the op's backward runs in fp32 on those
copies and each gradient is rounded to fp16 where it leaves the op. That is the IPU's arithmetic
for these ops in both directions (fp16 values, fp32 partials, fp16 result), bit-identical on every
CPU (fp32 products of fp16 values are exact; only the fp32 summation order may differ between BLAS
builds), at fp32 speed. Ops outside the family keep torch's fp16 kernels: measured on an AVX2 CPU,
fp16 elementwise ops, softmax and layer norm run within 1.6x of fp32, while matmuls are ~40x and CPU
flash attention 3x slower.

How the ops are caught: a dispatch key of torch's own, `AutocastIPU` (the autocast slot PyTorch
keeps for IPUs, unused on CPUs and GPUs), is switched on for the context's thread. Kernels for the
ops above are registered on it once per process; every other op falls through it inside torch's
dispatcher, without a Python call. The key sits above autograd, as autocast's do, which is why the
fp32 copies and the rounding are recorded by autograd. (A `TorchDispatchMode` would see every op,
forward and backward, in Python: the layer cost more than the arithmetic on small models.)

Memory: an op's backward keeps its fp32 input copies (twice the fp16 size) instead of the fp16
inputs. Weights declared to the context are copied to fp32 once for the context (one device
iteration of training with several micro-batches on unchanged weights, or one inference call) and
every op and micro-batch reads that copy; a weight changed in place (its version counter moves) is
copied again. Declared weights of fewer than `CACHED_WEIGHT_ELEMENTS` elements are copied per op, where
the copy costs less than the bookkeeping. Within one host call of several device iterations
(`fp32_memory_of_updates`), the memory of an update's fp32 working copies (idle until the next update)
takes the next device iteration's copies of the same weights (`lend_fp32_memory`), instead of fresh
memory each update (a PopTorch MLP at micro-batch 16 x GA 2 x 4 device iterations: docs/benchmarks.md).
Around a block of host calls on weights that do not change
between them (an evaluation loop, the inputs of one pipeline call), `held_fp32_copies` keeps the copies
for the whole block, so each call reads them instead of copying every weight again: a text-classification
pipeline at BERT-base's size on a list of 8 inputs of 128 tokens ran 1.24-1.32x faster for it
(`bench/inference_blocks.py`).

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
import threading
from collections.abc import Callable, Iterable, Iterator

import torch

__all__ = [
    "FP16_COMPUTE_CHOICES",
    "FP32Partials",
    "fp16_compute_context",
    "active_fp32_partials",
    "fp32_memory_of_updates",
    "held_fp32_copies",
    "lend_fp32_memory",
    "resolve_fp16_compute",
]

ENVIRONMENT_VARIABLE = "OPTIMUM_IPU_FP16_COMPUTE"
FP16_COMPUTE_CHOICES = ("auto", "emulated", "native")
CACHED_WEIGHT_ELEMENTS = 1 << 16

_KEY = getattr(torch._C.DispatchKey, "AutocastIPU", None)
_KEYSET = torch._C.DispatchKeySet(_KEY) if _KEY is not None else None
_aten = torch.ops.aten


def _ops(*names: str) -> frozenset:
    """The default overloads of the ops that exist in this torch build (names differ across releases)."""
    return frozenset(getattr(_aten, name).default for name in names if hasattr(_aten, name))


# Only the default overloads: `out=` variants write into the caller's tensor with torch's kernel, and the
# `dtype` overloads choose their own output type.
_CONVERTED = _ops(
    "mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "_addmm_activation", "convolution",
    "_scaled_dot_product_flash_attention_for_cpu",
)  # fmt: skip
# Outputs that are fp32 in torch's own fp16 kernels (the attention's log-sum-exp): left fp32.
_FP32_OUTPUTS = {"_scaled_dot_product_flash_attention_for_cpu": (1,)}

# .active: the innermost FP32Partials of this thread, or None; .held: the copies of a `held_fp32_copies` block;
# .lent: fp32 memory lent for weights' copies within `fp32_memory_of_updates` (storage address -> entry)
_state = threading.local()
_registrations: list[torch.library.Library] = []
_registering = threading.Lock()


class _ReadCopy(torch.autograd.Function):
    """A declared weight read from its fp32 copy: the copy forward, the gradient rounded to fp16 backward
    (what `weight.float()` records, without copying the weight again)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
        return copy

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(torch.float16), None


class FP32Partials:
    """Compute fp16 matmuls, convolutions and attention from fp32 copies; round results to fp16.

    Args:
        weights: tensors that stay the same inside the context (the model's parameters): copied to
            fp32 once for the context instead of at every op that reads them.

    Only ops with at least one fp16 tensor input are converted, so an fp32 model (or fp32 parts of
    a model, such as a loss computed in fp32) runs unchanged in the context. Contexts nest; the
    innermost one's weights are used.
    """

    def __init__(self, weights: Iterable[torch.Tensor] = ()):
        self.weights = [w for w in weights if w.dtype == torch.float16]
        self._cached = {w.untyped_storage().data_ptr(): w for w in self.weights if _worth_keeping(w)}
        # Their storages, held for the context's life, so no other storage can take one's address meanwhile,
        # not even new data given to a weight (`p.data = ...` keeps p's version counter).
        self._storages = [w.untyped_storage() for w in self._cached.values()]
        self._fp32: dict[int, tuple[int, torch.Tensor]] = {}  # weight storage address -> (version, copy)
        self._saved: list[tuple[object, bool, bool]] = []

    def __enter__(self) -> FP32Partials:
        _register_kernels()
        if not self._saved:
            self._fp32 = self._block_copies()
        self._saved.append((
            getattr(_state, "active", None),
            torch._C._dispatch_tls_is_dispatch_key_included(_KEY),
            torch._C._dispatch_tls_is_dispatch_key_excluded(_KEY),
        ))  # fmt: skip
        _state.active = self
        torch._C._dispatch_tls_set_dispatch_key_included(_KEY, True)
        torch._C._dispatch_tls_set_dispatch_key_excluded(_KEY, False)
        return self

    def __exit__(self, *exc) -> None:
        active, included, excluded = self._saved.pop()
        _state.active = active
        torch._C._dispatch_tls_set_dispatch_key_included(_KEY, included)
        torch._C._dispatch_tls_set_dispatch_key_excluded(_KEY, excluded)
        if not self._saved:
            self._fp32 = {}

    def _block_copies(self) -> dict[int, tuple[int, torch.Tensor]]:
        """Where this context keeps its copies: those of the enclosing `held_fp32_copies` block when the block
        holds every weight declared here (the same tensors, at the same addresses), else its own."""
        held = _held()
        if held is not None and self._cached and all(held._cached.get(a) is w for a, w in self._cached.items()):
            return held._fp32
        return {}

    def _up(self, tensor: torch.Tensor) -> torch.Tensor:
        """An fp16 tensor as an autograd-recorded fp32 copy; a view of a declared weight from its storage's copy."""
        if not self._cached:
            return tensor.float()
        address = tensor.untyped_storage().data_ptr()
        version = _version(tensor) if address in self._cached else None
        if version is None:  # not a declared weight, or no version counter to prove it unchanged
            return tensor.float()
        cached = self._fp32.get(address)
        if cached is None or cached[0] != version:
            into = _lent_memory(tensor) if cached is None else None  # a second copy: the graph may hold the first
            cached = self._fp32[address] = (version, _storage_as_fp32(tensor, into))
        copy = cached[1].as_strided(tensor.size(), tensor.stride(), tensor.storage_offset())
        return _ReadCopy.apply(tensor, copy) if tensor.requires_grad and torch.is_grad_enabled() else copy


_UNDECLARED = FP32Partials()


def active_fp32_partials() -> FP32Partials | None:
    """This thread's innermost `FP32Partials` context, None outside one."""
    return getattr(_state, "active", None)


def _held() -> FP32Partials | None:
    """The weights and copies of this thread's innermost `held_fp32_copies` block, None outside one."""
    return getattr(_state, "held", None)


@contextlib.contextmanager
def held_fp32_copies(mode: str | None, weights: Iterable[torch.Tensor]) -> Iterator[Callable[[], None]]:
    """Around a block of host calls that do not change `weights` (an evaluation loop, the inputs of one
    pipeline call): each call's `fp16_compute_context` on them reads fp32 copies made once for the block,
    not once per call. Nothing to hold unless `mode` is "emulated".

    A weight written in place through itself meanwhile (its version counter moves), or given new data
    (`p.data = ...`), is copied again; a write through `p.data` or numpy is not seen, as within one
    context. Yields `release`, which lets the copies go before the block ends (before work that needs
    the memory, such as an evaluation's metrics); they are let go at its end in any case.
    """
    if mode != "emulated":
        yield lambda: None
        return
    block, outer = FP32Partials(weights), _held()
    block._fp32 = block._block_copies()  # within a block holding the same weights: its copies, not a second set
    _state.held = block
    try:
        yield block._fp32.clear  # the contexts share this dict: emptied for them all
    finally:
        _state.held = outer
        block._fp32 = {}


@contextlib.contextmanager
def fp32_memory_of_updates() -> Iterator[None]:
    """Around one host call of training: memory that an update's fp32 working copies leave idle until the next
    update (`lend_fp32_memory`) takes the fp32 copies the next micro-batches make of the same weights. The
    copies are made as ever (from the fp16 weights, at their first read in the update), into memory in use
    since the last update instead of fresh pages each update (a page fault per 4 KiB on many hosts).

    The memory is lent for the call only, and for one copy per lending: a weight written in place within the
    context, or declared again by a context nested in it, is copied into fresh memory, as the graph may still
    hold the first copy.
    """
    outer = getattr(_state, "lent", None)
    _state.lent = {}
    try:
        yield
    finally:
        _state.lent = outer


def lend_fp32_memory(weights: list[torch.Tensor], buffers: list[torch.Tensor]) -> None:
    """Within `fp32_memory_of_updates`: `buffers` (fp32, each as large as its fp16 weight's whole storage; the
    caller's, idle until the weights' next update, when the caller overwrites them) may hold the fp32 copies
    the converted ops make of `weights` until then. Only weights whose copy is kept for several reads
    (`CACHED_WEIGHT_ELEMENTS` or more) are lent memory; the rest are copied per op."""
    lent = getattr(_state, "lent", None)
    if lent is None:
        return
    for w, b in zip(weights, buffers):
        storage = w.untyped_storage()
        if (w.dtype == torch.float16 and b.dtype == torch.float32 and b.device == w.device and b.is_contiguous()
                and 2 * b.numel() == storage.nbytes() and _worth_keeping(w)):  # fmt: skip
            # The storage is held with its entry, so no other tensor can take its address within the call,
            # not even new data given to the weight (`p.data = ...`).
            lent[storage.data_ptr()] = (b.view(-1), storage)


def _lent_memory(tensor: torch.Tensor) -> torch.Tensor | None:
    """The fp32 memory lent for a copy of `tensor`'s whole storage, None where none is. Taken once: the graph of
    the context that takes it may hold the copy until the lender's next update, so a second context (one nested
    in the first, declaring the same weight) makes its copy in fresh memory."""
    lent = getattr(_state, "lent", None)
    entry = lent.pop(tensor.untyped_storage().data_ptr(), None) if lent else None
    return entry[0] if entry is not None else None


def _kernel(op: torch._ops.OpOverload):
    """The kernel of `op` on the key (registered once per process): `_run_converted` with `op`'s facts.

    The op is called again through torch's generated binding (`torch.convolution`, ...) where there is
    one: it parses its arguments in C++, several microseconds faster per call than the `OpOverload`,
    which counts on small models (the default overload is the one those arguments select).
    """
    name = op.overloadpacket.__name__
    keep = _FP32_OUTPUTS.get(name, ())
    attention = name.startswith("_scaled_dot_product")
    call = getattr(torch._C._VariableFunctions, name, op)
    half = torch.float16

    def kernel(*args, **kwargs):
        for a in args:
            if isinstance(a, torch.Tensor) and a.dtype == half:
                return _run_converted(call, keep, attention, args, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_KEYSET):  # no fp16 input: the op as it is
            return call(*args, **kwargs)

    return kernel


def _run_converted(op, keep: tuple[int, ...], attention: bool, args: tuple, kwargs: dict):
    """`op` from fp32 copies of its fp16 inputs, results rounded to fp16 (except outputs `keep`);
    masked attention runs as it is.

    The ops converted take their tensors as positional arguments, none in lists. The key is on only
    inside a context, or in a thread autograd runs a backward on for it (the key travels with
    autograd's thread-local state, the context object does not): there, no declared weights.
    """
    context = getattr(_state, "active", None) or _UNDECLARED
    with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
        # CPU flash attention with a mask insists on its own dtype rules: masked attention stays native.
        if attention and kwargs.get("attn_mask") is not None:
            return op(*args, **kwargs)
        converted = [
            context._up(a) if isinstance(a, torch.Tensor) and a.dtype == torch.float16 else a for a in args
        ]
        out = op(*converted, **kwargs)
        if isinstance(out, (tuple, list)):
            return type(out)(_down(o, i, keep) for i, o in enumerate(out))
        return _down(out, 0, keep)


def _register_kernels() -> None:
    """Register the kernels on the key, and a fall-through for every other op (once per process)."""
    if _registrations:
        return
    if not (hasattr(torch._C.DispatchKey, "AutocastIPU") and hasattr(torch.library.Library, "fallback")):
        raise RuntimeError(
            f"Emulated fp16 compute needs torch's AutocastIPU dispatch key and torch.library fallbacks, which "
            f"torch {torch.__version__} lacks (torch 2.13 is tested). Upgrade torch, or use --fp16_compute native "
            "(OPTIMUM_IPU_FP16_COMPUTE=native) to run torch's own fp16 kernels."
        )
    with _registering:
        if _registrations:
            return
        fallthrough = torch.library.Library("_", "IMPL")
        fallthrough.fallback(torch.library.fallthrough_kernel, _KEY.name)
        kernels = torch.library.Library("aten", "IMPL")
        for op in _CONVERTED:
            kernels.impl(op.name().removeprefix("aten::"), _kernel(op), _KEY.name)
        _registrations.extend([fallthrough, kernels])


def _down(value, index: int, keep: tuple[int, ...]):
    if isinstance(value, torch.Tensor) and value.dtype == torch.float32 and index not in keep:
        return value.half()
    return value


def _worth_keeping(weight: torch.Tensor) -> bool:
    """Whether a weight's fp32 copy is worth keeping for several reads: for a smaller one, a copy per op that
    reads it costs less than the bookkeeping (and, on a kept copy, a Python autograd call per read)."""
    return weight.numel() >= CACHED_WEIGHT_ELEMENTS


def _storage_as_fp32(tensor: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
    """The whole fp16 storage under `tensor`, as a flat fp32 tensor (any view of it is a stride away): new
    memory, or `into` (flat, as many elements as the storage)."""
    storage = tensor.untyped_storage()
    whole = torch.empty(0, dtype=torch.float16, device=tensor.device)
    whole.set_(storage, 0, (storage.nbytes() // 2,), (1,))
    if into is None or into.numel() != whole.numel():  # the storage resized since the memory was lent
        return whole.float()
    return into.copy_(whole)


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
    """Run the enclosed forward/backward with `mode` ("emulated" enters `FP32Partials`).

    Args:
        weights: tensors that stay the same inside the block (the model's parameters): converted to
            fp32 once for the block instead of at every op that reads them.
    """
    if mode == "emulated":
        with FP32Partials(weights):
            yield
    else:
        yield
