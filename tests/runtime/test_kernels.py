"""fp16 convolutions with fp32 partials: the numerics of an fp16 convolution, at fp32 speed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optimum_ipu.runtime.kernels import use_fp32_partials_in_convolutions


@pytest.mark.parametrize("make", [lambda: nn.Conv2d(3, 8, 4, stride=4), lambda: nn.Conv1d(4, 6, 3, padding=1, padding_mode="reflect")])
def test_fp32_partials_give_fp16_outputs_and_gradients_close_to_the_fp32_reference(make):
    torch.manual_seed(0)
    reference = make()
    half = make().half()
    half.load_state_dict({k: v.half() for k, v in reference.state_dict().items()})
    assert use_fp32_partials_in_convolutions(half) == 1
    x = torch.randn(2, reference.in_channels, *([16] * (reference.weight.dim() - 2)))

    out = half(x.half())
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), reference(x), atol=3e-3, rtol=3e-3)
    out.float().square().sum().backward()
    reference(x).square().sum().backward()
    assert half.weight.grad.dtype == torch.float16
    torch.testing.assert_close(half.weight.grad.float(), reference.weight.grad, atol=0.1, rtol=1e-2)
    assert set(half.state_dict()) == set(reference.state_dict())


def test_fp32_modules_are_left_to_their_own_forward():
    conv = nn.Conv2d(3, 4, 3)
    use_fp32_partials_in_convolutions(conv)
    x = torch.randn(1, 3, 8, 8)
    torch.testing.assert_close(conv(x), nn.functional.conv2d(x, conv.weight, conv.bias))
