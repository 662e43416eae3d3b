"""How an executable wires its parts: defaults, casts, reductions, the replica group, pipeline stages,
and what inference returns. A two-weight linear model keeps each test well under a second; every
reference is plain PyTorch on the same samples."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from optimum_ipu.call_layout import CallLayout
from optimum_ipu.runtime.batches import split_batch
from optimum_ipu.runtime.executor import InferenceExecutable, TrainingExecutable
from optimum_ipu.runtime.fp16_compute import FP32Partials, active_fp32_partials
from optimum_ipu.runtime.loss_scaling import LossScaler
from optimum_ipu.runtime.optimizers import AdamW
from optimum_ipu.runtime.replicas import LocalReplicas, ReplicaStreams


class Tiny(nn.Module):
    """Linear regression that records the dtype of its inputs and the fp16 compute context it runs under."""

    def __init__(self, as_dict=True):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1)
        self.as_dict = as_dict
        self.seen: list[tuple[torch.dtype, object]] = []

    def forward(self, x, labels=None):
        self.seen.append((x.dtype, active_fp32_partials()))
        out = self.linear(x).squeeze(-1)
        if not self.as_dict:
            return out
        loss = None if labels is None else ((out.float() - labels.float()) ** 2).mean()
        return {"loss": loss, "logits": out}


def cfg(ga=1, replicas=1, di=1):
    return CallLayout(gradient_accumulation_steps=ga, replication_factor=replicas, device_iterations=di)


def data(n, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 4, generator=g) * scale, "labels": torch.randn(n, generator=g) * scale}


def training(m, config, lr=0.1, optimizer=None, scaler=None, **kwargs):
    return TrainingExecutable(
        m, config, lambda mb: m(**mb)["loss"], optimizer or torch.optim.SGD(m.parameters(), lr=lr),
        scaler or LossScaler(), ReplicaStreams(0, config.replication_factor), **kwargs,
    )  # fmt: skip


def reference_step(batch, lr=0.1, losses=None):
    """Plain PyTorch: one SGD step on `losses(model, batch)` (default: the mean loss of the batch)."""
    m = Tiny()
    loss = losses(m, batch) if losses else m(**batch)["loss"]
    loss.backward()
    grad_norm = torch.nn.utils.get_total_norm([p.grad for p in m.parameters()]).item()
    torch.optim.SGD(m.parameters(), lr=lr).step()
    return m, grad_norm


def assert_same_weights(a, b, atol=1e-7):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=atol)


# With data of scale 30 a step is tens while a weight may end near 1: fp32 rounding of the step (one part
# in 1e7, in either summation order) shows up to ~1e-5 in the weight. A mean over the wrong count or a
# clipped step is off by whole units.
LARGE_STEP_ATOL = 2e-5


def test_gradients_are_not_clipped_unless_a_maximum_is_given():
    batch = data(4, scale=30.0)  # a gradient norm in the hundreds
    expected, norm = reference_step(batch)
    assert norm > 10
    m = Tiny()
    exe = training(m, cfg(ga=2))
    exe(batch)
    assert_same_weights(m, expected, atol=LARGE_STEP_ATOL)
    assert exe.last_grad_norm == pytest.approx(norm, rel=1e-5)  # the norm of the mean gradient


def test_without_measure_grad_norm_the_norm_is_measured_only_to_clip_and_the_update_is_the_same():
    """PopTorch's front end measures no norm it does not clip with: the fused check-and-unscale pass must
    give plain PyTorch's update (mean over 2 accumulation steps, not the sum, not scaled by S)."""
    batch = data(4, scale=30.0)
    expected, norm = reference_step(batch)
    m = Tiny()
    exe = training(m, cfg(ga=2), scaler=LossScaler(8.0), measure_grad_norm=False)
    exe(batch)
    assert_same_weights(m, expected, atol=LARGE_STEP_ATOL)
    assert exe.last_update_applied and exe.last_grad_norm is None
    clipped = Tiny()
    exe = training(clipped, cfg(ga=2), measure_grad_norm=False, max_grad_norm=1.0)
    exe(batch)
    assert exe.last_grad_norm == pytest.approx(norm, rel=1e-5)  # measured: clipping needs it


def test_without_measure_grad_norm_a_non_finite_gradient_still_skips_the_update():
    m = Tiny()
    before = [p.detach().clone() for p in m.parameters()]
    exe = TrainingExecutable(
        m, cfg(ga=2), lambda mb: m(**mb)["loss"] * float("inf"), torch.optim.SGD(m.parameters(), lr=0.1),
        LossScaler(), ReplicaStreams(0, 1), measure_grad_norm=False,
    )  # fmt: skip
    exe(data(4))
    assert not exe.last_update_applied and exe.loss_scaler.skipped_updates == 1
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), before))
    assert all(p.grad is None for p in m.parameters())


def test_a_skipped_first_update_reports_no_gradient_norm():
    m = Tiny().half()
    exe = training(m, cfg(), scaler=LossScaler(2.0**15), fp16_compute="native")
    exe(data(2, scale=1e3))  # overflows fp16 at this scale
    assert not exe.last_update_applied and exe.last_grad_norm is None


def test_sum_reduction_updates_with_the_sum_of_the_micro_batch_gradients():
    batch = data(8)
    pieces = split_batch(batch, 4)
    expected, _ = reference_step(batch, losses=lambda m, _: sum(m(**p)["loss"] for p in pieces))
    m = Tiny()
    training(m, cfg(ga=2, replicas=2), reduction="sum")(batch)
    assert_same_weights(m, expected)


def test_a_bad_reduction_is_refused_by_name():
    with pytest.raises(ValueError, match=re.escape("reduction must be 'mean' or 'sum', got 'max'.")):
        training(Tiny(), cfg(), reduction="max")


def test_losses_are_laid_out_by_device_iteration_replica_and_accumulation_step():
    batch = data(16)
    m = Tiny()
    losses = training(m, cfg(ga=2, replicas=2, di=2), lr=0.0)(batch)
    with torch.no_grad():
        expected = torch.stack([m(**p)["loss"] for p in split_batch(batch, 8)]).view(2, 2, 2)
    torch.testing.assert_close(losses, expected)


def test_accelerates_optimizer_wrapper_is_unwrapped():
    class Wrapper:  # accelerate's AcceleratedOptimizer keeps the real one in `.optimizer`
        def __init__(self, optimizer):
            self.optimizer = optimizer

        def step(self, *args, **kwargs):
            raise AssertionError("the wrapper's step skips updates under accelerate's own accumulation")

    m = Tiny()
    inner = torch.optim.SGD(m.parameters(), lr=0.1)
    exe = training(m, cfg(), optimizer=Wrapper(inner))
    assert exe.optimizer is inner
    batch = data(2)
    exe(batch)
    assert_same_weights(m, reference_step(batch)[0])


@pytest.mark.parametrize("mode", [None, "emulated", "native"])
def test_fp16_compute_is_emulated_by_default_with_the_weights_converted_once(mode):
    m = Tiny().half()
    kwargs = {} if mode is None else {"fp16_compute": mode}
    exe = training(m, cfg(ga=2), optimizer=AdamW(m.parameters(), lr=0.0), **kwargs)
    exe(data(4))
    InferenceExecutable(m, CallLayout(), 2, **kwargs)({"x": torch.randn(4, 4)})
    for dtype, active in m.seen:
        assert dtype == torch.float16  # fp32 inputs are cast to the model's dtype
        if mode == "native":
            assert active is None
        else:
            assert isinstance(active, FP32Partials)
            assert {id(w) for w in active.weights} == {id(p) for p in m.parameters()}


def test_an_update_of_one_micro_batch_converts_weights_per_op():
    # Nothing is shared between micro-batches, so a per-block copy would only add its bookkeeping.
    m = Tiny().half()
    exe = training(m, cfg(ga=1), optimizer=AdamW(m.parameters(), lr=0.0))
    exe(data(2))
    (_, active), *_ = m.seen
    assert isinstance(active, FP32Partials) and active.weights == []


def test_integer_inputs_keep_their_dtype():
    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(10, 2)

        def forward(self, ids):
            assert ids.dtype == torch.int64
            return {"loss": self.embedding(ids).float().sum(), "logits": self.embedding(ids)}

    m = Embed().half()
    exe = TrainingExecutable(m, cfg(), lambda mb: m(**mb)["loss"], AdamW(m.parameters(), lr=0.0),
                             LossScaler(), ReplicaStreams(0, 1))  # fmt: skip
    exe({"ids": torch.tensor([1, 2])})
    InferenceExecutable(m, CallLayout(), 1)({"ids": torch.tensor([1, 2])})


def test_a_step_where_no_parameter_gets_a_gradient_changes_nothing():
    # Only a tensor outside the model trains (a prompt-tuning embedding handed in with the batch).
    m = Tiny().requires_grad_(False)
    prompt = torch.zeros(4, requires_grad=True)
    before = [p.clone() for p in m.parameters()]
    exe = TrainingExecutable(m, cfg(ga=2), lambda mb: m(mb["x"] + prompt, mb["labels"])["loss"],
                             torch.optim.SGD(m.parameters(), lr=0.1), LossScaler(), ReplicaStreams(0, 1))  # fmt: skip
    exe(data(4))
    assert exe.last_update_applied and all(torch.equal(p, b) for p, b in zip(m.parameters(), before))


def test_gradients_are_summed_over_the_replica_group_which_the_loss_scaler_consults():
    class Recording(LocalReplicas):
        def __init__(self):
            self.summed, self.consulted = [], 0

        def sum_(self, tensors):
            self.summed.append([t.shape for t in tensors])

        def any(self, flag):
            self.consulted += 1
            return super().any(flag)

    group = Recording()
    m = Tiny()
    batch = data(4)
    training(m, cfg(ga=2), replicas=group)(batch)
    assert group.summed == [[torch.Size([1, 4]), torch.Size([1])]] and group.consulted >= 1
    assert_same_weights(m, reference_step(batch)[0])


def test_pipeline_stages_get_each_replicas_micro_batches_at_the_loss_scale():
    class Stages:
        """Stands in for `PipelineStages`: runs the micro-batches it is handed, records what it got."""

        def __init__(self, model):
            self.model, self.calls = model, []

        def run(self, micro_batches, scale):
            self.calls.append(([mb["x"][0, 0].item() for mb in micro_batches], scale))
            losses = [self.model(**mb)["loss"] for mb in micro_batches]
            (scale * sum(losses)).backward()
            return torch.stack([loss.detach() for loss in losses])

    batch = data(8)
    m = Tiny()
    stages = Stages(m)
    losses = training(m, cfg(ga=2, replicas=2), scaler=LossScaler(8.0), stages=stages)(
        batch
    )
    firsts = batch["x"][:, 0].tolist()
    assert stages.calls == [([firsts[0], firsts[2]], 8.0), ([firsts[4], firsts[6]], 8.0)]
    with torch.no_grad():
        expected_losses = torch.stack([Tiny()(**p)["loss"] for p in split_batch(batch, 4)]).view(1, 2, 2)
    torch.testing.assert_close(losses, expected_losses)
    assert_same_weights(m, reference_step(batch)[0])


def test_inference_concatenates_plain_tensor_outputs():
    m = Tiny(as_dict=False)
    x = torch.randn(6, 4)
    out = InferenceExecutable(m, CallLayout(), micro_batch_size=2)({"x": x})
    with torch.no_grad():
        torch.testing.assert_close(out, m(x))


def test_inference_on_padding_only_reports_no_loss():
    m = Tiny()
    out = InferenceExecutable(m, CallLayout(), micro_batch_size=2)(data(4), real_samples=0)
    assert "loss" not in out and out["logits"].shape == (4,)
