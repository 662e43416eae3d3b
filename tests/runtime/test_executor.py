"""The host call: batch arithmetic equals plain PyTorch; fp16 loss scaling loses no gradient; replicas differ."""

from __future__ import annotations

import pytest
import torch
from fixtures import tiny_bert_config
from transformers import BertForSequenceClassification

from optimum_ipu.call_layout import CallLayout, InvalidBatchError
from optimum_ipu.runtime import checks
from optimum_ipu.runtime.batches import split_batch
from optimum_ipu.runtime.executor import InferenceExecutable, TrainingExecutable
from optimum_ipu.runtime.loss_scaling import LossScaler
from optimum_ipu.runtime.optimizers import AdamW
from optimum_ipu.runtime.replicas import ReplicaStreams


def cfg(ga=1, replicas=1, di=1):
    return CallLayout(gradient_accumulation_steps=ga, replication_factor=replicas, device_iterations=di)


def batch(n, seed=0, seq=10):
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(5, 128, (n, seq), generator=g),
        "attention_mask": torch.ones(n, seq, dtype=torch.long),
        "labels": torch.randint(0, 2, (n,), generator=g),
    }


def model(**config):
    torch.manual_seed(0)
    return BertForSequenceClassification(tiny_bert_config(**config))


def executable(m, config, lr=0.0, loss_scaling=1.0, auto=False, max_grad_norm=0.0, optimizer=None, seed=0):
    opt = optimizer or torch.optim.SGD(m.parameters(), lr=lr)
    return TrainingExecutable(
        m, config, lambda mb: m(**mb).loss, opt, LossScaler(loss_scaling, auto=auto),
        ReplicaStreams(seed, config.replication_factor), max_grad_norm=max_grad_norm,
    )  # fmt: skip


def sgd_step(m, data, lr):
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    m.zero_grad()
    m(**data).loss.backward()
    opt.step()


def assert_same_weights(a, b, atol=1e-6):
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(p, q, atol=atol, rtol=1e-5, msg=name)


@pytest.mark.parametrize("ga,replicas", [(4, 1), (1, 4), (2, 3)])
def test_accumulation_and_replicas_equal_one_big_batch(ga, replicas):
    reference, m = model(), model()
    data = batch(2 * ga * replicas)
    sgd_step(reference, data, lr=0.5)
    exe = executable(m, cfg(ga=ga, replicas=replicas), lr=0.5)
    exe(data)
    assert all(p.grad is None for p in m.parameters())  # the executable leaves nothing for the Trainer's step
    assert_same_weights(reference, m)


def test_device_iterations_step_once_each_with_the_clip_inside_the_call():
    """DI=2 at combined 8 == two clipped SGD steps on consecutive halves."""
    reference, m = model(), model()
    data = batch(8)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for half in split_batch(data, 2):
        reference.zero_grad()
        reference(**half).loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
        opt.step()
    executable(m, cfg(ga=2, di=2), lr=0.1, max_grad_norm=0.05)(data)
    assert_same_weights(reference, m)


def test_a_call_returns_every_micro_batch_loss_by_iteration_replica_and_step():
    data = batch(12)
    exe = executable(model(), cfg(ga=3, replicas=2, di=2))
    losses = exe(data)
    assert losses.shape == (2, 2, 3)  # each front end picks what it reports (PopTorch: its output mode)
    assert torch.equal(losses, exe.last_losses)


def test_static_loss_scaling_in_fp32_leaves_the_update_unchanged():
    data = batch(8)
    plain, scaled = model(), model()
    executable(plain, cfg(ga=4), lr=0.5)(data)
    executable(scaled, cfg(ga=4), lr=0.5, loss_scaling=64)(data)
    assert_same_weights(plain, scaled)


@pytest.mark.parametrize("ga,replicas", [(1, 1), (4, 2), (16, 4)])
def test_backward_runs_at_the_full_loss_scale_whatever_ga_and_replicas(ga, replicas):
    """Each micro-batch's backward sees S x its gradient (the IPU scales every micro-batch by S)."""
    m = model()
    seen = []
    m.classifier.weight.register_hook(lambda grad: seen.append(grad.detach().clone()))
    data = batch(ga * replicas)
    executable(m, cfg(ga=ga, replicas=replicas), loss_scaling=64.0)(data)
    reference = model()
    reference(**split_batch(data, ga * replicas)[0]).loss.backward()
    torch.testing.assert_close(seen[0], 64.0 * reference.classifier.weight.grad, atol=1e-5, rtol=1e-4)


class _Spy(AdamW):
    """AdamW that records the gradients it is handed."""

    def step(self, closure=None, gradients=None):
        self.received = {p: g.clone() for p, g in (gradients or {}).items()}
        return super().step(closure, gradients)


def test_fp16_with_loss_scaling_loses_no_representable_gradient():
    """GA 16 x 4 replicas, S = 64: gradients reach the optimizer unscaled in fp32, not flushed in fp16."""
    data = batch(64, seq=8)
    reference = model().double()
    reference(**data).loss.backward()
    truth = {n: p.grad for n, p in reference.named_parameters()}

    m = model().half()
    spy = _Spy(m.parameters(), lr=0.0, weight_decay=0.0)
    executable(m, cfg(ga=16, replicas=4), loss_scaling=64.0, optimizer=spy)(data)
    received = {n: spy.received[p] for n, p in m.named_parameters()}
    nonzero = torch.cat([(truth[n] != 0).flatten() for n in truth])
    lost = torch.cat([((truth[n] != 0) & (received[n] == 0)).flatten() for n in truth])
    assert lost.sum() / nonzero.sum() < 1e-3, (int(lost.sum()), int(nonzero.sum()))
    assert all(g.dtype == torch.float32 for g in received.values())


@pytest.mark.parametrize("scale,trains", [(1.0, False), (1024.0, True)])
def test_a_loss_whose_gradients_underflow_fp16_trains_only_with_a_loss_scale(scale, trains):
    m = model().half()
    before = [p.detach().clone() for p in m.parameters()]
    opt = AdamW(m.parameters(), lr=1e-2, weight_decay=0.0, stochastic_rounding=False)
    exe = executable(m, cfg(ga=2), loss_scaling=scale, optimizer=opt)
    exe.loss_fn = lambda mb: m(**mb).loss * 1e-4  # most true gradients fall below fp16's subnormals
    exe(batch(4))
    changed = sum(int((p != b).sum()) for p, b in zip(m.parameters(), before))
    total = sum(p.numel() for p in m.parameters())
    assert (changed / total > 0.5) is trains and (changed / total < 0.05) is not trains, changed / total


def test_an_overflow_skips_the_update_and_automatic_scaling_backs_off_then_grows():
    m = model().half()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = AdamW(m.parameters(), lr=1e-3)
    exe = executable(m, cfg(ga=2), loss_scaling=2.0**14, auto=True, optimizer=opt)
    exe.loss_fn = lambda mb: m(**mb).loss * 6e4  # fp16 gradients overflow
    exe(batch(4))
    assert not exe.last_update_applied and exe.loss_scaler.skipped_updates == 1
    assert exe.loss_scaler.scale == 2.0**13
    for name, p in m.named_parameters():
        assert torch.equal(p, before[name]), name
    assert not opt.state  # no moment was touched

    exe.loss_fn = lambda mb: m(**mb).loss
    exe(batch(4, seed=1))
    assert exe.last_update_applied and exe.loss_scaler.scale == 2.0**14  # head-room: doubled
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_automatic_scaling_halves_when_gradients_crowd_the_top_of_fp16():
    scaler = LossScaler(1024.0, auto=True)
    near_top = [torch.full((10,), 0.5 * 65504 * 4)]  # sums over 4 micro-batches: a mean at half of fp16 max
    assert scaler.unscale_(near_top, micro_batches=4) is not None
    assert scaler.scale == 512.0
    small = [torch.full((10,), 1.0)]
    scaler.unscale_(small, micro_batches=4)
    assert scaler.scale == 1024.0


def test_replicas_draw_different_dropout_masks_and_repeat_run_to_run():
    def run(replicas, ga, seed=0):
        m = model(hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)
        return executable(m, cfg(ga=ga, replicas=replicas), seed=seed)(batch(8)).flatten()

    two_replicas = run(2, 4)
    assert torch.equal(two_replicas, run(2, 4))  # reproducible
    assert not torch.equal(two_replicas, run(1, 8))  # not a longer accumulation of one replica
    assert not torch.equal(two_replicas, run(2, 4, seed=1))


def test_sharded_inference_runs_micro_batches_and_leaves_padding_out_of_the_loss():
    m = model().eval()
    data = batch(6)
    with torch.no_grad():
        expected = m(**data)
    padded = {k: torch.cat([v, v[:2]]) for k, v in data.items()}  # 6 real + 2 repeated samples
    out = InferenceExecutable(m, CallLayout(), micro_batch_size=2, fp16_compute="native")(padded, real_samples=6)
    torch.testing.assert_close(out.logits[:6], expected.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.loss, expected.loss, atol=1e-5, rtol=1e-4)
    partial = InferenceExecutable(m, CallLayout(), micro_batch_size=4, fp16_compute="native")(padded, real_samples=6)
    torch.testing.assert_close(partial.loss, expected.loss, atol=1e-5, rtol=1e-4)


def test_invalid_batch_dimension():
    exe = executable(model(), cfg(ga=4, replicas=2))
    with pytest.raises(InvalidBatchError, match=r"Invalid batch dimension.*not a multiple of.*= 8"):
        exe(batch(12))


def test_compile_time_checks_name_the_rule_and_the_fix():
    with pytest.raises(
        checks.IPUCompilationError, match=r"2S−1 = 7 for S = 4 .*gradient_accumulation_steps=4"
    ):
        checks.check_pipelined_training(4, 4)
    checks.check_pipelined_training(7, 4)
    checks.check_pipelined_training(1, 1)
    with pytest.raises(checks.IPUCompilationError, match=r"2S−1 = 9 for S = 5 .*head tied"):
        checks.check_pipelined_training(7, 4, forward_stages=5)
    checks.check_pipelined_training(9, 4, forward_stages=5)
    with pytest.raises(checks.IPUCompilationError, match="not a power of two"):
        checks.check_num_ipus(3, 2)
    assert checks.check_num_ipus(3, 2, auto_round=True) == 8
    with pytest.raises(checks.IPUCompilationError, match="at most 64"):
        checks.check_num_ipus(8, 16)
    assert checks.check_num_ipus(4, 4) == 16


class _OneWeight(torch.nn.Module):
    """loss = sum(w * x): each micro-batch's gradient of w is the sum of its rows of x."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1, dtype=dtype))

    def loss(self, micro):
        return (self.w.float() * micro["x"].float()).sum()


class _SeenGradients(torch.optim.SGD):
    def step(self, closure=None, gradients=None):
        self.seen = [g.clone() for g in (gradients or {}).values()]


def test_fp16_gradients_of_an_updates_micro_batches_are_summed_in_fp32():
    # Three micro-batches whose fp16 gradient is 1025 each: summed in fp32 3075, in fp16 3076.
    m = _OneWeight(torch.float16)
    optimizer = _SeenGradients(m.parameters(), lr=0.0)
    exe = TrainingExecutable(
        m, cfg(ga=3), m.loss, optimizer, LossScaler(), ReplicaStreams(0, 1), reduction="sum"
    )
    exe({"x": torch.full((3, 1), 1025.0)})
    assert optimizer.seen[0].tolist() == [3075.0]


def test_a_step_that_starts_taking_fp32_gradients_between_updates_is_handed_them():
    """Whether a step takes `gradients=` is read from the step in place at each update (it is remembered
    per step function, not per optimizer): a step wrapped or replaced on the instance is read again."""
    m = _OneWeight(torch.float16)
    optimizer = torch.optim.SGD(m.parameters(), lr=0.0)
    exe = TrainingExecutable(m, cfg(), m.loss, optimizer, LossScaler(), ReplicaStreams(0, 1))
    exe({"x": torch.full((1, 1), 3.0)})  # a torch step: fp32 working copies, no `gradients=`
    seen = []
    optimizer.step = lambda closure=None, gradients=None: seen.append({p: g.tolist() for p, g in gradients.items()})
    exe({"x": torch.full((1, 1), 5.0)})
    assert seen == [{m.w: [5.0]}]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_an_fp16_gradient_accumulator_rounds_each_addition_to_fp16(dtype):
    # Optimum Graphcore's fp16 training sums the micro-batch gradients in fp16: 3 x 1025 gives
    # 1025 -> 2050 -> 3076 (3075 lies halfway between fp16's 3074 and 3076, and ties go to even),
    # whatever the weights' type; the sum reaches the optimizer as the fp32 value it holds.
    m = _OneWeight(dtype)
    optimizer = _SeenGradients(m.parameters(), lr=0.0)
    exe = TrainingExecutable(m, cfg(ga=3), m.loss, optimizer, LossScaler(), ReplicaStreams(0, 1), reduction="sum",
                             accumulator_dtype=torch.float16)  # fmt: skip
    seen = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(
        [g.clone() for g in (kwargs.get("gradients") or {}).values()] or [m.w.grad.clone()]))  # fmt: skip
    exe({"x": torch.full((3, 1), 1025.0)})
    # fp16 weights: an fp32 gradient handed to step(); fp32 weights: their .grad, which the optimizer reads
    assert seen[0][0].dtype == torch.float32 and seen[0][0].tolist() == [3076.0]


def test_an_fp16_gradient_accumulator_sums_loss_scaled_gradients_and_overflows_beyond_65504():
    # The accumulator holds loss-scaled gradients: 3 x 1.0 at scale 2**14 is 49,152 (fits), at 2**15
    # 98,304 (beyond fp16's 65,504): inf, an overflow the loss scaler sees, so the update is skipped.
    for scale, applied in ((2.0**14, True), (2.0**15, False)):
        m = _OneWeight(torch.float16)
        optimizer = _SeenGradients(m.parameters(), lr=0.0)
        exe = TrainingExecutable(m, cfg(ga=3), m.loss, optimizer, LossScaler(scale), ReplicaStreams(0, 1),
                                 reduction="sum", accumulator_dtype=torch.float16)  # fmt: skip
        exe({"x": torch.ones(3, 1)})
        assert exe.last_update_applied is applied
        if applied:
            assert optimizer.seen[0].tolist() == [3.0]  # unscaled in fp32 after the fp16 sum


def test_an_fp16_accumulator_under_a_mean_reduction_holds_poptorchs_running_mean():
    """PopTorch sets `MeanReductionStrategy.Running` whenever the optimizer's accum_type is fp16
    (`_optimizer_attributes.py`), and PopART's running mean keeps acc = a * acc + b * g with
    b = 1 / (k + 1), a = 1 - b after k micro-batches: never above the largest gradient, so loss-scaled
    gradients whose sum would overflow fp16 still update (Optimum Graphcore's fp16 training, GA 64)."""
    # Hand-worked: 1, then 0.5 * 1 + 0.5 * 2 = 1.5, then (2/3) * 1.5 + (1/3) * x3, held in fp16: 7/3 for
    # x3 = 4 (rounded to fp16), 2 for x3 = 3. At scale 2**14 the largest gradient, 3 * 2**14, fits fp16;
    # the sum, 6 * 2**14, does not: a summing accumulator would overflow and skip the update.
    for scale, x3, held in ((1.0, 4.0, torch.tensor(7 / 3).half().item()), (2.0**14, 3.0, 2.0)):
        m = _OneWeight(torch.float16)
        optimizer = _SeenGradients(m.parameters(), lr=0.0)
        exe = TrainingExecutable(m, cfg(ga=3), m.loss, optimizer, LossScaler(scale), ReplicaStreams(0, 1),
                                 accumulator_dtype=torch.float16)  # fmt: skip
        exe({"x": torch.tensor([[1.0], [2.0], [x3]])})
        assert exe.last_update_applied, scale
        assert optimizer.seen[0].tolist() == [held], scale


class _TwinProcess:
    """Replica 0 of 2 in this process; the other process (replica 1) had the same gradients, so the sum
    over processes doubles them."""

    def local_replicas(self, replication_factor):
        return range(1)

    def sum_(self, tensors):
        torch._foreach_mul_(list(tensors), 2.0)

    def any(self, flag):
        return bool(flag)

    def sum_over_stages(self, value):
        return value

    def gather_losses(self, losses):
        return losses


def test_a_running_mean_over_replica_processes_is_a_mean_before_it_is_held_in_fp16():
    """Two replica processes each hold the running mean 40,000 (loss-scaled); their sum, 80,000, is past
    fp16's 65,504, their mean is not. The IPU's running mean is a mean over replicas too: the update
    applies, with the mean."""
    m = _OneWeight(torch.float16)
    optimizer = _SeenGradients(m.parameters(), lr=0.0)
    exe = TrainingExecutable(m, cfg(ga=2, replicas=2), m.loss, optimizer, LossScaler(2.0**14),
                             ReplicaStreams(0, 2), replicas=_TwinProcess(), accumulator_dtype=torch.float16)  # fmt: skip
    exe({"x": torch.tensor([[2.0], [2.8828125], [0.0], [0.0]])})  # this process takes rows 0-1 (replica 0)
    assert exe.last_update_applied
    mean = torch.tensor((2.0 + 2.8828125) / 2 * 2.0**14).half().float() / 2.0**14  # held in fp16, unscaled
    assert optimizer.seen[0].tolist() == [mean.item()]


def test_a_fresh_executable_has_returned_no_losses_and_skipped_no_update():
    m = _OneWeight()
    exe = TrainingExecutable(m, cfg(), m.loss, torch.optim.SGD(m.parameters(), lr=0.1), LossScaler(),
                             ReplicaStreams(0, 1))  # fmt: skip
    assert exe.last_losses.numel() == 0 and exe.last_update_applied is True and exe.last_grad_norm is None


class _NormRecordingScaler(LossScaler):
    def unscale_(self, grads, micro_batches, replicas, norm=True, **kwargs):
        self.norms = [*getattr(self, "norms", []), norm]
        return super().unscale_(grads, micro_batches, replicas, norm=norm, **kwargs)


@pytest.mark.parametrize("max_grad_norm", [0.0, -1.0])
def test_an_update_that_neither_clips_nor_reports_measures_no_norm(max_grad_norm):
    # A max_grad_norm of 0 or below means no clipping (transformers' rule); PopTorch reports no norm.
    m = _OneWeight()
    scaler = _NormRecordingScaler()
    exe = TrainingExecutable(m, cfg(di=2), m.loss, torch.optim.SGD(m.parameters(), lr=0.5), scaler,
                             ReplicaStreams(0, 1), max_grad_norm=max_grad_norm, measure_grad_norm=False)  # fmt: skip
    exe({"x": torch.tensor([[3.0], [4.0]])})
    assert scaler.norms == [False, False] and exe.last_grad_norm is None
    assert m.w.item() == pytest.approx(-0.5 * 3.0 - 0.5 * 4.0)  # both updates applied, unclipped


def test_inference_runs_a_model_without_weights_and_casts_nothing():
    class Double(torch.nn.Module):
        def forward(self, x):
            return {"logits": 2 * x}

    x = torch.arange(4.0).view(4, 1)
    out = InferenceExecutable(Double(), CallLayout(), micro_batch_size=2)({"x": x})
    assert out["logits"].dtype == torch.float32 and out["logits"].flatten().tolist() == [0.0, 2.0, 4.0, 6.0]


def test_inference_inputs_of_different_lengths_are_each_cut_by_their_own_length():
    # PopTorch's rule: a call of 2 micro-batches cuts x (2 rows per micro-batch) and y (3 per
    # micro-batch, 1-D) each into halves; `flag` (not a tensor) and `scale` (0-dim) go to both whole.
    class Shapes(torch.nn.Module):
        def forward(self, x, y, flag, scale):
            assert flag is True and scale.dim() == 0
            row = torch.stack([x.sum(), y.sum(), torch.tensor(float(len(y)))]) * scale
            return {"logits": row.expand(len(x), 3)}  # one row per sample of x

    x, y = torch.arange(4.0).view(4, 1), torch.arange(6.0)
    out = InferenceExecutable(Shapes(), CallLayout(), micro_batch_size=2)(
        {"x": x, "y": y, "flag": True, "scale": torch.tensor(1.0)}
    )
    first, second = [0.0 + 1.0, 0.0 + 1.0 + 2.0, 3.0], [2.0 + 3.0, 3.0 + 4.0 + 5.0, 3.0]
    assert out["logits"].tolist() == [first, first, second, second]


def test_inference_micro_batches_have_the_micro_batch_size_and_the_last_one_is_partial():
    class RowsSeen(torch.nn.Module):
        def forward(self, x):
            return {"logits": torch.full((len(x), 1), float(len(x)))}

    out = InferenceExecutable(RowsSeen(), CallLayout(), micro_batch_size=4)({"x": torch.zeros(6, 1)})
    assert out["logits"].flatten().tolist() == [4.0, 4.0, 4.0, 4.0, 2.0, 2.0]
