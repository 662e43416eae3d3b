"""The fp16 compute layer: the IPU's arithmetic (fp16 values, fp32 partials, fp16 result), bit for bit."""

from __future__ import annotations

import re
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from optimum_ipu.runtime import fp16_compute
from optimum_ipu.runtime.fp16_compute import FP32Partials, _ops, _storage_as_fp32, resolve_fp16_compute


def _half(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).half()


CASES = {
    "linear": (lambda x, w, b: F.linear(x, w, b), (_half(5, 7), _half(3, 7, seed=1), _half(3, seed=2))),
    "matmul": (lambda a, b: a @ b, (_half(2, 4, 6), _half(2, 6, 3, seed=1))),
    "einsum": (lambda a, b: torch.einsum("bij,bjk->bik", a, b), (_half(2, 4, 6), _half(2, 6, 3, seed=1))),
    "conv2d": (lambda x, w: F.conv2d(x, w, padding=1), (_half(1, 3, 6, 6), _half(4, 3, 3, 3, seed=1))),
    "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (_half(1, 2, 5, 8), _half(1, 2, 5, 8, seed=1),
                                                                      _half(1, 2, 5, 8, seed=2))),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_backward_equal_fp32_compute_rounded_to_fp16(name):
    """Bit-equal to a written-out reference: exact fp32 copies in, fp32 op, fp16 out (forward and grads)."""
    fn, inputs = CASES[name]
    ours = [x.clone().requires_grad_() for x in inputs]
    with FP32Partials():
        out = fn(*ours)
        out.float().sum().backward()
    assert out.dtype == torch.float16 and all(x.grad.dtype == torch.float16 for x in ours)

    reference = [x.float().requires_grad_() for x in inputs]
    expected = fn(*reference)
    expected.sum().backward()
    assert torch.equal(out, expected.half()), name
    for x, r in zip(ours, reference):
        if name == "sdpa":
            # Flash attention's backward reads the forward's output, which is stored in fp16 (an op boundary):
            # the gradients are those of the rounded output, within an fp16 ulp of the fp32 reference.
            torch.testing.assert_close(x.grad, r.grad.half(), atol=1e-3, rtol=2**-10)
        else:
            assert torch.equal(x.grad, r.grad.half()), name


@pytest.mark.parametrize("name", sorted(CASES))
def test_weights_converted_once_per_block_give_the_same_bits(name, monkeypatch):
    """Every input declared a weight (read from the block's fp32 copy): forward and grads unchanged."""
    monkeypatch.setattr(fp16_compute, "CACHED_WEIGHT_ELEMENTS", 1)  # these small tensors too
    fn, inputs = CASES[name]
    results = []
    for weights in (False, True):
        ours = [x.clone().requires_grad_() for x in inputs]
        with FP32Partials(ours if weights else ()):
            outs = [fn(*ours) for _ in range(3)]  # three micro-batches on the same weights
            sum(o.float().sum() for o in outs).backward()
        results.append([*outs, *(x.grad for x in ours)])
    assert all(torch.equal(a, b) for a, b in zip(*results)), name


class _Conversions(TorchDispatchMode):
    """Counts fp16 -> fp32 copies of tensors with `numel` elements (entered outside the mode under test)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if (
            func.overloadpacket in (torch.ops.aten.to, torch.ops.aten._to_copy)
            and args[0].dtype == torch.float16
        ):
            self.count += out.dtype == torch.float32 and args[0].numel() == self.numel
        return out


def test_a_weight_is_converted_once_per_block_and_again_after_an_in_place_change():
    layer = torch.nn.Linear(512, 128).half()  # 65,536 weights: at CACHED_WEIGHT_ELEMENTS
    inputs = [_half(4, 512, seed=s) for s in range(4)]
    weight = layer.weight
    counted = {}
    for declared in (False, True):
        with _Conversions(weight.numel()) as conversions:
            with FP32Partials(layer.parameters() if declared else ()):
                for x in inputs:  # the backward reads the copy its forward made (or the block's)
                    layer(x.requires_grad_()).float().sum().backward()
        counted[declared] = conversions.count
    assert counted == {False: 4, True: 1}

    with FP32Partials(layer.parameters()):
        before = layer(inputs[0])
        with torch.no_grad():
            weight.mul_(2)  # the version counter moves: the cached copy is stale
        after = layer(inputs[0])
    assert torch.equal(after, F.linear(inputs[0].float(), weight.float(), layer.bias.float()).half())
    assert not torch.equal(before, after)


def test_a_block_of_calls_on_held_weights_converts_each_weight_once():
    """An evaluation loop or a pipeline's inputs: each call's context reads the copy made for the block."""
    layer = torch.nn.Linear(512, 128).half()  # at CACHED_WEIGHT_ELEMENTS
    inputs = [_half(4, 512, seed=s) for s in range(3)]
    expected = [F.linear(x.float(), layer.weight.float(), layer.bias.float()).half() for x in inputs]
    with _Conversions(layer.weight.numel()) as conversions:
        with fp16_compute.held_fp32_copies("emulated", layer.parameters()):
            block = fp16_compute._held()
            for x, want in zip(inputs, expected):
                with fp16_compute.fp16_compute_context("emulated", layer.parameters()):  # one host call
                    assert torch.equal(layer(x), want)
            with torch.no_grad():
                layer.weight.mul_(0.5)  # written in place inside the block: copied again
            with fp16_compute.fp16_compute_context("emulated", layer.parameters()):
                after = layer(inputs[0])
    assert conversions.count == 2
    assert torch.equal(after, F.linear(inputs[0].float(), layer.weight.float(), layer.bias.float()).half())
    assert fp16_compute._held() is None and block._fp32 == {}  # the block's copies are let go at its end


def test_a_call_on_weights_the_block_does_not_hold_makes_its_own_copies():
    held, other = torch.nn.Linear(512, 128).half(), torch.nn.Linear(512, 128).half()
    x = _half(4, 512)
    with _Conversions(other.weight.numel()) as conversions:
        with fp16_compute.held_fp32_copies("emulated", held.parameters()):
            for _ in range(2):
                with fp16_compute.fp16_compute_context("emulated", [*held.parameters(), *other.parameters()]):
                    out = other(x)
    assert conversions.count == 2  # one per call: the block holds no copy of `other`
    assert torch.equal(out, F.linear(x.float(), other.weight.float(), other.bias.float()).half())


def test_a_weight_given_new_data_inside_a_block_is_read_from_a_copy_of_its_new_values():
    """`p.data = new` keeps p's version counter: the block keeps the old storage alive, so the new data
    never lands at its address and the weight is copied afresh (the reviewer's repro reused it 4 times in 20)."""
    x = _half(4, 1024)
    for _ in range(20):
        layer = torch.nn.Linear(1024, 1024).half()
        with fp16_compute.held_fp32_copies("emulated", layer.parameters()):
            with fp16_compute.fp16_compute_context("emulated", layer.parameters()):
                layer(x)
            new = layer.weight.detach() * 0.5
            layer.weight.data = torch.empty(0, dtype=torch.float16)
            layer.weight.data = torch.empty_like(new).copy_(new)
            del new
            with fp16_compute.fp16_compute_context("emulated", layer.parameters()):
                out = layer(x)
        assert torch.equal(out, F.linear(x.float(), layer.weight.float(), layer.bias.float()).half())


def test_a_block_lets_its_copies_go_on_release_and_on_an_error_and_restores_the_outer_block():
    layer = torch.nn.Linear(512, 128).half()
    with fp16_compute.held_fp32_copies("emulated", layer.parameters()) as release:
        outer = fp16_compute._held()
        with pytest.raises(RuntimeError, match="inside"):
            with fp16_compute.held_fp32_copies("emulated", layer.parameters()):
                inner = fp16_compute._held()
                with fp16_compute.fp16_compute_context("emulated", layer.parameters()):
                    layer(_half(4, 512))
                assert inner._fp32 and inner._fp32 is outer._fp32  # a block within a block: one set of copies
                raise RuntimeError("inside")
        assert inner._fp32 == {} and fp16_compute._held() is outer
        with fp16_compute.fp16_compute_context("emulated", layer.parameters()):
            layer(_half(4, 512))
        assert outer._fp32
        release()  # before work that needs the memory (an evaluation's metrics)
        assert outer._fp32 == {} and fp16_compute._held() is outer
    assert fp16_compute._held() is None


def test_a_declared_weight_below_the_size_threshold_is_copied_per_op():
    layer = torch.nn.Linear(64, 48).half()  # 3,072 weights: the copy costs less than the bookkeeping
    with _Conversions(layer.weight.numel()) as conversions, FP32Partials(layer.parameters()):
        for s in range(3):
            layer(_half(4, 64, seed=s))
    assert conversions.count == 3


def test_an_activation_is_never_read_from_a_stale_copy():
    """Only declared weights are copied once; a new tensor at a freed one's address, or one written in
    place, is read as it is now."""
    w = _half(64, 64, seed=99)
    declared = _half(256, 256, seed=98)  # a declared weight at the cache's size: the cache is in use
    with FP32Partials([declared]):
        for i in range(20):
            x = torch.full((64, 64), i / 8, dtype=torch.float16)  # often at the freed x's address
            assert torch.equal(x @ w, (x.float() @ w.float()).half())
            assert torch.equal(x.t() @ w, (x.float().t() @ w.float()).half())  # another view of x
            del x
        x = _half(64, 64)
        x @ w
        x.add_(1)
        assert torch.equal(x @ w, (x.float() @ w.float()).half())


def test_within_one_fp16_ulp_of_native_fp16():
    a, b = _half(16, 32), _half(32, 8, seed=1)
    native = a @ b
    with FP32Partials():
        emulated = a @ b
    ulp = torch.finfo(torch.float16).eps * native.float().abs().clamp(min=2.0**-14)
    assert ((emulated.float() - native.float()).abs() <= ulp).all()


def test_fp32_tensors_pass_through_unchanged():
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    with FP32Partials():
        out = a @ b
    assert out.dtype == torch.float32 and torch.equal(out, a @ b)


def test_mode_is_chosen_per_device_and_can_be_forced(monkeypatch):
    monkeypatch.delenv("OPTIMUM_IPU_FP16_COMPUTE", raising=False)
    assert resolve_fp16_compute("auto", "cpu") == "emulated"
    assert resolve_fp16_compute(None, "cuda") == "native"
    assert resolve_fp16_compute("native", "cpu") == "native"
    monkeypatch.setenv("OPTIMUM_IPU_FP16_COMPUTE", "native")
    assert resolve_fp16_compute("auto", "cpu") == "native"
    assert resolve_fp16_compute("emulated", "cuda") == "emulated"  # the argument wins over the variable
    monkeypatch.setenv("OPTIMUM_IPU_FP16_COMPUTE", "fast")
    with pytest.raises(ValueError, match="OPTIMUM_IPU_FP16_COMPUTE='fast'.*auto, emulated, native"):
        resolve_fp16_compute("auto", "cpu")


def test_ops_are_taken_as_default_overloads_and_missing_ones_skipped():
    assert _ops("mm", "an_op_no_torch_has") == frozenset({torch.ops.aten.mm.default})


def _python_calls_into(module_file: str, fn) -> int:
    """How many Python calls into `module_file` running `fn` makes."""
    calls = 0

    def profile(frame, event, _arg):
        nonlocal calls
        calls += event == "call" and frame.f_code.co_filename == module_file

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_ops_outside_the_family_cost_no_python_call_and_a_converted_one_costs_one():
    """The point of the dispatch key: elementwise ops, softmax, pooling... fall through in C++."""
    x, w = _half(8, 16), _half(16, 4, seed=1)
    with FP32Partials():
        outside = _python_calls_into(
            fp16_compute.__file__, lambda: F.max_pool1d(torch.relu(x.unsqueeze(0)), 2).softmax(-1)
        )
        converted = _python_calls_into(fp16_compute.__file__, lambda: x @ w)
    assert outside == 0
    assert converted >= 1


def test_a_weight_viewed_at_an_offset_is_read_from_its_own_elements(monkeypatch):
    monkeypatch.setattr(fp16_compute, "CACHED_WEIGHT_ELEMENTS", 1)  # read from the block's copy
    big, x = _half(10, 4, seed=3), _half(5, 4)
    with FP32Partials([big]):
        out = x @ big[3:7]  # a view 12 elements into the weight's storage
    assert torch.equal(out, (x.float() @ big[3:7].float()).half())


def test_the_fp32_copy_of_a_weight_is_made_on_the_weights_device():
    weight = _half(3, 2)
    with torch.device("meta"):  # a default device other than the weight's
        copy = _storage_as_fp32(weight)
    assert copy.device == weight.device and torch.equal(copy, weight.float().flatten())


def test_keyword_arguments_reach_the_fp32_op():
    c, a, b = _half(5, 3, seed=2), _half(5, 4), _half(4, 3, seed=1)
    with FP32Partials():
        out = torch.addmm(c, a, b, beta=0.5, alpha=2.0)  # beta and alpha are keyword-only in aten
    assert torch.equal(out, torch.addmm(c.float(), a.float(), b.float(), beta=0.5, alpha=2.0).half())


def test_out_variants_write_into_the_given_tensor_with_torchs_kernel():
    a, b = _half(5, 4), _half(4, 3, seed=1)
    out = torch.empty(5, 3, dtype=torch.float16)
    with FP32Partials():
        torch.mm(a, b, out=out)
    assert torch.equal(out, torch.mm(a, b))


@pytest.mark.parametrize("mask", ["fp16", "bool"])
def test_masked_attention_keeps_torchs_own_fp16_kernel(mask):
    q, k, v = _half(1, 2, 5, 8), _half(1, 2, 5, 8, seed=1), _half(1, 2, 5, 8, seed=2)
    attn_mask = _half(1, 1, 5, 5, seed=3) if mask == "fp16" else _half(1, 1, 5, 5, seed=3) > -0.5
    with FP32Partials():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask))


def test_outputs_keep_the_dtypes_of_torchs_own_fp16_kernels():
    flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if flash is None:
        pytest.skip("this torch build has no CPU flash attention")
    q, k, v = _half(1, 2, 5, 8), _half(1, 2, 5, 8, seed=1), _half(1, 2, 5, 8, seed=2)
    with FP32Partials():
        emulated = flash(q, k, v)
    assert [o.dtype for o in emulated] == [o.dtype for o in flash(q, k, v)] == [torch.float16, torch.float32]


def test_fp32_convolutions_pass_through_unchanged():
    x, w = torch.randn(1, 3, 6, 6), torch.randn(4, 3, 3, 3)
    with FP32Partials():
        out = F.conv2d(x, w, padding=1)
    assert out.dtype == torch.float32 and torch.equal(out, F.conv2d(x, w, padding=1))


def test_an_unknown_mode_is_refused_naming_the_argument_the_choices_and_what_they_mean(monkeypatch):
    monkeypatch.delenv("OPTIMUM_IPU_FP16_COMPUTE", raising=False)
    message = (
        "--fp16_compute='fast' is not a fp16 compute mode: use one of auto, emulated, native (emulated: fp16 values "
        "computed with fp32 partials, fast on any CPU; native: torch's fp16 kernels)."
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        resolve_fp16_compute("fast", "cpu")


def test_a_torch_without_the_dispatch_key_api_gets_an_error_naming_the_native_mode(monkeypatch):
    monkeypatch.setattr(fp16_compute, "_registrations", [])  # as in a fresh process
    monkeypatch.delattr(torch.library.Library, "fallback")
    with pytest.raises(
        RuntimeError, match=r"torch 2\.13 is tested\). Upgrade torch, or use --fp16_compute native"
    ):
        with FP32Partials():
            pass


def test_contexts_nest_and_each_exit_restores_what_was_there():
    a, b = _half(8, 8), _half(8, 8, seed=1)
    native = a @ b  # torch's own fp16 kernel
    outer, inner = FP32Partials(), FP32Partials()
    with outer:
        with inner:
            assert fp16_compute.active_fp32_partials() is inner
        assert fp16_compute.active_fp32_partials() is outer
        assert _python_calls_into(fp16_compute.__file__, lambda: a @ b) >= 1  # still converted
        assert torch.equal(a @ b, (a.float() @ b.float()).half())
    assert fp16_compute.active_fp32_partials() is None
    assert _python_calls_into(fp16_compute.__file__, lambda: a @ b) == 0  # the key is off again
    assert torch.equal(a @ b, native)


def test_a_context_can_be_entered_again_and_drops_its_copies_on_exit():
    layer = torch.nn.Linear(512, 128).half()  # big enough for the block's copy
    context, x = FP32Partials(layer.parameters()), _half(4, 512)
    for _ in range(2):
        with context:
            out = layer(x)
        assert context._fp32 == {}  # no fp32 copy outlives its block
        assert torch.equal(out, F.linear(x.float(), layer.weight.float(), layer.bias.float()).half())


def test_a_thread_with_the_key_on_but_no_context_still_converts():
    """autograd may run a backward on its own thread, where the key is on (it travels with autograd's
    thread-local state) but this module's context object is not."""
    import threading

    a, b = _half(8, 8), _half(8, 8, seed=1)
    with FP32Partials():
        pass  # registers the kernels
    seen = {}

    def run():
        key = fp16_compute._KEY
        seen["active"] = fp16_compute.active_fp32_partials()
        with FP32Partials():  # entered first in this thread: nothing of the main thread's is read here
            seen["inside"] = fp16_compute.active_fp32_partials()
        seen["after"] = fp16_compute.active_fp32_partials()
        torch._C._dispatch_tls_set_dispatch_key_included(key, True)
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
        seen["out"] = a @ b

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen["active"] is None and isinstance(seen["inside"], FP32Partials) and seen["after"] is None
    assert torch.equal(seen["out"], (a.float() @ b.float()).half())


def test_lent_memory_takes_a_contexts_first_copy_of_a_weight_and_only_within_its_scope():
    """Memory lent for a weight's fp32 copy (`lend_fp32_memory`) takes the first copy a context makes of it, from
    the weight's values then; a second copy after an in-place change goes to fresh memory (the graph may hold the
    first); nothing is lent outside `fp32_memory_of_updates`, nor for weights copied per op."""
    layer, small = torch.nn.Linear(512, 128).half(), torch.nn.Linear(64, 48).half()
    x = _half(4, 512)
    memory, small_memory = torch.full((128, 512), 7.0), torch.full((48, 64), 7.0)

    def expected():
        return F.linear(x.float(), layer.weight.float(), layer.bias.float()).half()

    fp16_compute.lend_fp32_memory([layer.weight], [memory])  # outside a scope: nothing is lent
    with _Conversions(layer.weight.numel()) as conversions, FP32Partials(layer.parameters()):
        layer(x)
    assert conversions.count == 1 and memory.eq(7.0).all()
    declared = [*layer.parameters(), *small.parameters()]
    with fp16_compute.fp32_memory_of_updates(), FP32Partials(declared):
        fp16_compute.lend_fp32_memory([layer.weight, small.weight], [memory, small_memory])
        with _Conversions(layer.weight.numel()) as conversions:
            out = layer(x.requires_grad_())
            out.float().sum().backward()
            small(_half(2, 64))
        assert conversions.count == 0 and torch.equal(memory, layer.weight.float())  # copied into the memory
        assert torch.equal(out, expected()) and layer.weight.grad.dtype == torch.float16
        assert small_memory.eq(7.0).all()  # a weight copied per op is lent nothing
        with torch.no_grad():
            layer.weight.mul_(0.5)
        with _Conversions(layer.weight.numel()) as conversions:
            after = layer(x)
        assert conversions.count == 1 and not torch.equal(memory, layer.weight.float())  # fresh memory
        assert torch.equal(after, expected())
    memory.fill_(7.0)
    with FP32Partials(layer.parameters()):
        layer(x)
    assert memory.eq(7.0).all()  # the scope has ended


def test_lent_memory_takes_one_copy_so_a_nested_context_leaves_the_outer_graphs_copy_alone():
    """A context inside another that declares the same weight (an inference model called within a training
    forward) makes its own copy: the lent memory went to the outer context's, which its graph still holds."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(_half(128, 512))
    x = _half(4, 512).requires_grad_()
    grads = []
    for lend in (False, True):
        weight.grad = x.grad = None
        with fp16_compute.fp32_memory_of_updates():
            if lend:
                fp16_compute.lend_fp32_memory([weight], [torch.empty(128, 512)])
            with FP32Partials([weight]):
                out = F.linear(x, weight)
                with FP32Partials([weight]):
                    inner = F.linear(x, weight)
                (out.float().sum() + inner.float().sum()).backward()
        grads.append((out, inner, x.grad, weight.grad))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_a_weight_that_does_not_fill_its_storage_is_lent_nothing():
    """A weight viewed from a larger storage is copied whole-storage by the layer: memory the weight's size
    cannot hold that copy, and is left alone."""
    storage = _half(2 * 128 * 512)
    weight = torch.nn.Parameter(storage[128 * 512 :].view(128, 512))
    memory = torch.full((128, 512), 7.0)
    x = _half(4, 512)
    with fp16_compute.fp32_memory_of_updates(), FP32Partials([weight]):
        fp16_compute.lend_fp32_memory([weight], [memory])
        out = F.linear(x, weight)
    assert memory.eq(7.0).all()
    assert torch.equal(out, F.linear(x.float(), weight.float()).half())
