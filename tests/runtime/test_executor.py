"""The host call's batch arithmetic must equal plain PyTorch on the whole batch."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from fixtures import tiny_bert_config
from transformers import BertForSequenceClassification

from optimum_ipu.runtime import checks
from optimum_ipu.runtime.executor import TrainingExecutable, split_batch
from optimum_ipu.runtime.precision import LossScaler


def cfg(ga=1, replicas=1, di=1, output_mode="final"):
    return SimpleNamespace(
        gradient_accumulation_steps=ga, replication_factor=replicas, device_iterations=di, output_mode=output_mode
    )


def batch(n, seed=0, seq=10):
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(5, 128, (n, seq), generator=g),
        "attention_mask": torch.ones(n, seq, dtype=torch.long),
        "labels": torch.randint(0, 2, (n,), generator=g),
    }


def model():
    torch.manual_seed(0)
    return BertForSequenceClassification(tiny_bert_config())


def executable(m, config, lr=0.0, loss_scaling=1.0, auto=False, max_grad_norm=0.0):
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    scaler = LossScaler(opt, initial_scale=loss_scaling, auto=auto)
    return TrainingExecutable(m, config, lambda mb: m(**mb).loss, opt, scaler, max_grad_norm=max_grad_norm)


def plain_grads(m, data):
    m.zero_grad()
    m(**data).loss.backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def grads(m):
    return {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("ga,replicas", [(4, 1), (1, 4), (2, 3)])
def test_accumulation_and_replicas_equal_one_big_batch(ga, replicas):
    reference = model()
    data = batch(2 * ga * replicas)
    expected = plain_grads(reference, data)
    m = copy.deepcopy(reference)
    m.zero_grad()
    executable(m, cfg(ga=ga, replicas=replicas))(data)
    for name, grad in grads(m).items():
        torch.testing.assert_close(grad, expected[name], atol=1e-6, rtol=1e-4, msg=name)


def test_device_iterations_step_the_optimizer_once_each():
    """DI=2 at combined 8 == two SGD steps on consecutive halves (the second left for the trainer)."""
    reference, m = model(), model()
    data = batch(8)
    first, second = split_batch(data, 2)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference.zero_grad()
    reference(**first).loss.backward()
    opt.step()
    expected = plain_grads(reference, second)

    exe = executable(m, cfg(ga=2, di=2), lr=0.1)
    m.zero_grad()
    exe(data)
    for name, grad in grads(m).items():
        torch.testing.assert_close(grad, expected[name], atol=1e-6, rtol=1e-4, msg=name)


def test_output_modes_shape_the_returned_losses():
    data = batch(12)
    m = model()
    all_losses = executable(m, cfg(ga=3, replicas=2, di=2, output_mode="all"))(data)
    assert all_losses.shape == (2, 2, 3)
    final = executable(model(), cfg(ga=3, replicas=2, di=2, output_mode="final"))(data)
    torch.testing.assert_close(final, all_losses[:, :, -1])
    summed = executable(model(), cfg(ga=3, replicas=2, di=2, output_mode="sum"))(data)
    torch.testing.assert_close(summed, all_losses.sum(-1), atol=1e-4, rtol=1e-4)


def test_static_loss_scaling_in_fp32_leaves_the_update_unchanged():
    data = batch(8)
    plain, scaled = model(), model()
    executable(plain, cfg(ga=4), lr=0.5)(data)
    executable(scaled, cfg(ga=4), lr=0.5, loss_scaling=64)(data)
    for (name, a), (_, b) in zip(plain.named_parameters(), scaled.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_automatic_loss_scaling_backs_off_skips_and_recovers():
    m = model().half()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    exe = executable(m, cfg(ga=2), lr=1e-3, loss_scaling=2.0**15, auto=True)
    exe.loss_scaler.growth_interval = 2

    # Inject an overflow: a huge loss multiplier makes the fp16 gradients infinite.
    exe.loss_fn = lambda mb: m(**mb).loss * 6e4
    exe(batch(4))
    assert not exe.last_update_applied
    assert all(p.grad is None for p in m.parameters())  # nothing for the optimizer to apply
    assert exe.loss_scaler.scale == 2.0**14
    exe.optimizer.step()
    for name, p in m.named_parameters():
        assert torch.equal(p, before[name]), name

    exe.loss_fn = lambda mb: m(**mb).loss
    for step in range(2):
        exe.optimizer.zero_grad(set_to_none=True)
        exe(batch(4, seed=step))
        assert exe.last_update_applied
        exe.optimizer.step()
    assert exe.loss_scaler.scale == 2.0**15  # grew back after `growth_interval` clean updates
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_loss_scale_state_travels_with_the_optimizer_state_dict():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    LossScaler(opt, initial_scale=512, auto=True)._set(256.0, 7)
    restored = torch.optim.SGD(m.parameters(), lr=0.1)
    restored.load_state_dict(opt.state_dict())
    scaler = LossScaler(restored, initial_scale=512, auto=True)
    assert scaler.scale == 256.0
    assert restored.param_groups[0]["loss_scaling_clean_steps"] == 7


def test_invalid_batch_dimension():
    exe = executable(model(), cfg(ga=4, replicas=2))
    with pytest.raises(checks.IPUCompilationError, match=r"Invalid batch dimension.*not a multiple of.*= 8"):
        exe(batch(12))


def test_compile_time_checks_name_the_rule_and_the_fix():
    with pytest.raises(checks.IPUCompilationError, match=r"2N−1 = 7 .*gradient_accumulation_steps=4"):
        checks.check_pipelined_training(4, 4)
    checks.check_pipelined_training(7, 4)
    checks.check_pipelined_training(1, 1)
    with pytest.raises(checks.IPUCompilationError, match="inference_device_iterations >= 4"):
        checks.check_pipelined_inference(2, 4)
    with pytest.raises(checks.IPUCompilationError, match="not a power of two"):
        checks.check_num_ipus(3, 2)
    assert checks.check_num_ipus(3, 2, auto_round=True) == 8
    with pytest.raises(checks.IPUCompilationError, match="at most 64"):
        checks.check_num_ipus(8, 16)
    assert checks.check_num_ipus(4, 4) == 16
