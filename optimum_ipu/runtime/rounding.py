"""Stochastic rounding: how the IPU writes an fp32 result into an fp16 weight.

An fp32 value written to fp16 rounds up or down at random, with the probability of each
proportional to the distance, so small updates survive on average instead of being rounded away
(the IPU's training default). Loss scaling lives in `loss_scaling.py`; fp16 compute in
`fp16_compute.py`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import torch

from optimum_ipu._once import warn_once
from optimum_ipu.runtime import rounding_kernel
from optimum_ipu.runtime.rounding_kernel import RoundChunk

logger = logging.getLogger(__name__)

# fp32 has 23 explicit mantissa bits, fp16 has 10: 13 bits are dropped when rounding to half.
_DROPPED_BITS = 13
_DROPPED_MASK = (1 << _DROPPED_BITS) - 1
# Elements rounded per pass on the CPU (even, so each chunk starts on a whole draw): 512 KB of fp32
# plus its noise stays within a core's L2 cache on current x86 CPUs.
_CHUNK = 1 << 17
_checked: dict[str, RoundChunk | None] = {}
_checked_lock = threading.Lock()


def stochastic_round_to_half(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round an fp32 tensor to fp16, up or down at random in proportion to the distance.

    Random bits are added below the fp16 mantissa and then cut off, so E[result] == x for values in
    fp16's normal range. Works on the sign-magnitude bit pattern, hence for both signs. The noise
    cannot reach the exponent bits of an infinity (its low 13 bits are zero) nor of a NaN with the
    quiet bit set (every NaN torch produces), so non-finite values pass through unchanged.
    """
    rounded = x.to(torch.float32, copy=True, memory_format=torch.contiguous_format)
    _round_bits_(rounded, generator)
    return rounded.half()


def _round_bits_(x: torch.Tensor, generator: torch.Generator | None, into: torch.Tensor | None = None) -> None:
    """Add the random bits to a contiguous fp32 `x` and cut them off, in place: afterwards `x` converts
    to fp16 exactly (its 13 low bits are zero), so the conversion is the rounding's last step. With
    `into` (a contiguous fp16 tensor of `x`'s size) each rounded chunk is also converted into it.

    On the CPU the work goes chunk by chunk (`chunk_views`), so the draws, the noise and the slice of `x`
    stay in the core's cache instead of making six passes over weight-sized memory.
    """
    parts = chunk_views(x)
    targets = chunk_views(into) if into is not None else ()
    noise = _Noise(parts)
    for i, part in enumerate(parts):
        noise.round_(part, generator)
        if targets:
            targets[i].copy_(part)


def chunk_views(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A contiguous `tensor`'s elements, flat, as the chunks a weight is rounded and updated in.

    Cache-sized on the CPU (`_CHUNK`), where the generator draws one word per element in order, so the
    chunks take the same draws as one call over the whole weight would; the whole tensor elsewhere (an
    accelerator's generator draws in parallel). Tensors of one size split alike, so the chunks of a
    weight, its gradient and its optimizer state match one to one.
    """
    flat = tensor.view(-1)
    if flat.numel() == 0:
        return ()
    return flat.split(_CHUNK) if tensor.device.type == "cpu" else (flat,)


class _Noise:
    """Scratch for the random low bits of the largest of `parts` (`chunk_views`), reused chunk after chunk.

    One 31-bit draw gives two 16-bit halves, 13 bits of each the noise of one element (half the
    generator calls). On the CPU the compiled kernel (`compiled_rounding`) does the draws, the add and
    the cut in one pass, with the same bits; without it, torch ops do them, and the noise is widened to
    32 bits before the add: torch's int32 += int16 add converts element by element there, several times
    slower than the copy and the add apart; an accelerator adds it as it is (the same bits, without a
    buffer of 4 bytes per weight).
    """

    def __init__(self, parts: tuple[torch.Tensor, ...], compiled: bool = True):
        size = parts[0].numel() if parts else 0
        device = parts[0].device if parts else torch.device("cpu")
        self.size = size
        self.kernel = compiled_rounding() if compiled and device.type == "cpu" and size else None
        if self.kernel is None:
            self._scratch(device)

    def _scratch(self, device: torch.device) -> None:
        self.words = torch.empty((self.size + 1) // 2, dtype=torch.int32, device=device)
        self.halves = self.words.view(torch.int16)[: self.size]
        self.wide = torch.empty(self.size, dtype=torch.int32, device=device) if device.type == "cpu" else None

    def round_(self, part: torch.Tensor, generator: torch.Generator | None) -> None:
        """Stochastically round the contiguous fp32 chunk `part` to fp16 values, in place."""
        if self.kernel is not None:
            # an optimizer's own generator, never the default one other threads may draw from meanwhile
            usable = generator is not None and generator.device.type == "cpu"
            if usable and part.is_contiguous() and part.dtype == torch.float32:
                if self.kernel(part, generator):
                    return
                warn_once(logger, "The compiled stochastic rounding does not read this generator's state; rounding "
                          "with torch's calls (the same values).", key="compiled rounding state")  # fmt: skip
            self.kernel = None  # the rest of this weight on torch's calls
            self._scratch(part.device)
        size = part.numel()
        if size == self.size:  # every chunk but a weight's last: the scratch as it is
            words, halves, noise = self.words, self.halves, self.wide
        else:
            words, halves = self.words[: (size + 1) // 2], self.words.view(torch.int16)[:size]
            noise = self.wide[:size] if self.wide is not None else None
        words.random_(generator=generator)
        halves.bitwise_and_(_DROPPED_MASK)
        noise = noise.copy_(halves) if noise is not None else halves
        bits = part.view(torch.int32)
        bits.add_(noise)
        bits.bitwise_and_(~_DROPPED_MASK)


def compiled_rounding() -> RoundChunk | None:
    """The compiled kernel (`rounding_kernel.py`) once it has given torch's bits here, else None.

    Checked once per process, against `_Noise`'s torch ops on the same values and generator state: chunks
    of odd and even sizes, across several of the generator's 624-word refills, starting mid-stream. A
    kernel that differs in one bit or in the generator state it leaves is not used, and that is said once.
    """
    if not rounding_kernel.wanted():
        return None
    with _checked_lock:
        if "kernel" not in _checked:
            kernel = rounding_kernel.load_rounding_kernel()
            if kernel is not None and not _gives_torch_bits(kernel):
                warn_once(
                    logger,
                    "The compiled stochastic-rounding kernel did not give torch %s's bits on this machine, so "
                    "rounding runs on torch's generator calls (the same values, slower). Please report this.",
                    torch.__version__, key="compiled rounding differs",
                )  # fmt: skip
                kernel = None
            _checked["kernel"] = kernel
        return _checked["kernel"]


def _gives_torch_bits(kernel: RoundChunk) -> bool:
    try:
        return _compare_with_torch(kernel)
    except Exception:  # noqa: BLE001 (a kernel that fails is one that does not give torch's bits)
        return False


def _compare_with_torch(kernel: RoundChunk) -> bool:
    values = torch.randn(4099, generator=torch.Generator().manual_seed(11)) * 3
    values[:4] = torch.tensor([float("inf"), -float("inf"), 0.0, -1e-30])
    ours, theirs = torch.Generator().manual_seed(2026), torch.Generator().manual_seed(2026)
    for generator in (ours, theirs):
        torch.empty(5, dtype=torch.int32).random_(generator=generator)  # mid-stream, not at a refill
    expected, got = values.clone(), values.clone()
    for size in (1, 2, 3, 1249, 4099):
        _Noise((expected[:size],), compiled=False).round_(expected[:size], theirs)
        if not kernel(got[:size], ours):
            return False
    if not (torch.equal(expected.view(torch.int32), got.view(torch.int32)) and torch.equal(ours.get_state(), theirs.get_state())):
        return False
    # a call that starts with the 624 words of a refill all drawn (the next word needs a new refill)
    ours, theirs = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for generator in (ours, theirs):
        torch.empty(624, dtype=torch.int32).random_(generator=generator)
    _Noise((expected[:8],), compiled=False).round_(expected[:8], theirs)
    return kernel(got[:8], ours) and torch.equal(expected.view(torch.int32), got.view(torch.int32)) and torch.equal(
        ours.get_state(), theirs.get_state()
    )


def update_in_chunks(
    param: torch.Tensor, update: Callable[[int, torch.Tensor], None], stochastic_rounding: bool,
    generator: torch.Generator | None = None,
) -> None:
    """Update the contiguous fp16 `param` through fp32 arithmetic, one cache-sized chunk at a time.

    For chunk `i` of `chunk_views(param)`, an fp32 copy of it is handed to `update(i, copy)`, which
    changes the copy in place (an optimizer's step on chunk `i` of its gradient and state, split by
    `chunk_views` alike), and the result is written back as `write_back` writes: stochastically rounded
    from `generator`, or to nearest. The same values, draws and bits as a whole-weight fp32 copy updated
    and then written back, without that copy: a weight-sized working copy costs four bytes per weight and
    two passes through memory.
    """
    parts = chunk_views(param)
    if not parts:
        return
    copy = torch.empty(parts[0].numel(), dtype=torch.float32, device=param.device)
    noise = _Noise(parts) if stochastic_rounding else None
    for i, part in enumerate(parts):
        work = copy if part.numel() == copy.numel() else copy[: part.numel()]
        work.copy_(part)
        update(i, work)
        if noise is not None:
            noise.round_(work, generator)
        part.copy_(work)


def write_back(
    param: torch.Tensor,
    value: torch.Tensor,
    stochastic_rounding: bool,
    generator: torch.Generator | None = None,
) -> None:
    """Store an fp32 `value` into `param`, with stochastic rounding (from `generator`) when `param` is fp16.

    `value` is the caller's working copy, used up here: an fp32 one is rounded in place and converted
    by the copy into `param`, with no temporary as large as the weight (the optimizers' write-back of
    every fp16 weight at every update; the same draws and bits as `stochastic_round_to_half`).
    """
    if param.dtype == torch.float16 and stochastic_rounding:
        if value.dtype == torch.float32 and value.is_contiguous() and value is not param:
            if param.is_contiguous() and param.shape == value.shape and param.device == value.device:
                _round_bits_(value, generator, into=param)
            else:
                _round_bits_(value, generator)
                param.copy_(value)
        else:
            param.copy_(stochastic_round_to_half(value, generator))
    else:
        param.copy_(value)


def draw_rounding_from(optimizer, generators: dict, seed: int) -> None:
    """Draw `optimizer`'s stochastic roundings from `generators` (one per device, made from `seed` on first
    use): a PopTorch model's device generators, which its `randomSeed` starts and which the IPU's roundings
    draw from. Every optimizer the model takes (at compile and at each `setOptimizer`) draws from the same
    ones, so a new optimizer object carries the draws on where the last one left them.
    """
    optimizer.rounding_seed = int(seed)
    optimizer.__dict__["_rounding_generators"] = generators


def rounding_generator(optimizer, device: torch.device | str = "cpu") -> torch.Generator:
    """The stochastic-rounding generator of `optimizer`'s fp16 updates on `device`.

    One per optimizer and device, seeded with the optimizer's `rounding_seed` (0 unless it has one),
    made on first use and kept on the optimizer, so it survives a recompile or `setOptimizer` of the
    same optimizer and a new optimizer starts afresh. Draws are replica-identical: they come from here,
    never from a replica's random stream (`replicas.py`). The one rule of IPUTrainer's optimizers,
    `poptorch.optim`'s and a torch optimizer's fp16 update alike.
    """
    generators = optimizer.__dict__.setdefault("_rounding_generators", {})
    key = str(torch.device(device))
    if key not in generators:
        generators[key] = torch.Generator(device=device).manual_seed(int(getattr(optimizer, "rounding_seed", 0)))
    return generators[key]
