"""PopTorch's op helpers (for_loop, cond, CPU, MultiConv, NameScope, dynamic_slice/update, set_overlap_for_*,
isRunningOnIpu) against the plain PyTorch code each stands for, and PopTorch's errors with its wording.

Training checks: one trainingModel step (SGD with momentum, DI x GA = 2 x 2) gives the weights of the
plain loop over the same micro-batches within 1e-6.
"""

import copy
import logging

import pytest
import torch
from torch import nn

import poptorch
from optimum_ipu import _once

DI, GA, MB = 2, 2, 3


def plain_steps(model, x, y, lr=0.1):
    """The plain loop: per device iteration, the mean of GA micro-batch gradients, one SGD step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    xs, ys = x.reshape(DI, GA, MB, *x.shape[1:]), y.reshape(DI, GA, MB, *y.shape[1:])
    for d in range(DI):
        opt.zero_grad()
        for g in range(GA):
            (model(xs[d, g], ys[d, g])[1] / GA).backward()
        opt.step()


def ipu_steps(model, x, y, lr=0.1):
    opts = poptorch.Options().deviceIterations(DI)
    opts.Training.gradientAccumulation(GA)
    training = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    )
    training(x, y)
    training.destroy()


def assert_same_weights(a, b, atol=1e-6):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=atol, msg=name)


def batch(features=4, outputs=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = DI * GA * MB
    return torch.randn(n, features, generator=g), torch.randn(n, outputs, generator=g)


@pytest.fixture(autouse=True)
def _say_no_effect_again():
    """Each test sees the "no effect" notes afresh (they are said once per process)."""
    _once.forget()
    yield


# -- for_loop ----------------------------------------------------------------------------------------------------
class Loop(nn.Module):
    def forward(self, x, y, z, w):
        def body(x, y, z, w):
            return x * y, y + z, x * w, w + 1

        return poptorch.for_loop(5, body, [x, y, z, w])


def test_for_loop_feeds_each_iterations_outputs_back_and_returns_the_last_as_a_list():
    x, y, z, w = (torch.rand(4, 3) for _ in range(4))
    out = poptorch.inferenceModel(Loop())(x, y, z, w)
    ex, ey, ez, ew = x, y, z, w
    for _ in range(5):
        ex, ey, ez, ew = ex * ey, ey + ez, ex * ew, ew + 1
    assert isinstance(out, list) and len(out) == 4
    for got, expected in zip(out, [ex, ey, ez, ew]):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_for_loop_in_a_half_model_equals_the_plain_half_loop():
    layer = nn.Linear(4, 4).half()

    class HalfLoop(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return poptorch.for_loop(3, lambda a: torch.tanh(self.layer(a)), [x])[0]

    x = torch.randn(2, 4).half()
    out = poptorch.inferenceModel(HalfLoop())(x)
    expected = x
    with torch.no_grad():
        for _ in range(3):
            expected = torch.tanh(layer(expected))
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, expected, rtol=1e-3, atol=1e-3)


def test_for_loop_body_gets_copies_of_its_inputs():
    class InPlace(nn.Module):
        def forward(self, x):
            def body(y):
                y += 1
                return y

            return poptorch.for_loop(3, body, [x])[0]

    x = torch.ones(2, 5, dtype=torch.int32)
    out = poptorch.inferenceModel(InPlace())(x)
    torch.testing.assert_close(x, torch.ones(2, 5, dtype=torch.int32))  # the caller's tensor is untouched
    torch.testing.assert_close(out, torch.full((2, 5), 4, dtype=torch.int32))


def test_for_loop_inputs_must_be_a_list_of_tensors_with_poptorchs_messages():
    class NotList(nn.Module):
        def forward(self, x):
            return poptorch.for_loop(2, lambda a: a, x)

    class NotTensor(nn.Module):
        def forward(self, x):
            return poptorch.for_loop(2, lambda a, b: (a, b), [x, 5])

    with pytest.raises(ValueError, match=r"\(Object is not list\)"):
        poptorch.inferenceModel(NotList())(torch.ones(2))
    with pytest.raises(ValueError, match=r"\(Object contained in list at index 1 is not torch.tensor\)"):
        poptorch.inferenceModel(NotTensor())(torch.ones(2))


def test_for_loop_body_returns_one_tensor_per_input_of_the_same_shape():
    class Fewer(nn.Module):
        def forward(self, x):
            return poptorch.for_loop(2, lambda a, b: a + b, [x, x])

    class Grows(nn.Module):
        def forward(self, x):
            return poptorch.for_loop(2, lambda a: torch.cat([a, a], dim=1), [x])

    with pytest.raises(poptorch.Error, match="returned 1 tensors for 2 inputs"):
        poptorch.inferenceModel(Fewer())(torch.ones(2, 3))
    with pytest.raises(poptorch.Error, match="keeps its shape and dtype"):
        poptorch.inferenceModel(Grows())(torch.ones(2, 3))


class LoopWithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x, y):
        out = poptorch.for_loop(2, lambda a: self.layer(a), [x])[0]
        return out, nn.functional.mse_loss(out, y)


def test_for_loop_in_a_training_model_is_poptorchs_error_while_plain_pytorch_trains_through_it():
    with pytest.raises(poptorch.Error, match=r"poptorch.for_loop\(\) is only supported in inference."):
        poptorch.trainingModel(LoopWithLoss())(*batch())
    model = LoopWithLoss()  # outside a wrapper it is a Python loop: gradients flow
    model(*batch())[1].backward()
    assert model.layer.weight.grad.abs().sum() > 0


# -- cond --------------------------------------------------------------------------------------------------------
class Branches(nn.Module):
    def forward(self, condition, x, y):
        def then_body(a):
            return a * 2, x + y

        def else_body(b):
            return b - x, y * 3  # reads tensors of the enclosing forward

        return poptorch.cond(condition[0], then_body, [x], else_body, [y])


@pytest.mark.parametrize("flag", [True, False])
def test_cond_runs_the_branch_the_condition_picks(flag):
    x, y = torch.rand(1, 3), torch.rand(1, 3)
    model = poptorch.inferenceModel(Branches())
    out = model(torch.tensor([[flag]]), x, y)
    expected = [x * 2, x + y] if flag else [y - x, y * 3]
    assert isinstance(out, list) and len(out) == 2
    for got, want in zip(out, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # the same compiled model follows the condition's value on the next call
    again = model(torch.tensor([[not flag]]), x, y)
    torch.testing.assert_close(again[0], (y - x) if flag else (x * 2), rtol=0, atol=0)


def test_cond_branches_get_copies_of_their_inputs():
    class InPlace(nn.Module):
        def forward(self, condition, x):
            def then_body(a):
                return a.add_(1)

            return poptorch.cond(condition[0], then_body, [x], lambda b: b, [x])[0]

    x = torch.zeros(1, 3)
    out = poptorch.inferenceModel(InPlace())(torch.tensor([[True]]), x)
    torch.testing.assert_close(x, torch.zeros(1, 3))
    torch.testing.assert_close(out, torch.ones(1, 3))


def test_cond_checks_with_poptorchs_messages():
    class NotList(nn.Module):
        def forward(self, condition, x):
            return poptorch.cond(condition[0], lambda a: a, x, lambda a: a, [x])

    class Uneven(nn.Module):
        def forward(self, condition, x):
            return poptorch.cond(condition[0], lambda a: (a, a), [x], lambda a: a, [x])

    class Reshaped(nn.Module):
        def forward(self, condition, x):
            return poptorch.cond(condition[0], lambda a: a.reshape(-1), [x], lambda a: a, [x])

    flag, x = torch.tensor([[True]]), torch.ones(1, 2, 2)
    with pytest.raises(ValueError, match=r"to be a list of tensors. \(Object is not list\)"):
        poptorch.inferenceModel(NotList())(flag, x)
    with pytest.raises(poptorch.Error, match="then_body returned 2 outputs and else_body 1"):
        poptorch.inferenceModel(Uneven())(flag, x)  # found when compiling, whichever branch is taken
    with pytest.raises(poptorch.Error, match=r"output 0 is \(4,\) in then_body and \(1, 2, 2\) in else_body"):
        poptorch.inferenceModel(Reshaped())(flag, x)
    with pytest.raises(poptorch.Error, match="one element"):
        poptorch.cond(torch.tensor([True, False]), lambda: x, [], lambda: x, [])


def test_cond_in_a_training_model_is_poptorchs_error():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 4)

        def forward(self, x, y):
            out = poptorch.cond(x[0, 0] > 0, self.layer, [x], self.layer, [x])[0]
            return out, nn.functional.mse_loss(out, y)

    with pytest.raises(poptorch.Error, match=r"poptorch.cond\(\) is only supported in inference."):
        poptorch.trainingModel(Model())(*batch())


# -- CPU host callbacks --------------------------------------------------------------------------------------------
def test_cpu_op_runs_its_function_on_host_tensors_and_returns_to_the_model():
    seen = []

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.cpu = poptorch.CPU(self.on_host, "MyCPUOp")
            self.twice = poptorch.CPU(lambda a: a * 2.0, "Twice")

        def on_host(self, x, y):
            seen.append((x.device.type, x.requires_grad))
            out = (x * y, x + y)
            x.zero_()  # the host's copy: the model's tensor is not touched
            return out

        def forward(self, x, y):
            w, z = self.cpu(x, y)
            return self.twice(self.twice(w * 3.0)), z

    x, y = torch.randn(4, 3), torch.full((4, 1), 2.0)
    x_before = x.clone()
    out, out2 = poptorch.inferenceModel(Model(), poptorch.Options().deviceIterations(2))(x, y)
    torch.testing.assert_close(out, x * y * 12.0, rtol=0, atol=1e-6)
    torch.testing.assert_close(out2, x + y, rtol=0, atol=0)
    assert set(seen) == {("cpu", False)}
    torch.testing.assert_close(x_before, x, rtol=0, atol=0)


def test_cpu_op_freezes_a_module_it_is_given():
    layer = nn.Linear(3, 3)
    poptorch.CPU(layer, "Frozen")
    assert not any(p.requires_grad for p in layer.parameters())


class HostScaled(nn.Module):
    """A CPU op on the input (no gradient needed) in a training model, then a trained layer."""

    def __init__(self, detach=True):
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.scale = poptorch.CPU(lambda a: a * 0.5 + 1.0, "Scale")
        self.detach = detach

    def forward(self, x, y):
        h = self.scale(x) if self.detach else self.scale(self.layer(x))
        out = self.layer(h)
        return out, nn.functional.mse_loss(out, y)


def test_cpu_op_on_tensors_without_gradient_trains_as_the_plain_loop():
    torch.manual_seed(0)
    model, reference = HostScaled(), None
    reference = copy.deepcopy(model)
    x, y = batch()
    ipu_steps(model, x, y)
    plain_steps(reference, x, y)
    assert_same_weights(model, reference)


def test_cpu_op_on_a_tensor_needing_a_gradient_in_training_is_an_error():
    with pytest.raises(poptorch.Error, match="CPU ops are only supported in inference graphs"):
        poptorch.trainingModel(HostScaled(detach=False))(*batch())


# -- MultiConv and NameScope --------------------------------------------------------------------------------------
class TwoConvs(nn.Module):
    def __init__(self, multiconv=None, name_scope=False):
        super().__init__()
        self.a = nn.Conv1d(1, 2, 3, padding=1)
        self.b = nn.Conv1d(1, 2, 3, padding=1)
        self.head = nn.Linear(16, 4)
        self.multiconv = multiconv
        self.name_scope = name_scope

    def convs(self, u):
        return self.a(u), self.b(u.flip(-1))

    def forward(self, x, y):
        u = x.unsqueeze(1)
        if self.multiconv is not None:
            with self.multiconv:
                p, q = self.convs(u)
        else:
            p, q = self.convs(u)
        if self.name_scope:
            with poptorch.NameScope("head"):
                out = self.head(torch.cat([p, q], dim=1).flatten(1).tanh())
        else:
            out = self.head(torch.cat([p, q], dim=1).flatten(1).tanh())
        return out, nn.functional.mse_loss(out, y)


def full_multiconv():
    return (
        poptorch.MultiConv()
        .availableMemoryProportions((0.8, 0.7))
        .partialsTypes(torch.float)
        .planType(poptorch.MultiConvPlanType.Parallel)
        .perConvReservedTiles(100)
        .cycleBackOff(0.3)
        .enableConvDithering(True)
    )


@pytest.mark.parametrize("scoped", ["multiconv", "name_scope"])
def test_multiconv_and_name_scope_train_as_the_plain_loop(scoped):
    torch.manual_seed(0)
    plain = TwoConvs()
    model = copy.deepcopy(plain)
    if scoped == "multiconv":
        model.multiconv = full_multiconv()
    else:
        model.name_scope = True
    x, y = batch()
    ipu_steps(model, x, y)
    plain_steps(plain, x, y)
    assert_same_weights(model, plain)


def test_multiconv_in_a_half_model_equals_plain_convolutions():
    torch.manual_seed(0)
    plain = TwoConvs().half()
    model = copy.deepcopy(plain)
    model.multiconv = poptorch.MultiConv()
    x, y = (t.half() for t in batch())
    out = poptorch.inferenceModel(model)(x, y)[0]
    torch.testing.assert_close(out, poptorch.inferenceModel(plain)(x, y)[0], rtol=0, atol=0)


def test_multiconv_and_name_scope_say_once_that_they_have_no_effect(caplog):
    x, y = batch()
    with caplog.at_level(logging.WARNING, logger="poptorch"):
        model = poptorch.inferenceModel(TwoConvs(full_multiconv(), name_scope=True))
        model(x, y)
        model(x, y)
    said = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    for name in ("poptorch.MultiConv ", "poptorch.MultiConv.planType", "poptorch.NameScope"):
        assert sum(m.startswith(name) for m in said) == 1, (name, said)


def test_multiconv_checks_with_poptorchs_messages():
    class Nested(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(1, 1, 1)

        def forward(self, x):
            with poptorch.MultiConv():
                with poptorch.MultiConv():
                    return self.conv(x)

    class Empty(nn.Module):
        def forward(self, x):
            with poptorch.MultiConv():
                return torch.pow(x, 2)

    x = torch.ones(2, 1, 4)
    with pytest.raises(poptorch.Error, match="Nested poptorch.MultiConv is not supported"):
        poptorch.inferenceModel(Nested())(x)
    with pytest.raises(poptorch.Error, match="Unexpected end_multi_conv"):
        poptorch.inferenceModel(Empty())(x)
    Empty()(x)  # outside a wrapper PopTorch checks nothing
    with pytest.raises(poptorch.Error, match="given 3 values for the 2 convolutions"):
        multiconv = poptorch.MultiConv().availableMemoryProportions([0.1, 0.2, 0.3])
        poptorch.inferenceModel(TwoConvs(multiconv))(*batch())
    with pytest.raises(ValueError, match="Invalid partials types"):
        poptorch.MultiConv().partialsTypes("half")
    with pytest.raises(AssertionError, match="Invalid plan type"):
        poptorch.MultiConv().planType("parallel")
    with pytest.raises(AssertionError, match="Invalid available memory proportion"):
        poptorch.MultiConv().availableMemoryProportions(1)
    with pytest.raises(ValueError, match="value must be bool or list of bools"):
        poptorch.MultiConv().enableConvDithering("yes")
    with pytest.raises(AssertionError, match="Parameter to NameScope must be a string"):
        poptorch.NameScope(3)


# -- dynamic_slice / dynamic_update ------------------------------------------------------------------------------
@pytest.mark.parametrize("step", [1, 2, 3])
@pytest.mark.parametrize("start", [0, 2, 4])
def test_dynamic_slice_is_narrow_then_step(start, step):
    class Slice(nn.Module):
        def forward(self, t, s):
            return poptorch.dynamic_slice(t, 1, s[0], 4, step)

    t = torch.arange(16.0).reshape(2, 8)
    model = poptorch.inferenceModel(Slice())
    # compiled on other values: the start is read on every call
    model.compile(torch.randn(2, 8), torch.tensor([[7]]))
    out = model(t, torch.tensor([[start]]))
    torch.testing.assert_close(out, t.narrow(1, start, 4)[:, ::step], rtol=0, atol=0)


def test_dynamic_slice_start_past_the_end_wraps_around_as_poplibs_does():
    t = torch.arange(8.0)
    torch.testing.assert_close(
        poptorch.dynamic_slice(t, 0, torch.tensor(6), 4, 1), torch.tensor([6.0, 7, 0, 1])
    )


def test_dynamic_update_replaces_the_slice():
    t, src = torch.zeros(2, 8), torch.ones(2, 3)
    out = poptorch.dynamic_update(t, src, 1, torch.tensor([2]), 3)
    expected = t.clone()
    expected[:, 2:5] = src
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert t.sum() == 0  # a new tensor


class Sliced(nn.Module):
    def __init__(self, helpers=True):
        super().__init__()
        self.layer = nn.Linear(8, 8)
        self.patch = nn.Parameter(torch.randn(1, 2))
        self.helpers = helpers

    def forward(self, x, y):
        h = self.layer(x)
        start = (x[:, :1].abs().sum() * 0).long() + 2  # a start held in a tensor (2)
        if self.helpers:
            part = poptorch.dynamic_slice(h, 1, start, 4, 1)
            upd = poptorch.dynamic_update(part, self.patch.expand(h.shape[0], 2).to(h.dtype), 1, start - 1, 2)
        else:
            part = h[:, 2:6]
            upd = torch.cat([part[:, :1], self.patch.expand(h.shape[0], 2).to(h.dtype), part[:, 3:]], dim=1)
        return upd, nn.functional.mse_loss(upd, y)


def test_dynamic_slice_and_update_train_as_the_plain_loop():
    torch.manual_seed(0)
    model = Sliced()
    plain = copy.deepcopy(model)
    plain.helpers = False
    x, y = batch(8, 4)
    ipu_steps(model, x, y)
    plain_steps(plain, x, y)
    assert_same_weights(model, plain)


def test_dynamic_slice_and_update_in_a_half_training_model_equal_plain_indexing():
    torch.manual_seed(0)
    model = Sliced().half()
    plain = copy.deepcopy(model)
    plain.helpers = False
    x, y = batch(8, 4)
    ipu_steps(model, x.half(), y.half())
    ipu_steps(plain, x.half(), y.half())
    assert_same_weights(model, plain, atol=0)


def test_dynamic_slice_and_update_errors_have_poptorchs_messages():
    t, s = torch.arange(8.0), torch.tensor([1])
    cases = [
        (lambda: poptorch.dynamic_slice(t, 0, s, 0, 1), "The start and end of a slice must be different."),
        (lambda: poptorch.dynamic_slice(t, 0, s, -2, 1), "with the end less than the start is not supported"),
        (
            lambda: poptorch.dynamic_slice(t, 0, s, 7, 1),
            r"The size of the slice \(7\) must be a factor of the",
        ),
        (
            lambda: poptorch.dynamic_slice(t, 0, 1, 4, 1),
            "Slice start argument to dynamic_slice must be a torch.tensor",
        ),
        (lambda: poptorch.dynamic_slice(t, 0.0, s, 4, 1), "Dimension must be an integer."),
        (lambda: poptorch.dynamic_slice(t, 0, s, 4, 0), "Slicing step must be at least 1"),
        (lambda: poptorch.dynamic_update(t, torch.ones(2, 2), 0, s, 2), "must have same dimensionality"),
        (lambda: poptorch.dynamic_update(t, torch.ones(2).long(), 0, s, 2), "must have same dtype"),
        (lambda: poptorch.dynamic_update(t, torch.ones(3), 0, s, 2), r"src has shape \(3,\)"),
    ]
    for call, message in cases:
        with pytest.raises(poptorch.Error, match=message):
            call()


# -- set_overlap_for_input / output, isRunningOnIpu ---------------------------------------------------------------
class Overlapped(nn.Module):
    def forward(self, x):
        x = poptorch.set_overlap_for_input(x, poptorch.OverlapMode.OverlapDeviceIterationLoop)
        return poptorch.set_overlap_for_output({"y": x * 2}, poptorch.OverlapMode.OverlapDeviceIterationLoop)


def test_overlapped_io_returns_its_tensors_and_checks_poptorchs_requirements():
    x = torch.arange(4.0)
    with pytest.raises(
        poptorch.Error, match="Overlapped IO is not supported with poptorch.PipelinedExecution"
    ):
        poptorch.inferenceModel(Overlapped())(x)
    opts = poptorch.Options()
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    with pytest.raises(poptorch.Error, match="No IO tiles allocated"):
        poptorch.inferenceModel(Overlapped(), opts)(x)
    opts = opts.clone()
    opts.TensorLocations.numIOTiles(32)
    torch.testing.assert_close(poptorch.inferenceModel(Overlapped(), opts)(x)["y"], x * 2)
    opts = opts.clone()
    opts.outputMode(poptorch.OutputMode.Final)
    with pytest.raises(poptorch.Error, match="Unsupported output mode for overlapped IO"):
        poptorch.inferenceModel(Overlapped(), opts)(x)
    with pytest.raises(poptorch.Error, match="You may only set overlap for torch.tensor inputs"):
        poptorch.set_overlap_for_input([x, 3], poptorch.OverlapMode.NoOverlap)


def test_is_running_on_ipu_only_inside_a_wrapper():
    class Path(nn.Module):
        def forward(self, x):
            return x + 1 if poptorch.isRunningOnIpu() else x - 1

    x = torch.zeros(2)
    assert not poptorch.isRunningOnIpu()
    torch.testing.assert_close(Path()(x), x - 1)
    torch.testing.assert_close(poptorch.inferenceModel(Path())(x), x + 1)
    assert not poptorch.isRunningOnIpu()
