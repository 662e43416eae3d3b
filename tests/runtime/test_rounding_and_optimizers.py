"""IPU numerics: stochastic rounding is unbiased; the IPU optimizers match their references."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from fixtures import stochastically_rounded_by_hand

from optimum_ipu.runtime.optimizers import LAMB, AdamW
from optimum_ipu.runtime.rounding import stochastic_round_to_half, write_back


def test_stochastic_rounding_is_unbiased_where_nearest_rounding_loses_the_update():
    torch.manual_seed(0)
    # 1 + 1e-4 is not representable in fp16 (spacing near 1 is ~9.8e-4): nearest rounding gives 1.0.
    x = torch.full((200_000,), 1.0 + 1e-4)
    assert x.half().float().mean().item() == 1.0
    rounded = stochastic_round_to_half(x).float()
    assert set(rounded.unique().tolist()) == {1.0, 1.0009765625}
    assert abs(rounded.mean().item() - (1.0 + 1e-4)) < 1e-5


def test_stochastic_rounding_keeps_signs_and_non_finite_values():
    x = torch.tensor([-2.5, 0.0, float("inf"), float("-inf"), 3.0])
    out = stochastic_round_to_half(x)
    assert out.dtype == torch.float16
    assert out[0] == -2.5 and out[1] == 0 and out[4] == 3.0
    assert torch.isinf(out[2]) and out[2] > 0 and torch.isinf(out[3]) and out[3] < 0


def test_stochastic_rounding_draws_its_noise_on_the_tensors_device():
    # The meta device stands in for an accelerator: noise drawn on the CPU could not be added to it.
    out = stochastic_round_to_half(torch.ones(5, device="meta"))
    assert out.device.type == "meta" and out.dtype == torch.float16 and out.shape == (5,)


def test_write_back_rounds_only_fp16_parameters():
    # 1 + 1e-4 is not an fp16 value: an fp32 parameter keeps it exactly even with stochastic rounding on.
    value = torch.full((64,), 1.0 + 1e-4)
    fp32 = torch.zeros(64)
    write_back(fp32, value, stochastic_rounding=True, generator=torch.Generator().manual_seed(0))
    assert torch.equal(fp32, value)
    fp16 = torch.zeros(64, dtype=torch.float16)
    write_back(fp16, value, stochastic_rounding=False)
    assert torch.equal(fp16, value.half())  # round to nearest without stochastic rounding
    write_back(fp16, value, stochastic_rounding=True, generator=torch.Generator().manual_seed(0))
    assert set(fp16.float().unique().tolist()) == {1.0, 1.0009765625}


def _rounded_by_hand(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return stochastically_rounded_by_hand(x, generator).half()


# (2 * 2**17 + 3,) spans three of the CPU write-back's chunks, the last one odd-sized.
@pytest.mark.parametrize("shape", [(7,), (64, 33), (3, 5, 2), (2 * 2**17 + 3,), (0, 4)])
def test_write_back_in_place_gives_the_rules_bits_and_uses_the_stream_alike(shape):
    """The write-back rounds the working copy in place (no temporary the size of the weight), chunk by
    chunk on the CPU: the same fp16 bits and the same generator state after as the rule written out over
    the whole tensor at once, odd sizes, several chunks and non-finite values too."""
    value = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 3
    if value.numel():
        value.view(-1)[:3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    by_hand, ours = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    expected = _rounded_by_hand(value, by_hand)
    param = torch.zeros(shape, dtype=torch.float16)
    write_back(param, value.clone(), stochastic_rounding=True, generator=ours)
    assert torch.equal(param.view(torch.int16), expected.view(torch.int16))
    assert torch.equal(stochastic_round_to_half(value, torch.Generator().manual_seed(5)).view(torch.int16),
                       expected.view(torch.int16))  # fmt: skip
    assert torch.equal(by_hand.get_state(), ours.get_state())


def _train(opt_factory, steps=5):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 4))
    opt = opt_factory([w])
    for i in range(steps):
        torch.manual_seed(i)
        w.grad = torch.randn(8, 4)
        opt.step()
    return w.detach()


def test_adamw_on_fp32_matches_torch_adamw():
    kwargs = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    ours = _train(lambda p: AdamW(p, stochastic_rounding=False, **kwargs))
    reference = _train(lambda p: torch.optim.AdamW(p, **kwargs))
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)


def test_adamw_skips_parameters_without_gradients():
    w = torch.nn.Parameter(torch.ones(3))
    opt = AdamW([w], lr=1.0)
    opt.step()
    assert torch.equal(w.detach(), torch.ones(3)) and not opt.state


def test_lamb_scales_each_update_by_the_trust_ratio():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(16))
    w0 = w.detach().clone()
    w.grad = torch.randn(16)
    LAMB([w], lr=0.1, weight_decay=0.0).step()
    step = w.detach() - w0
    # First Adam step with bias correction is ~sign(grad); LAMB rescales it to lr * ||w||.
    torch.testing.assert_close(step.norm(), 0.1 * w0.norm(), rtol=1e-3, atol=1e-6)


def test_fp16_weights_with_fp32_moments_and_stochastic_rounding():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.ones(50_000, dtype=torch.float16))
    opt = AdamW([w], lr=1e-5, weight_decay=0.0, stochastic_rounding=True)
    w.grad = -torch.ones_like(w)
    opt.step()
    state = opt.state[w]
    assert w.dtype == torch.float16 and state["exp_avg"].dtype == torch.float32
    # The 1e-5 step is far below fp16 spacing at 1.0; on average it survives.
    assert abs(w.float().mean().item() - (1 + 1e-5)) < 3e-6


@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("accum_type", [torch.float32, torch.float16])
def test_fused_adamw_equals_the_written_out_rule_on_fp16_weights(accum_type, bias_correction):
    """`step()` runs torch's fused kernel on fp32 working copies (without bias correction, on the lr and eps
    that undo the kernel's own correction); `_step_one` is the reference rule. A weight of several update
    chunks goes through the chunked kernel."""
    torch.manual_seed(0)
    fused = [torch.nn.Parameter(torch.randn(300).half()) for _ in range(3)]
    if accum_type == torch.float32:  # (fp16 moments: a one-bit difference in m compounds over many values)
        fused.append(torch.nn.Parameter(torch.randn(2 * 2**17 + 5).half()))
    reference = [torch.nn.Parameter(p.detach().clone()) for p in fused]
    kwargs = dict(lr=1e-3, weight_decay=0.01, first_order_momentum_accum_type=accum_type, stochastic_rounding=False,
                  bias_correction=bias_correction)  # fmt: skip
    opt_fused, opt_reference = AdamW(fused, **kwargs), AdamW(reference, **kwargs)
    for _ in range(10):
        for a, b in zip(fused, reference):
            a.grad = torch.randn_like(a) * 1e-2
            b.grad = a.grad.clone()
        opt_fused.step()
        with torch.no_grad():
            for group in opt_reference.param_groups:
                for p in group["params"]:
                    opt_reference._step_one(group, p)
    for a, b in zip(fused, reference):
        # Same rule; the fused kernel may order fp32 operations differently: a last-bit difference can move an
        # fp16 rounding by one ulp, which the later steps carry as an absolute offset while the weight shrinks
        # (2 of the 262,149 values: one ulp, 2^-17, taken near 0.01 and carried down to 0.002).
        torch.testing.assert_close(a, b, atol=2**-17, rtol=2**-10)
        assert opt_fused.state[a]["exp_avg"].dtype == accum_type
        torch.testing.assert_close(opt_fused.state[a]["exp_avg_sq"], opt_reference.state[b]["exp_avg_sq"])
    assert int(opt_fused.state[fused[0]]["step"]) == 10


@pytest.mark.parametrize("first_moment", [torch.float32, torch.float16])
def test_fp16_adamw_is_torchs_fp32_adamw_then_the_rounding_rule(first_moment):
    """Each update of fp16 weights is torch's AdamW on their exact fp32 values, then stochastic rounding drawn
    from the optimizer's seeded stream in the order of its parameters: over a weight of several of the
    CPU's update chunks and one of a single chunk, fp16 first moments too."""
    g = torch.Generator().manual_seed(0)
    shapes = [(2 * 2**17 + 3,), (64, 33)]
    ours = [torch.nn.Parameter(torch.randn(s, generator=g).half()) for s in shapes]
    kwargs = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)
    opt = AdamW(ours, first_order_momentum_accum_type=first_moment, seed=7, **kwargs)
    reference = [torch.nn.Parameter(p.detach().float()) for p in ours]
    torch_adamw = torch.optim.AdamW(reference, fused=True, **kwargs)
    stream = torch.Generator().manual_seed(7)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=g) for p in ours]
        opt.step(gradients=dict(zip(ours, grads)))
        for r, grad in zip(reference, grads):
            r.grad = grad
        torch_adamw.step()
        with torch.no_grad():
            for p, r in zip(ours, reference):
                expected = _rounded_by_hand(r.detach(), stream)
                assert torch.equal(p.detach().view(torch.int16), expected.view(torch.int16))
                r.copy_(expected)  # torch's next step starts from the stored fp16 weight
                if first_moment == torch.float16:  # the moment as stored, rounded to nearest
                    exp_avg = torch_adamw.state[r]["exp_avg"]
                    exp_avg.copy_(exp_avg.half())
    assert torch.equal(opt._generator(torch.device("cpu")).get_state(), stream.get_state())


def test_a_non_contiguous_fp16_weight_follows_torchs_adamw():
    """A transposed fp16 weight (updated whole, not in chunks) takes torch's AdamW step on its fp32 values,
    rounded to nearest: equal to torch's fp32 result rounded to fp16 at every step."""
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(50, 8, generator=g).half().t())
    kwargs = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)
    opt = AdamW([w], stochastic_rounding=False, **kwargs)
    reference = torch.nn.Parameter(w.detach().float())
    torch_adamw = torch.optim.AdamW([reference], foreach=False, **kwargs)
    for _ in range(4):
        grad = torch.randn(w.shape, generator=g)
        opt.step(gradients={w: grad})
        reference.grad = grad
        torch_adamw.step()
        with torch.no_grad():
            assert torch.equal(w, reference.half())
            reference.copy_(w)


def _reference_lamb(w, grads, lr, betas, eps, weight_decay):
    """LAMB written out from You et al. (2019), Algorithm 2, in float64."""
    w = w.double().clone()
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        m_hat, v_hat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        r = m_hat / (v_hat.sqrt() + eps)
        update = r + weight_decay * w
        trust = w.norm() / update.norm()
        w = w - lr * trust * update
    return w


def test_lamb_equals_the_written_out_rule_in_fp32():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(32))
    start = w.detach().clone()
    grads = [torch.randn(32) for _ in range(5)]
    opt = LAMB([w], lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, stochastic_rounding=False)
    for g in grads:
        w.grad = g.clone()
        opt.step()
    expected = _reference_lamb(start, grads, 1e-2, (0.9, 0.999), 1e-6, 0.01)
    torch.testing.assert_close(w.detach().double(), expected, atol=1e-6, rtol=0)


def test_fp16_weights_keep_fp32_moments_and_rounding_stream_across_a_state_dict_round_trip():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(1000).half())
    opt = AdamW([w], lr=1e-3, seed=3)
    grad = {w: torch.randn(1000) * 1e-4}  # exp_avg_sq ~1e-8: flushed to zero if cast to fp16
    opt.step(gradients=grad)
    saved = opt.state_dict()

    clone = torch.nn.Parameter(w.detach().clone())
    restored = AdamW([clone], lr=1e-3, seed=99)
    restored.load_state_dict(saved)
    assert restored.state[clone]["exp_avg_sq"].dtype == torch.float32
    assert torch.equal(restored.state[clone]["exp_avg_sq"], opt.state[w]["exp_avg_sq"])
    opt.step(gradients=grad)
    restored.step(gradients={clone: grad[w]})
    assert torch.equal(w, clone)  # same moments and the same stochastic-rounding draws


@pytest.mark.parametrize("optimizer", [AdamW, LAMB])
def test_learning_rate_and_betas_are_checked_as_torch_checks_them(optimizer):
    cases = [dict(lr=-0.1), dict(lr=0.0), dict(betas=(0.0, 0.0)), dict(betas=(-0.1, 0.9)), dict(betas=(1.0, 0.9)),
             dict(betas=(1.5, 0.9)), dict(betas=(0.9, 1.0)), dict(betas=(0.9, 1.5)), dict(betas=(0.9, 0.999))]  # fmt: skip

    def accepted(factory, kwargs):
        try:
            factory([torch.nn.Parameter(torch.ones(1))], **kwargs)
        except ValueError:
            return False
        return True

    assert [accepted(optimizer, c) for c in cases] == [accepted(torch.optim.AdamW, c) for c in cases]
    with pytest.raises(ValueError, match=r"^Invalid learning rate: -0\.1$"):
        optimizer([torch.nn.Parameter(torch.ones(1))], lr=-0.1)
    with pytest.raises(ValueError, match=re.escape("Invalid betas (0.9, 1.0): each must be in [0, 1).")):
        optimizer([torch.nn.Parameter(torch.ones(1))], betas=(0.9, 1.0))


def test_adamw_defaults_are_torchs_and_lamb_defaults_are_apex_fused_lambs():
    params = [torch.nn.Parameter(torch.ones(1))]
    ours, torchs = AdamW(params).defaults, torch.optim.AdamW(params).defaults
    assert {k: ours[k] for k in ("lr", "betas", "eps", "weight_decay")} == {
        k: torchs[k] for k in ("lr", "betas", "eps", "weight_decay")
    }
    # NVIDIA apex's FusedLAMB: lr 1e-3, betas (0.9, 0.999), eps 1e-6, weight decay 0.01.
    lamb = LAMB(params).defaults
    assert (lamb["lr"], lamb["betas"], lamb["eps"], lamb["weight_decay"]) == (1e-3, (0.9, 0.999), 1e-6, 0.01)
    assert lamb["max_weight_norm"] is None and lamb["accum_type"] == ours["accum_type"] == torch.float32
    assert ours["stochastic_rounding"] is True and lamb["stochastic_rounding"] is True  # the IPU's default


def test_adamw_on_fp32_is_bit_identical_to_torchs_fused_adamw():
    def train(factory):  # enough elements for torch's kernels to differ in a last bit somewhere
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(1000))
        opt = factory([w])
        for i in range(5):
            w.grad = torch.randn(1000, generator=torch.Generator().manual_seed(i))
            opt.step()
        return w.detach()

    kwargs = dict(lr=1e-2, weight_decay=0.1)
    ours = train(lambda p: AdamW(p, stochastic_rounding=False, **kwargs))
    # (On this suite's CPU, torch's for-loop kernel differs from the fused one in a last bit here.)
    assert torch.equal(ours, train(lambda p: torch.optim.AdamW(p, fused=True, **kwargs)))


def test_a_gradient_handed_to_step_wins_over_a_stale_grad():
    w, reference = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(4))
    w.grad = torch.full((4,), 100.0)  # stale
    AdamW([w], lr=0.1, stochastic_rounding=False).step(gradients={w: torch.tensor([1.0, -1.0, 2.0, 0.5])})
    reference.grad = torch.tensor([1.0, -1.0, 2.0, 0.5])
    torch.optim.AdamW([reference], lr=0.1, fused=True).step()
    assert torch.equal(w, reference)


def test_adamw_without_bias_correction_takes_the_hand_worked_first_step():
    # m = (1 - 0.9) x 0.5, v = (1 - 0.999) x 0.25: the step is lr x m / (sqrt(v) + eps), uncorrected.
    w = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    w.grad = torch.tensor([0.5], dtype=torch.float64)
    AdamW([w], lr=0.01, weight_decay=0.0, eps=1e-8, bias_correction=False, stochastic_rounding=False).step()
    expected = 1.0 - 0.01 * 0.05 / (math.sqrt(0.00025) + 1e-8)
    assert w.item() == pytest.approx(expected, rel=1e-6)  # fp32 arithmetic


def _rounded_after_one_step(factory, seed, global_seed):
    w = torch.nn.Parameter(torch.ones(4096, dtype=torch.float16))
    opt = factory([w], seed)
    torch.manual_seed(global_seed)  # the global stream must not matter
    opt.step(gradients={w: -torch.ones(4096)})  # a step of ~1e-4: between two fp16 values near 1
    return w.detach().clone()


ROUNDING_OPTIMIZERS = {
    "adamw": lambda params, seed: AdamW(params, lr=1e-4, weight_decay=0.0, seed=seed),
    "adamw-no-bias-correction": lambda params, seed: AdamW(params, lr=1e-4, weight_decay=0.0, seed=seed,
                                                           bias_correction=False),
    "lamb": lambda params, seed: LAMB(params, lr=1e-4, weight_decay=0.0, seed=seed),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ROUNDING_OPTIMIZERS))
def test_stochastic_rounding_draws_from_the_optimizers_own_seeded_stream(name):
    factory = ROUNDING_OPTIMIZERS[name]
    first = _rounded_after_one_step(factory, seed=5, global_seed=0)
    assert set(first.float().unique().tolist()) == {1.0, 1.0009765625}  # rounded up or down at random
    assert torch.equal(first, _rounded_after_one_step(factory, seed=5, global_seed=1))
    assert not torch.equal(first, _rounded_after_one_step(factory, seed=6, global_seed=0))


@pytest.mark.parametrize("name", sorted(ROUNDING_OPTIMIZERS))
def test_a_resumed_optimizer_rounds_as_the_uninterrupted_one(name):
    factory = ROUNDING_OPTIMIZERS[name]
    w = torch.nn.Parameter(torch.ones(4096, dtype=torch.float16))
    opt = factory([w], 5)
    opt.step(gradients={w: -torch.ones(4096)})
    saved = copy.deepcopy(opt.state_dict())  # as read back from a checkpoint: shares no tensor with `opt`
    assert set(saved["stochastic_rounding"]["generators"]) == {"cpu"}
    clone = torch.nn.Parameter(w.detach().clone())
    resumed = factory([clone], 99)
    resumed.load_state_dict(saved)
    opt.step(gradients={w: -torch.ones(4096)})
    resumed.step(gradients={clone: -torch.ones(4096)})
    assert torch.equal(w, clone)


def test_loading_puts_moments_where_the_parameters_are_and_the_step_where_torch_does():
    w = torch.nn.Parameter(torch.randn(3))
    opt = AdamW([w])
    w.grad = torch.randn(3)
    opt.step()
    saved = opt.state_dict()
    ours, torchs = (
        torch.nn.Parameter(torch.empty(3, device="meta")),
        torch.nn.Parameter(torch.empty(3, device="meta")),
    )
    AdamW([ours]).load_state_dict(saved)
    reference = torch.optim.AdamW([torchs])
    reference.load_state_dict({k: v for k, v in saved.items() if k != "stochastic_rounding"})
    loaded = AdamW([ours])
    loaded.load_state_dict(saved)
    assert (
        {k: v.device.type for k, v in loaded.state[ours].items()}
        == {k: v.device.type for k, v in reference.state[torchs].items()}
        == {"step": "cpu", "exp_avg": "meta", "exp_avg_sq": "meta"}
    )


def test_a_torch_adamw_state_loads_without_a_rounding_stream():
    w, reference = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    torch_opt = torch.optim.AdamW([reference], lr=0.1)
    reference.grad = torch.tensor([1.0, 2.0, 3.0])
    torch_opt.step()
    ours = AdamW([w], lr=0.1)
    ours.load_state_dict(torch_opt.state_dict())
    assert torch.equal(ours.state[w]["exp_avg_sq"], torch_opt.state[reference]["exp_avg_sq"])


def test_lamb_updates_the_parameters_that_have_gradients_past_one_without():
    frozen, trained = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    trained.grad = torch.ones(2)
    LAMB([frozen, trained], lr=0.1, stochastic_rounding=False).step()
    assert torch.equal(frozen, torch.ones(2)) and not torch.equal(trained, torch.ones(2))
    assert frozen not in LAMB([frozen]).state


def test_lamb_keeps_fp32_moments_for_fp16_weights():
    w = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    opt = LAMB([w], stochastic_rounding=False)
    opt.step(gradients={w: torch.ones(4)})
    assert opt.state[w]["exp_avg"].dtype == opt.state[w]["exp_avg_sq"].dtype == torch.float32


def _lamb_first_step(w, g, **kwargs):
    w = torch.nn.Parameter(torch.tensor(w, dtype=torch.float64))
    w.grad = torch.tensor(g, dtype=torch.float64)
    LAMB([w], stochastic_rounding=False, **{"lr": 0.1, "weight_decay": 0.0, **kwargs}).step()
    return pytest.approx(w.detach().tolist(), rel=1e-6)  # fp32 arithmetic


def test_lamb_trust_ratio_hand_worked():
    """A first LAMB step (bias-corrected: m = g, v = g^2) is lr x trust x u, u = g / (|g| + eps)."""
    # ||w|| = 0.5 and ||u|| just below 1: the step is exactly lr x ||w|| along u.
    assert _lamb_first_step([0.5], [1.0]) == [0.45]
    # A zero weight (a bias at initialisation) takes a trust ratio of 1: the step is lr x u.
    assert _lamb_first_step([0.0, 0.0], [1.0, -1.0]) == [-0.1 / (1 + 1e-6), 0.1 / (1 + 1e-6)]
    # A zero update (no gradient, no decay) leaves the weight alone rather than dividing by zero.
    assert _lamb_first_step([3.0, 4.0], [0.0, 0.0]) == [3.0, 4.0]
    # eps enters the denominator: with gradients near eps the direction of u shows it.
    u = [1e-5 / (1e-5 + 1e-6), 1e-4 / (1e-4 + 1e-6)]
    norm = math.hypot(*u)
    expected = [3.0 - 0.1 * 5.0 * u[0] / norm, 4.0 - 0.1 * 5.0 * u[1] / norm]
    assert _lamb_first_step([3.0, 4.0], [1e-5, 1e-4], eps=1e-6) == expected
    # max_weight_norm caps ||w|| in the trust ratio: 1 instead of 5.
    capped = [3.0 - 0.1 * 2**-0.5, 4.0 - 0.1 * 2**-0.5]
    assert _lamb_first_step([3.0, 4.0], [1.0, 1.0], max_weight_norm=1.0) == capped


def test_a_run_resumed_with_its_weight_now_contiguous_takes_the_uninterrupted_steps():
    """Moments saved from a transposed weight keep their strides through a state dict; the weight reloaded
    contiguous (as safetensors writes it) must still take the same update, not fail on the layouts."""
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(300, 500, generator=g).half().t())  # 150,000 values: two chunks
    grads = [torch.randn(w.shape, generator=g) for _ in range(2)]
    opt = AdamW([w], lr=1e-2, first_order_momentum_accum_type=torch.float16, seed=1)
    opt.step(gradients={w: grads[0]})
    resumed_weight = torch.nn.Parameter(w.detach().contiguous())
    resumed = AdamW([resumed_weight], lr=1e-2, first_order_momentum_accum_type=torch.float16, seed=1)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert not resumed.state[resumed_weight]["exp_avg_sq"].is_contiguous()
    opt.step(gradients={w: grads[1]})
    resumed.step(gradients={resumed_weight: grads[1]})
    assert torch.equal(resumed_weight.detach().view(torch.int16), w.detach().contiguous().view(torch.int16))
