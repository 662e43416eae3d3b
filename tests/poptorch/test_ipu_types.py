"""The IPU's types in a compiled model: no 64-bit results, float64 computed as float32, and half activations
computing in half with float32 weights (PopTorch's user guide, "Supported types" and "16-bit float
support"; its type_support_test.py and half_float_test.py)."""

import copy

import pytest
import torch
from fixtures import LinearRegression
from torch import nn

import poptorch


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        logits = self.linear(x)
        return logits, logits.argmax(-1)


def test_integer_results_come_back_int32():
    x = torch.randn(6, 4)
    logits, classes = poptorch.inferenceModel(Classifier())(x)
    want = Classifier()(x)[1]  # plain PyTorch: int64
    assert want.dtype == torch.int64
    assert classes.dtype == torch.int32
    assert torch.equal(classes, want.to(torch.int32))
    assert logits.dtype == torch.float32


def test_a_float64_model_computes_and_returns_float32_and_its_host_weights_stay_float64():
    model = Classifier().double()
    reference = copy.deepcopy(model).float()
    x = torch.randn(6, 4, dtype=torch.float64)
    logits, _ = poptorch.inferenceModel(model)(x)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, reference(x.float())[0])  # float32 arithmetic, bit for bit
    assert model.linear.weight.dtype == torch.float64


def test_a_float64_model_trains_in_float32_and_the_host_gets_the_update():
    model = LinearRegression().double()
    reference = copy.deepcopy(model).float()
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64)
    out, loss = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))(x, y)
    assert out.dtype == loss.dtype == torch.float32
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    _, want = reference(x.float(), y.float())
    want.backward()
    sgd.step()
    torch.testing.assert_close(loss, want.detach())
    assert model.linear.weight.dtype == torch.float64
    torch.testing.assert_close(model.linear.weight, reference.linear.weight.detach().double())


def test_a_float64_result_comes_back_float32():
    class Doubler(nn.Module):
        def forward(self, x):
            return x.double() * 2

    out = poptorch.inferenceModel(Doubler())(torch.ones(2, 3))
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.full((2, 3), 2.0))


def test_half_activations_with_float32_weights_compute_in_half():
    model = Classifier()
    x = torch.randn(6, 4).half()
    with pytest.raises(RuntimeError):  # plain PyTorch refuses the mix
        model(x)
    logits, _ = poptorch.inferenceModel(model)(x)
    assert logits.dtype == torch.float16
    want = nn.functional.linear(x.float(), model.linear.weight.half().float(), model.linear.bias.half().float())
    torch.testing.assert_close(logits.float(), want, atol=2e-3, rtol=2e-3)  # fp16 result of the same sum
    assert model.linear.weight.dtype == torch.float32


def test_half_activations_train_float32_weights():
    model = LinearRegression()
    before = model.linear.weight.detach().clone()
    x, y = torch.randn(8, 4).half(), torch.randn(8, 1)
    out, loss = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))(x, y)
    assert out.dtype == torch.float16 and torch.isfinite(loss)
    assert model.linear.weight.dtype == torch.float32
    assert not torch.equal(model.linear.weight, before)  # the float32 weights took the update


def test_float32_inputs_of_a_float32_model_stay_float32():
    class Echo(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, x):
            return x * self.scale

    assert poptorch.inferenceModel(Echo())(torch.ones(2)).dtype == torch.float32


def test_float32_activations_with_half_weights_compute_in_float32():
    """PopTorch's half_float_test: float32 in, float32 out from a `.half()` model (mixed inputs upcast)."""
    model = Classifier().half()
    x = torch.randn(6, 4)
    logits, _ = poptorch.inferenceModel(model)(x)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, Classifier().half().float()(x)[0])  # the half weights, in float32
    assert model.linear.weight.dtype == torch.float16
