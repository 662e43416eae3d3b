"""Gradients of one update: fp16 ones summed in fp32, the global norm taken in fp32, clipping by torch's rule."""

from __future__ import annotations

import math

import torch

from optimum_ipu.runtime.gradients import GradientAccumulator, clip_, global_norm


def test_global_norm_of_fp16_gradients_is_computed_in_fp32():
    # Each square (3.6e9) and the norm (120,000) are far above fp16's maximum of 65,504.
    grads = [torch.full((3,), 60000.0, dtype=torch.float16), torch.full((1,), 60000.0, dtype=torch.float16)]
    norm = global_norm(grads)
    assert norm.dtype == torch.float32
    assert norm.item() == math.sqrt(4 * 60000.0**2) == 120000.0


def test_global_norm_of_no_gradients_is_zero():
    assert global_norm([]).item() == 0.0


def test_global_norm_gathers_the_norms_of_gradients_on_different_devices():
    # Pipeline stages can hold their gradients on different devices; the meta device stands in for a
    # second one (it holds no values, so only the device of the result is checked).
    norm = global_norm([torch.ones(4, device="meta"), torch.ones(3)])
    assert norm.device.type == "meta" and norm.shape == ()


def _clipped_by_torch(grads, max_norm):
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    return [p.grad for p in params]


def test_clipping_scales_gradients_by_torchs_coefficient():
    # A small norm (0.01) makes torch's 1e-6 in max_norm / (norm + 1e-6) visible: 1e-4 of the result.
    grads = [torch.tensor([0.006, 0.0]), torch.tensor([0.008])]
    expected = _clipped_by_torch(grads, 0.005)
    clip_(grads, 0.005, global_norm(grads))
    for ours, reference in zip(grads, expected):
        torch.testing.assert_close(ours, reference, rtol=1e-6, atol=0)


def test_clipping_leaves_gradients_alone_below_the_maximum_or_when_disabled_or_not_finite():
    grads = [torch.tensor([3.0, 4.0])]  # norm 5
    for max_norm, norm in [(10.0, 5.0), (0.0, 5.0), (1.0, math.inf), (1.0, math.nan)]:
        clip_(grads, max_norm, torch.tensor(norm))
        assert grads[0].tolist() == [3.0, 4.0], (max_norm, norm)


def test_one_micro_batch_needs_no_hook_and_several_sum_in_fp32():
    def run(micro_batches):
        p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))
        unused = [torch.nn.Parameter(torch.zeros(1, dtype=dtype)) for dtype in (torch.float16, torch.float32)]
        accumulator = GradientAccumulator([p, *unused])  # a weight without a gradient is left out
        with accumulator.collecting(micro_batches):
            hooked = bool(p._post_accumulate_grad_hooks)
            for _ in range(micro_batches):
                (p.float() * torch.tensor([2049.0, 1025.0])).sum().backward()
        ((_, grad),) = accumulator.gradients()
        return hooked, grad

    hooked, grad = run(1)
    assert not hooked and grad.dtype == torch.float32
    assert grad.tolist() == [2048.0, 1025.0]  # each micro-batch's gradient is fp16: 2049 rounds to 2048
    hooked, grad = run(3)
    # Three fp16 gradients of 1025 summed in fp32 give 3075; summed in fp16 they would give 3076.
    assert hooked and grad.tolist() == [3 * 2048.0, 3075.0]


def test_an_fp16_gradient_joins_an_fp32_sum_without_a_weight_sized_temporary():
    """Adding an fp16 gradient to an fp32 buffer as it is makes torch convert it into a fresh fp32 tensor of
    the weight's size at every micro-batch; fresh memory of that size is new pages from the kernel on many
    hosts, which cost more than the sum. The conversion goes chunk by chunk through scratch memory the
    accumulator keeps, smaller than the weight: nothing weight-sized is allocated after the first
    micro-batch, and the sums are exact."""
    n = 2 * (1 << 17) + 3  # three chunks, the last one short
    weight = torch.nn.Parameter(torch.zeros(n, dtype=torch.float16))
    one = torch.tensor(
        1.0, dtype=torch.float16
    )  # an fp16 forward: no fp32 tensor of the weight's size is due
    accumulator = GradientAccumulator([weight])
    with accumulator.collecting(4):
        (weight * one).sum().backward()
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        ) as run:
            for scale in (2.0, 4.0, 8.0):
                (weight * (one * scale)).sum().backward()
    ((_, grad),) = accumulator.gradients()
    assert grad.dtype == torch.float32 and grad.eq(15.0).all()
    weight_sized = [(e.name, e.cpu_memory_usage) for e in run.events() if e.cpu_memory_usage >= 4 * n]
    assert weight_sized == []


def test_an_empty_fp16_weight_sums_to_an_empty_fp32_gradient():
    """A weight of no elements (a zero-width layer) still has a gradient at every micro-batch: summing it
    into the fp32 buffer is a no-op, not an error."""
    empty = torch.nn.Parameter(torch.zeros(0, 4, dtype=torch.float16))
    other = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    accumulator = GradientAccumulator([empty, other])
    with accumulator.collecting(2):
        for _ in range(2):
            (empty.float().sum() + other.float().sum()).backward()
    grads = {p.shape: g for p, g in accumulator.gradients()}
    assert grads[empty.shape].shape == (0, 4) and grads[other.shape].tolist() == [2.0, 2.0, 2.0]


def _update(accumulator, weights, scales):
    """One update: a micro-batch per scale, each the gradient `scale` on every weight; the sums handed out."""
    with accumulator.collecting(len(scales)):
        for scale in scales:
            sum((w.float() * scale).sum() for w in weights).backward()
    return {id(p): grad for p, grad in accumulator.gradients()}


def test_each_update_sums_its_own_micro_batches_in_buffers_kept_from_the_last():
    """An update's sums start from zero, whatever the last update summed, and land in the same tensors at
    every update (no fresh memory per update: allocating weight-sized buffers cost more than the sums)."""
    for dtype in (torch.float32, torch.float16):
        weights = [torch.nn.Parameter(torch.zeros(70_000, dtype=torch.float16)) for _ in range(2)]
        accumulator = GradientAccumulator(weights, dtype=dtype)
        first = _update(accumulator, weights, [1.0, 2.0, 4.0])
        addresses = {key: g.data_ptr() for key, g in first.items()}
        assert all(g.eq(7.0).all() for g in first.values())
        accumulator.clear()  # the update's end
        second = _update(accumulator, weights, [0.5, 0.25])
        assert all(g.eq(0.75).all() for g in second.values()), dtype  # not 7.75: each update starts at zero
        assert {key: g.data_ptr() for key, g in second.items()} == addresses, dtype
        fresh = _update(GradientAccumulator(weights, dtype=dtype), weights, [0.5, 0.25])
        for key, grad in second.items():
            assert torch.equal(grad, fresh[key])


def test_a_running_mean_counts_the_micro_batches_that_gave_a_weight_no_gradient_as_zeros():
    """On the IPU every micro-batch produces every gradient (zero where a weight was not used), so a weight
    used by one micro-batch of two has half that gradient as its mean."""
    used, unused = (torch.nn.Parameter(torch.zeros(3, dtype=torch.float16)) for _ in range(2))
    accumulator = GradientAccumulator([used, unused], dtype=torch.float16, running_mean=True)
    with accumulator.collecting(2):
        (used.float() * 6.0).sum().backward()
        (used.float() * 2.0 + unused.float() * 8.0).sum().backward()
    grads = {id(p): g for p, g in accumulator.gradients()}
    assert accumulator.mean_over == 2
    assert grads[id(used)].tolist() == [4.0] * 3 and grads[id(unused)].tolist() == [4.0] * 3


def test_a_gradient_arriving_in_parts_within_one_micro_batch_joins_the_running_mean_once():
    """A weight used in two segments of a reentrant checkpoint gets its gradient in two parts within one
    backward; the running mean takes their sum as that micro-batch's gradient. With h = x * w * w * second
    (w = x = 1), each segment's part is `second`: 10 + 10, then 8 + 8, the mean 18 (counting each part
    as a micro-batch would give the mean of 10, 10, 8, 8: 9)."""
    w = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    accumulator = GradientAccumulator([w], dtype=torch.float16, running_mean=True)

    def segment(h, scale):
        return h * w.float() * scale

    with accumulator.collecting(2):
        for index, (first, second) in enumerate(((6.0, 10.0), (8.0, 8.0))):
            accumulator.micro_batch(index)
            x = torch.ones(2, requires_grad=True)
            h = torch.utils.checkpoint.checkpoint(segment, x, first, use_reentrant=True)
            h = torch.utils.checkpoint.checkpoint(segment, h / first, second, use_reentrant=True)
            h.sum().backward()
    ((_, grad),) = accumulator.gradients()
    assert grad.tolist() == [18.0, 18.0]
