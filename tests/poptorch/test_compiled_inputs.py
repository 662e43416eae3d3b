"""After compiling, a call with other arguments, dtypes, shapes or constant values is PopTorch's error.

PopTorch 3.4 (`inputs_test.py`, `_args_parser.py`): the graph is compiled for the first call's inputs;
another input raises `poptorch.Error` naming the argument, what was compiled for and what came, then says
how to recompile. The same inputs, or the same tensors passed by name, run.
"""

import pytest
import torch
from torch import nn

import poptorch


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x, y=None, scale=1.0):
        out = self.linear(x) * scale
        return out if y is None else out + y


def compiled():
    model = poptorch.inferenceModel(TwoInputs())
    model(torch.randn(4, 3), torch.randn(4, 2))
    return model


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((torch.randn(4, 3).double(), torch.randn(4, 2)), {},
         r"Data type mismatch for x: expected torch.float32 but got torch.float64\."),
        ((torch.randn(8, 3), torch.randn(8, 2)), {},
         r"Shape mismatch for x: expected torch.Size\(\[4, 3\]\) but got torch.Size\(\[8, 3\]\)\."),
        ((torch.randn(4, 3),), {}, r"Number of positional arguments mismatch: expected 2 arguments but got 1\."),
        ((torch.randn(4, 3),), {"scale": 2.0}, r"Keys mismatch for named arguments: Unexpected arguments: "
                                               r"scale\. Missing arguments: y\."),
        ((torch.randn(4, 3), None), {}, r"Type mismatch for y: expected <class 'torch.Tensor'> but got "
                                        r"<class 'NoneType'>\."),
    ],
    ids=["dtype", "shape", "fewer arguments", "other arguments", "None for a tensor"],
)  # fmt: skip
def test_another_input_after_compiling_is_poptorchs_error(args, kwargs, message):
    model = compiled()
    with pytest.raises(poptorch.Error, match=message) as error:
        model(*args, **kwargs)
    assert "don't match the inputs used to compile the model" in str(error.value)
    assert "call destroy() on the current one" in str(error.value)


def test_a_constant_argument_must_keep_the_value_compiled_for():
    model = poptorch.inferenceModel(TwoInputs())
    model(torch.randn(4, 3), scale=2.0)
    with pytest.raises(poptorch.Error, match=r"Value mismatch for scale: expected 2.0 but got 3.0\."):
        model(torch.randn(4, 3), scale=3.0)


def test_the_same_inputs_by_position_or_by_name_run():
    model = compiled()
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    torch.testing.assert_close(model(x, y), model(x=x, y=y))


def test_destroy_lets_the_model_compile_for_new_inputs():
    model = compiled()
    model.destroy()
    assert model(torch.randn(8, 3), torch.randn(8, 2)).shape == (8, 2)


def test_a_training_model_checks_its_inputs_too():
    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 1)

        def forward(self, x):
            return poptorch.identity_loss(self.linear(x).sum(), reduction="sum")

    model = poptorch.trainingModel(WithLoss())
    model(torch.randn(2, 3))
    with pytest.raises(poptorch.Error, match=r"Shape mismatch for x"):
        model(torch.randn(2, 4))
