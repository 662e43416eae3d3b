"""fp16 convolutions that run at fp32 speed on a CPU, with the IPU's numerics.

A torch CPU has no fast fp16 convolution backward: on a ViT patch embedding it is ~50x slower
than fp32 and dominates a whole training step. An IPU convolves fp16 tensors with fp32 partial
sums and writes an fp16 result. Upcasting the fp16 input and weight exactly, convolving in fp32 and
rounding the output back to fp16 is that same computation, and its autograd backward rounds the
weight gradient to fp16 the same way. Weights, activations and gradients stay fp16 in memory.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _forward_with_fp32_partials(self, input: torch.Tensor) -> torch.Tensor:
    if self.weight.dtype != torch.float16:
        return type(self).forward(self, input)
    bias = None if self.bias is None else self.bias.float()
    padding = self.padding
    if self.padding_mode != "zeros":
        input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
        padding = 0
    convolve = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[self.weight.dim() - 2]
    out = convolve(input.float(), self.weight.float(), bias, self.stride, padding, self.dilation, self.groups)
    return out.half()


def use_fp32_partials_in_convolutions(model: nn.Module) -> int:
    """Make every fp16 convolution of `model` on a CPU accumulate in fp32 (see module doc).

    Idempotent; the modules, their parameters and state_dict keys are unchanged (only the instance's
    `forward` is set). Returns how many convolutions now use it.
    """
    count = 0
    for module in model.modules():
        if isinstance(module, _CONVOLUTIONS) and module.weight.device.type == "cpu":
            module.forward = types.MethodType(_forward_with_fp32_partials, module)
            count += 1
    return count
