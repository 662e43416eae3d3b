"""The fp16 compute layer: the IPU's arithmetic (fp16 values, fp32 partials, fp16 result), bit for bit."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from optimum_ipu.runtime.fp16_compute import (
    _CONVERTED,
    FP32PartialsMode,
    _functions,
    _storage_as_fp32,
    resolve_fp16_compute,
)


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
    # A float mask that is learnt (T5's position bias reaches attention as attn_mask): a keyword tensor.
    "sdpa-mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                  (_half(1, 2, 5, 8), _half(1, 2, 5, 8, seed=1), _half(1, 2, 5, 8, seed=2), _half(1, 2, 5, 5, seed=3))),
    "linear-bias-keyword": (lambda x, w, b: F.linear(x, w, bias=b), (_half(2, 5, 7), _half(3, 7, seed=1), _half(3, seed=2))),
    "einsum-list": (lambda a, b: torch.einsum("ij,jk->ik", [a, b]), (_half(4, 6), _half(6, 3, seed=1))),
    "addmm-method": (lambda c, a, b: c.addmm(a, b, beta=0.5, alpha=2.0), (_half(4, 3), _half(4, 6, seed=1),
                                                                         _half(6, 3, seed=2))),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b), (_half(2, 4, 3), _half(2, 4, 6, seed=1), _half(2, 6, 3, seed=2))),
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, stride=2), (_half(2, 3, 9), _half(4, 3, 3, seed=1), _half(4, seed=2))),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_backward_equal_fp32_compute_rounded_to_fp16(name):
    """Bit-equal to a written-out reference: exact fp32 copies in, fp32 op, fp16 out (forward and grads)."""
    fn, inputs = CASES[name]
    ours = [x.clone().requires_grad_() for x in inputs]
    with FP32PartialsMode():
        out = fn(*ours)
        out.float().sum().backward()
    assert out.dtype == torch.float16 and all(x.grad.dtype == torch.float16 for x in ours)

    reference = [x.float().requires_grad_() for x in inputs]
    expected = fn(*reference)
    expected.sum().backward()
    assert torch.equal(out, expected.half()), name
    for x, r in zip(ours, reference):
        assert torch.equal(x.grad, r.grad.half()), name


@pytest.mark.parametrize("name", sorted(CASES))
def test_weights_converted_once_per_block_give_the_same_bits(name):
    """Every input declared a weight (read from the block's fp32 copy): forward and grads unchanged."""
    fn, inputs = CASES[name]
    results = []
    for weights in (False, True):
        ours = [x.clone().requires_grad_() for x in inputs]
        with FP32PartialsMode(ours if weights else ()):
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
    layer = torch.nn.Linear(64, 48).half()
    inputs = [_half(4, 64, seed=s) for s in range(4)]
    weight = layer.weight
    counted = {}
    for declared in (False, True):
        with _Conversions(weight.numel()) as conversions:
            with FP32PartialsMode(layer.parameters() if declared else ()):
                for x in inputs:  # forward (weight transposed) and input gradient (weight) per micro-batch
                    layer(x.requires_grad_()).float().sum().backward()
        counted[declared] = conversions.count
    # Undeclared: once per micro-batch's forward (its backward reads the copy the forward made).
    assert counted == {False: 4, True: 1}

    with FP32PartialsMode(layer.parameters()):
        before = layer(inputs[0])
        with torch.no_grad():
            weight.mul_(2)  # the version counter moves: the cached copy is stale
        after = layer(inputs[0])
    assert torch.equal(after, F.linear(inputs[0].float(), weight.float(), layer.bias.float()).half())
    assert not torch.equal(before, after)


def test_an_activation_is_never_read_from_a_stale_copy():
    """Only declared weights are copied once; a new tensor at a freed one's address, or one written in
    place, is read as it is now."""
    w = _half(64, 64, seed=99)
    with FP32PartialsMode():
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
    with FP32PartialsMode():
        emulated = a @ b
    ulp = torch.finfo(torch.float16).eps * native.float().abs().clamp(min=2.0**-14)
    assert ((emulated.float() - native.float()).abs() <= ulp).all()


def test_fp32_tensors_pass_through_unchanged():
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    with FP32PartialsMode():
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


def test_functions_missing_from_this_torch_are_skipped():
    assert _functions("torch.mm", "torch.a_function_no_torch_has") == frozenset({torch.mm})


def test_functions_outside_the_matmul_family_keep_torchs_fp16_kernels():
    """Elementwise ops, reductions and normalisations run torch's fp16 kernel (fp32 inside, one rounding)."""
    x, w = _half(4, 8).requires_grad_(), _half(8, seed=1).requires_grad_()
    calls = {"gelu": lambda: F.gelu(x), "softmax": lambda: x.softmax(-1), "sum": lambda: x.sum(0),
             "layer_norm": lambda: F.layer_norm(x, (8,), w), "mul": lambda: x * w}  # fmt: skip
    for name, call in calls.items():
        with FP32PartialsMode():
            ours = call()
        assert ours.dtype == torch.float16 and torch.equal(ours, call()), name
        assert ours.grad_fn.name() == call().grad_fn.name(), (
            name
        )  # torch's own backward, not a converted call
    assert not {F.gelu, F.layer_norm, torch.Tensor.softmax, torch.Tensor.sum} & _CONVERTED


def test_without_gradients_nothing_is_kept_for_a_backward():
    x, w = _half(4, 8), _half(3, 8, seed=1).requires_grad_()
    with FP32PartialsMode([w]):
        with torch.no_grad():
            out = F.linear(x, w)
        assert out.grad_fn is None and torch.equal(out, F.linear(x.float(), w.float()).half())
        tracked = F.linear(x, w)
    assert tracked.grad_fn is not None and torch.equal(tracked, out)


def test_a_weight_viewed_at_an_offset_is_read_from_its_own_elements():
    big, x = _half(10, 4, seed=3), _half(5, 4)
    with FP32PartialsMode([big]):
        out = x @ big[3:7]  # a view 12 elements into the weight's storage
    assert torch.equal(out, (x.float() @ big[3:7].float()).half())


def test_the_fp32_copy_of_a_weight_is_made_on_the_weights_device():
    weight = _half(3, 2)
    with torch.device("meta"):  # a default device other than the weight's
        copy = _storage_as_fp32(weight)
    assert copy.device == weight.device and torch.equal(copy, weight.float().flatten())


def test_keyword_arguments_reach_the_fp32_op():
    c, a, b = _half(5, 3, seed=2), _half(5, 4), _half(4, 3, seed=1)
    with FP32PartialsMode():
        out = torch.addmm(c, a, b, beta=0.5, alpha=2.0)  # beta and alpha are keyword-only in aten
    assert torch.equal(out, torch.addmm(c.float(), a.float(), b.float(), beta=0.5, alpha=2.0).half())


def test_out_variants_write_into_the_given_tensor_with_torchs_kernel():
    a, b = _half(5, 4), _half(4, 3, seed=1)
    out = torch.empty(5, 3, dtype=torch.float16)
    with FP32PartialsMode():
        torch.mm(a, b, out=out)
    assert torch.equal(out, torch.mm(a, b))


def test_a_boolean_attention_mask_is_passed_as_it_is():
    q, k, v = _half(1, 2, 5, 8), _half(1, 2, 5, 8, seed=1), _half(1, 2, 5, 8, seed=2)
    mask = _half(1, 1, 5, 5, seed=3) > -0.5
    with FP32PartialsMode():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask).half()
    assert torch.equal(out, expected)


def test_fp32_convolutions_pass_through_unchanged():
    x, w = torch.randn(1, 3, 6, 6), torch.randn(4, 3, 3, 3)
    with FP32PartialsMode():
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


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.outer(torch.relu(self.inner(x)) * 2)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_recomputed_block_is_recomputed_under_the_same_mode(reentrant):
    """torch switches function modes off in backward: the recomputation must switch ours back on, or it
    computes in torch's fp16 kernels (refused by the non-reentrant checkpoint, other bits otherwise)."""
    from torch.utils.checkpoint import checkpoint

    from optimum_ipu.runtime.fp16_compute import recomputed_in_same_mode

    torch.manual_seed(0)
    block = _Block().half()
    x = _half(4, 8)
    grads = []
    for recompute in (False, True):
        block.zero_grad()
        with FP32PartialsMode(block.parameters()):
            xs = x.clone().requires_grad_()
            out = (
                checkpoint(recomputed_in_same_mode(block), xs, use_reentrant=reentrant)
                if recompute
                else block(xs)
            )
            out.float().sum().backward()
        grads.append([xs.grad, *(p.grad.clone() for p in block.parameters())])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_transformers_gradient_checkpointing_recomputes_under_the_same_mode():
    from transformers import BertConfig, BertModel

    from optimum_ipu.runtime.fp16_compute import recompute_transformers_checkpoints_in_same_mode

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, vocab_size=50
    )
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    model = BertModel(config, add_pooling_layer=False).half().train()
    ids = torch.randint(0, 50, (2, 6))
    grads = []
    for checkpointing in (False, True):
        model.zero_grad()
        if checkpointing:
            # transformers' own, non-reentrant (activation_checkpointing_enable in recent releases; 5.18 has gradient_...)
            enable = getattr(model, "activation_checkpointing_enable", None)
            if enable is not None:
                enable()
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            recompute_transformers_checkpoints_in_same_mode(model)
        with FP32PartialsMode(model.parameters()):
            model(input_ids=ids).last_hidden_state.float().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_the_converted_functions_are_found_under_each_owner():
    assert {torch.matmul, torch.Tensor.__matmul__, F.linear, torch.linalg.matmul} <= _CONVERTED
    found = _functions("torch.bmm", "Tensor.matmul", "F.conv2d", "linalg.matmul")
    assert found == {torch.bmm, torch.Tensor.matmul, F.conv2d, torch.linalg.matmul}


def test_tensors_inside_a_list_are_replaced_and_other_entries_kept():
    from optimum_ipu.runtime.fp16_compute import _tensors_of, _with_tensors

    a, b = torch.ones(1), torch.zeros(1)
    args, kwargs = ("eq", ["x", a, 3]), {"bias": b, "flag": True}
    assert _tensors_of(args, kwargs) == [a, b]
    new_args, new_kwargs = _with_tensors(args, kwargs, ["A", "B"])
    assert new_args == ("eq", ["x", "A", 3]) and new_kwargs == {"bias": "B", "flag": True}


def test_outside_the_mode_a_checkpointed_function_is_left_as_it_is():
    from optimum_ipu.runtime.fp16_compute import recomputed_in_same_mode

    def forward(x):
        return x

    assert recomputed_in_same_mode(forward) is forward


def test_transformers_checkpoint_functions_are_wrapped_once_and_pass_every_argument_on():
    from optimum_ipu.runtime.fp16_compute import recompute_transformers_checkpoints_in_same_mode

    calls = []

    def checkpoint(function, *args, **kwargs):
        calls.append((args, kwargs))
        return function(*args)

    layer, plain = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    layer._gradient_checkpointing_func = checkpoint
    model = torch.nn.Sequential(layer, plain)
    recompute_transformers_checkpoints_in_same_mode(model)
    wrapped = layer._gradient_checkpointing_func
    recompute_transformers_checkpoints_in_same_mode(model)  # a second call (every training call makes one)
    assert layer._gradient_checkpointing_func is wrapped is not checkpoint
    assert not hasattr(plain, "_gradient_checkpointing_func")
    assert wrapped(lambda x: x + 1, 1, use_reentrant=False) == 2 and calls == [
        ((1,), {"use_reentrant": False})
    ]


def test_a_recomputed_block_runs_its_forward_once_more_not_once_per_converted_call():
    """The fp32 graphs of converted calls keep their own saves: a checkpoint recomputes its block once in
    the backward, as without the mode (it once recomputed it from inside every converted call's backward)."""
    from torch.utils.checkpoint import checkpoint

    from optimum_ipu.runtime.fp16_compute import recomputed_in_same_mode

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8), torch.nn.GELU(),
                                torch.nn.Linear(8, 8)).half()  # fmt: skip
    forwards = []
    block.register_forward_pre_hook(lambda *_: forwards.append(1))  # a recomputation may stop early
    with FP32PartialsMode(block.parameters()):
        x = _half(4, 8).requires_grad_()
        checkpoint(recomputed_in_same_mode(block), x, use_reentrant=False).float().sum().backward()
    assert len(forwards) == 2, len(forwards)  # the forward, then one recomputation
