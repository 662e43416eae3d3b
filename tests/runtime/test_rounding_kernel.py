"""The compiled stochastic-rounding kernel: torch's bits and generator state, used where it can be, and said
once where it cannot (no compiler, a kernel that differs), never a different rounding."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch
from fixtures import stochastically_rounded_by_hand as _by_hand

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


def test_compiled_kernel_gives_the_rules_bits_and_leaves_the_generator_as_torch_would(fresh_kernel):
    kernel = rounding_kernel.load_rounding_kernel()
    assert kernel is not None, "no C compiler here: this test expects one (CI's machines have gcc)"
    values = torch.randn(3 * 2**17 + 1, generator=torch.Generator().manual_seed(3)) * 100
    values[:4] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0])
    ours, theirs = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    # sizes: one element, a single draw, an odd chunk, exactly one refill of the 624-word state, and chunks
    # as the write-back cuts them, the last one odd
    for size in (1, 2, 3, 1248, 1249, 3 * 2**17 + 1):
        for part in chunk_views(values[:size].clone()):
            expected = _by_hand(part.clone(), theirs)
            assert kernel(part, ours)
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


def test_a_call_that_starts_on_a_spent_refill_twists_first_as_torch_does(fresh_kernel):
    """624 words drawn from a fresh seed leave the state spent (left 1, next 624): the next word needs a
    refill. Training reaches it whenever the words drawn so far are a multiple of 624."""
    kernel = rounding_kernel.load_rounding_kernel()
    ours, theirs = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    value = torch.randn(1248)
    for _ in range(2):  # each call draws exactly one refill's 624 words
        part, expected = value.clone(), _by_hand(value.clone(), theirs)
        assert kernel(part, ours)
        assert torch.equal(part.view(torch.int32), expected.view(torch.int32))
        assert torch.equal(ours.get_state(), theirs.get_state())


def test_rounding_without_an_optimizers_generator_or_on_a_strided_chunk_takes_torchs_calls(fresh_kernel):
    """The kernel reads and writes the generator's state without its lock, so it serves only an optimizer's
    own generator, never the default one; and only contiguous fp32 chunks (it reads `numel` values on)."""
    calls = []
    kernel = rounding_kernel.load_rounding_kernel()
    rounding._checked["kernel"] = lambda part, generator: calls.append(part.numel()) or kernel(part, generator)
    value = torch.randn(1001)
    torch.manual_seed(12)
    expected = _by_hand(value.clone(), torch.default_generator)
    torch.manual_seed(12)
    part = value.clone()
    _Noise((part,)).round_(part, None)
    assert torch.equal(part.view(torch.int32), expected.view(torch.int32)) and calls == []
    whole = torch.randn(2002)
    strided, reference = whole.clone()[::2], whole.clone()[::2].contiguous()
    assert not strided.is_contiguous()
    expected = _by_hand(reference, torch.Generator().manual_seed(4))
    _Noise((strided,)).round_(strided, torch.Generator().manual_seed(4))
    assert torch.equal(strided.contiguous().view(torch.int32), expected.view(torch.int32))


def test_a_generator_state_the_kernel_refuses_is_rounded_by_torch_and_said_once(fresh_kernel, caplog):
    refusing = torch.Generator().manual_seed(5)
    state = refusing.get_state()
    state[8:12] = torch.tensor([2], dtype=torch.int32).view(torch.uint8)  # left 2 with next 624: not a state
    state[16:24] = torch.tensor([624], dtype=torch.int64).view(torch.uint8)
    refusing.set_state(state)
    kernel = rounding_kernel.load_rounding_kernel()
    assert not kernel(torch.zeros(4), refusing) and torch.equal(refusing.get_state(), state)
    # In use: a kernel that refuses every state, over a weight of several chunks, twice.
    rounding._checked["kernel"] = lambda part, generator: False
    value = torch.randn(2 * 2**17 + 3, generator=torch.Generator().manual_seed(6))
    with caplog.at_level(logging.WARNING):
        for seed in (1, 2):
            expected = _by_hand(value.clone(), torch.Generator().manual_seed(seed))
            param = torch.zeros(value.shape, dtype=torch.float16)
            write_back(param, value.clone(), stochastic_rounding=True, generator=torch.Generator().manual_seed(seed))
            assert torch.equal(param.view(torch.int16), expected.half().view(torch.int16))
    assert sum("does not read this generator's state" in r.getMessage() for r in caplog.records) == 1


def test_a_kernel_that_raises_or_errs_on_a_spent_refill_is_not_used(fresh_kernel, caplog):
    kernel = rounding_kernel.load_rounding_kernel()

    def raising(part, generator):
        raise OSError("segfault stand-in")

    def wrong_after_a_spent_refill(part, generator):
        spent = int(generator.get_state()[16:24].view(torch.int64)) == 624
        done = kernel(part, generator)
        if spent:
            part.view(torch.int32)[0] ^= 1 << 13
        return done

    for bad in (raising, wrong_after_a_spent_refill):
        rounding._checked.clear()
        with caplog.at_level(logging.WARNING):
            original = rounding_kernel.load_rounding_kernel
            rounding_kernel.load_rounding_kernel = lambda bad=bad: bad
            try:
                assert compiled_rounding() is None, bad.__name__
            finally:
                rounding_kernel.load_rounding_kernel = original
        _once.forget()


@pytest.mark.parametrize("compiler", ["no-such-compiler", "no-such-launcher gcc", 'gcc "-DUNCLOSED'])
def test_without_a_compiler_rounding_keeps_its_bits_and_says_so_once(fresh_kernel, monkeypatch, caplog, compiler):
    monkeypatch.setenv("CC", str(fresh_kernel / compiler))
    value = torch.randn(3001)
    expected = _by_hand(value.clone(), torch.Generator().manual_seed(2))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):  # built and checked again: what is said once is said once all the same
            rounding._checked.clear()
            rounding_kernel._loaded.clear()
            part = value.clone()
            _Noise((part,)).round_(part, torch.Generator().manual_seed(2))
            assert torch.equal(part.view(torch.int32), expected.view(torch.int32))
    said = [r.getMessage() for r in caplog.records if "without its compiled kernel" in r.getMessage()]
    why = "cannot be read as a command" if '"' in compiler else "compiling rounding_kernel.c failed"
    assert len(said) == 1 and why in said[0] and "=off" in said[0]


def test_a_kernel_that_differs_from_torch_is_not_used_and_said(fresh_kernel, monkeypatch, caplog):
    def off_by_one_bit(part, generator):
        rounding._Noise((part,), compiled=False).round_(part, generator)
        part.view(torch.int32)[-1] ^= 1 << 13
        return True

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


def test_a_compiler_given_with_its_arguments_is_run_with_them(fresh_kernel, monkeypatch):
    gcc = shutil.which("gcc") or shutil.which("cc")
    monkeypatch.setenv("CC", f"{gcc} -DOPTIMUM_IPU_UNUSED=1")
    assert rounding_kernel.load_rounding_kernel() is not None


def test_without_a_home_folder_the_kernel_is_kept_in_a_private_temporary_folder(fresh_kernel, monkeypatch, tmp_path):
    monkeypatch.delenv("OPTIMUM_IPU_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(rounding_kernel.Path, "home", staticmethod(no_home))
    monkeypatch.setattr(rounding_kernel.tempfile, "gettempdir", lambda: str(tmp_path))
    assert rounding_kernel.load_rounding_kernel() is not None
    assert [p.suffix for p in (tmp_path / f"optimum-ipu-kernels-{os.getuid()}").iterdir()] == [".so"]


def test_a_temporary_folder_others_can_write_to_is_not_loaded_from(fresh_kernel, monkeypatch, tmp_path):
    shared = tmp_path / "tmp"
    (shared / f"optimum-ipu-kernels-{os.getuid()}").mkdir(parents=True, mode=0o777)
    (shared / f"optimum-ipu-kernels-{os.getuid()}").chmod(0o777)
    monkeypatch.setattr(rounding_kernel.tempfile, "gettempdir", lambda: str(shared))
    assert [folder.name for folder in rounding_kernel._folders()] == ["kernels"]
    (shared / f"optimum-ipu-kernels-{os.getuid()}").chmod(0o700)
    assert [folder.name for folder in rounding_kernel._folders()] == ["kernels", f"optimum-ipu-kernels-{os.getuid()}"]


def test_a_temporary_folder_of_another_owner_or_not_a_folder_is_not_used(fresh_kernel, monkeypatch, tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    monkeypatch.setattr(rounding_kernel.tempfile, "gettempdir", lambda: str(shared))
    private = shared / f"optimum-ipu-kernels-{os.getuid()}"
    private.write_text("not a folder")
    assert [folder.name for folder in rounding_kernel._folders()] == ["kernels"]
    private.unlink()
    private.mkdir(mode=0o700)
    monkeypatch.setattr(rounding_kernel.os, "getuid", lambda: os.stat(private).st_uid + 1)
    monkeypatch.setattr(rounding_kernel.tempfile, "gettempdir", lambda: str(shared))
    (shared / f"optimum-ipu-kernels-{os.stat(private).st_uid + 1}").mkdir(mode=0o700)
    os.chown(shared / f"optimum-ipu-kernels-{os.stat(private).st_uid + 1}", os.stat(private).st_uid, -1)
    assert [folder.name for folder in rounding_kernel._folders()] == ["kernels"]
