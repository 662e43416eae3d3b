"""Compiling a .half() model traces its forward with the fp16 arithmetic its calls use.

On a CPU the calls compute fp16 matmuls and convolutions from fp32 copies (`runtime/fp16_compute.py`); the
compile's trace ran them with torch's native fp16 kernels instead, ~200x slower for a convolution
(Stable Diffusion's UNet took minutes to compile where a call takes seconds).
"""

import torch
from torch import nn

import poptorch
from optimum_ipu.runtime.fp16_compute import active_fp32_partials


class _Seen(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.modes = []

    def forward(self, x):
        self.modes.append(active_fp32_partials() is not None)
        return self.conv(x)


def test_the_compile_trace_of_a_half_model_runs_with_the_calls_fp16_arithmetic(monkeypatch):
    monkeypatch.delenv("OPTIMUM_IPU_FP16_COMPUTE", raising=False)
    model = _Seen().half()
    executor = poptorch.inferenceModel(model)
    x = torch.randn(1, 2, 4, 4).half()
    executor.compile(x)
    assert model.modes and all(model.modes)  # every forward the compile ran
    conv = model.conv
    expected = nn.functional.conv2d(x.float(), conv.weight.float(), conv.bias.float(), padding=1).half()
    torch.testing.assert_close(executor(x), expected, atol=1e-3, rtol=1e-3)


def test_an_fp32_model_compiles_without_the_fp16_layer():
    model = _Seen()
    poptorch.inferenceModel(model).compile(torch.randn(1, 2, 4, 4))
    assert model.modes and not any(model.modes)
