"""IPU numerics: stochastic rounding is unbiased; the IPU optimizers match their references."""

from __future__ import annotations

import pytest
import torch

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


@pytest.mark.parametrize("accum_type", [torch.float32, torch.float16])
def test_fused_adamw_equals_the_written_out_rule_on_fp16_weights(accum_type):
    """`step()` runs torch's fused kernel on fp32 working copies; `_step_one` is the reference rule."""
    torch.manual_seed(0)
    fused = [torch.nn.Parameter(torch.randn(300).half()) for _ in range(3)]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in fused]
    kwargs = dict(lr=1e-3, weight_decay=0.01, accum_type=accum_type, stochastic_rounding=False)
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
        # Same rule; the fused kernel may order fp32 operations differently: at most one fp16 ulp apart.
        torch.testing.assert_close(a, b, atol=0, rtol=2**-10)
        assert opt_fused.state[a]["exp_avg"].dtype == accum_type
        torch.testing.assert_close(opt_fused.state[a]["exp_avg_sq"], opt_reference.state[b]["exp_avg_sq"])
    assert int(opt_fused.state[fused[0]]["step"]) == 10


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
