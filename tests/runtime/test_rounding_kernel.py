"""The compiled stochastic-rounding kernel: torch's bits and generator state, used where it can be, and said
once where it cannot (no compiler, a kernel that differs), never a different rounding."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from optimum_ipu import _once
from optimum_ipu.runtime import rounding, rounding_kernel
from optimum_ipu.runtime.rounding import _Noise, chunk_views, compiled_rounding, write_back


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """No kernel built or checked yet in this process, compiled into an empty cache; forgotten afterwards, so
    other tests build theirs from the environment as it was."""
    monkeypatch.setenv("OPTIMUM_IPU_CACHE", str(tmp_path / "cache"))
    for cache in (rounding._checked, rounding_kernel._loaded):
        cache.clear()
    _once.forget()
    yield tmp_path / "cache" / "kernels"
    for cache in (rounding._checked, rounding_kernel._loaded):
        cache.clear()


def _by_hand(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The IPU's rule written out on torch's generator: 13 random low bits (two 16-bit halves per 32-bit draw)
    added to the fp32 bit pattern, then cut."""
    words = torch.empty((x.numel() + 1) // 2, dtype=torch.int32).random_(generator=generator)
    noise = words.view(torch.int16)[: x.numel()].to(torch.int32) & 0x1FFF
    return ((x.view(torch.int32) + noise) & ~0x1FFF).view(torch.float32)


def test_compiled_kernel_gives_the_rules_bits_and_leaves_the_generator_as_torch_would(fresh_kernel):
    kernel = rounding_kernel.load_rounding_kernel()
    assert kernel is not None, "a C compiler is on this machine (CI's too): the kernel must build"
    values = torch.randn(3 * 2**17 + 1, generator=torch.Generator().manual_seed(3)) * 100
    values[:4] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0])
    ours, theirs = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    # sizes: one element, a single draw, an odd chunk, exactly one refill of the 624-word state, and chunks
    # as the write-back cuts them, the last one odd
    for size in (1, 2, 3, 1248, 1249, 3 * 2**17 + 1):
        for part in chunk_views(values[:size].clone()):
            expected = _by_hand(part.clone(), theirs)
            kernel(part, ours)
            assert torch.equal(part.view(torch.int32), expected.view(torch.int32)), size
        assert torch.equal(ours.get_state(), theirs.get_state()), size
    # the next draws continue the same stream
    assert torch.equal(torch.empty(7, dtype=torch.int32).random_(generator=ours),
                       torch.empty(7, dtype=torch.int32).random_(generator=theirs))  # fmt: skip


def test_compiled_rounding_is_used_where_a_c_compiler_is(fresh_kernel):
    assert shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert compiled_rounding() is not None
    assert _Noise(chunk_views(torch.ones(10))).kernel is not None
    assert [path.suffix for path in fresh_kernel.iterdir()] == [".so"]  # compiled once, whole, into the cache


def test_write_back_has_the_same_bits_with_the_kernel_and_without(fresh_kernel, monkeypatch):
    value = torch.randn(2**17 + 5, generator=torch.Generator().manual_seed(1))
    results = {}
    for setting in ("auto", "off"):
        monkeypatch.setenv("OPTIMUM_IPU_COMPILED_ROUNDING", setting)
        generator, param = torch.Generator().manual_seed(4), torch.zeros(value.shape, dtype=torch.float16)
        write_back(param, value.clone(), stochastic_rounding=True, generator=generator)
        results[setting] = (param.view(torch.int16), generator.get_state())
        assert (_Noise(chunk_views(value)).kernel is None) == (setting == "off")
    assert torch.equal(results["auto"][0], results["off"][0]) and torch.equal(results["auto"][1], results["off"][1])


def test_default_generator_is_drawn_from_when_none_is_given(fresh_kernel):
    value = torch.randn(1001)
    torch.manual_seed(12)
    expected = _by_hand(value.clone(), torch.default_generator)
    torch.manual_seed(12)
    part = value.clone()
    _Noise((part,)).round_(part, None)
    assert torch.equal(part.view(torch.int32), expected.view(torch.int32))


def test_a_setting_other_than_auto_or_off_is_refused_with_both_named(monkeypatch):
    monkeypatch.setenv("OPTIMUM_IPU_COMPILED_ROUNDING", "yes")
    with pytest.raises(ValueError, match="OPTIMUM_IPU_COMPILED_ROUNDING='yes'.*'auto'.*'off'"):
        compiled_rounding()


def test_without_a_compiler_rounding_keeps_its_bits_and_says_so_once(fresh_kernel, monkeypatch, caplog):
    monkeypatch.setenv("CC", str(fresh_kernel / "no-such-compiler"))
    value = torch.randn(3001)
    expected = _by_hand(value.clone(), torch.Generator().manual_seed(2))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            rounding._checked.clear()
            part = value.clone()
            _Noise((part,)).round_(part, torch.Generator().manual_seed(2))
            assert torch.equal(part.view(torch.int32), expected.view(torch.int32))
    said = [r.getMessage() for r in caplog.records if "without its compiled kernel" in r.getMessage()]
    assert len(said) == 1 and "compiling rounding_kernel.c failed" in said[0] and "=off" in said[0]


def test_a_kernel_that_differs_from_torch_is_not_used_and_said(fresh_kernel, monkeypatch, caplog):
    def off_by_one_bit(part, generator):
        rounding._Noise((part,), compiled=False).round_(part, generator)
        part.view(torch.int32)[-1] ^= 1 << 13

    monkeypatch.setattr(rounding_kernel, "load_rounding_kernel", lambda: off_by_one_bit)
    with caplog.at_level(logging.WARNING):
        assert compiled_rounding() is None
    assert any("did not give torch" in r.getMessage() for r in caplog.records)


def test_a_compiled_file_in_the_cache_is_used_again_without_compiling(fresh_kernel, monkeypatch):
    assert rounding_kernel.load_rounding_kernel() is not None
    rounding_kernel._loaded.clear()

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(rounding_kernel.subprocess, "run", no_compiling)
    assert rounding_kernel.load_rounding_kernel() is not None
