"""The wrapped model's life cycle and PopTorch's errors: compile, attach/detach, destroy, losses, batches."""

import copy

import pytest
import torch
from torch import nn

import poptorch


class WithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x, y=None):
        out = self.linear(x)
        return out if y is None else (out, nn.functional.cross_entropy(out, y))


def batch(n=4):
    return torch.randn(n, 3), torch.randint(0, 2, (n,))


def test_compile_on_first_call_or_compile():
    model = poptorch.trainingModel(WithLoss())
    assert not model.isCompiled()
    model.compile(*batch())
    assert model.isCompiled() and model.isAttachedToDevice()


def test_detach_and_attach_give_poptorchs_errors():
    model = poptorch.trainingModel(WithLoss())
    with pytest.raises(poptorch.Error, match="Model has not been compiled or has been destroyed."):
        model.detachFromDevice()
    model(*batch())
    model.detachFromDevice()
    with pytest.raises(poptorch.Error, match="Device is not attached"):
        model.detachFromDevice()
    model.attachToDevice()
    with pytest.raises(poptorch.Error, match="Device is already attached"):
        model.attachToDevice()
    model.detachFromDevice()
    model(*batch())  # a call attaches again
    assert model.isAttachedToDevice()


def test_wrapping_twice_needs_destroy():
    module = WithLoss()
    first = poptorch.trainingModel(module)
    with pytest.raises(
        RuntimeError, match="already been wrapped in 'poptorch.trainingModel'. Call model.destroy()"
    ):
        poptorch.trainingModel(module)
    first.destroy()
    assert not first.isCompiled()
    poptorch.trainingModel(module)(*batch())


def test_inference_with_gradient_accumulation_is_refused_at_wrap_time():
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    with pytest.raises(
        poptorch.Error, match=r"gradientAccumulation to 1 or leave it as its default value \(1\)"
    ):
        poptorch.inferenceModel(nn.Linear(3, 2), opts)


def test_invalid_batch_dimension_uses_poptorchs_message():
    opts = poptorch.Options().deviceIterations(2).replicationFactor(2)
    opts.Training.gradientAccumulation(3)
    with pytest.raises(AssertionError, match=r"Invalid batch dimension: In the input \[10, 3\], the batch dimension "
                       r"\(10\) must be a multiple of Options.deviceIterations\(2\) \* \(Options.replicationFactor\(2\) / "
                       r"Options.inputReplicaGrouping.input_group_size\(1\)\) \* Options.Training.gradientAccumulation\(3\) = 12"):  # fmt: skip
        poptorch.trainingModel(WithLoss(), opts)(*batch(10))


def test_no_loss_and_several_independent_losses():
    with pytest.raises(poptorch.Error, match="Couldn't find a loss in graph!"):
        poptorch.trainingModel(nn.Linear(3, 2))(torch.randn(4, 3))

    class TwoLosses(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 1), nn.Linear(3, 1)

        def forward(self, x):
            return self.a(x).mean(), self.b(x).mean()

    with pytest.raises(poptorch.Error, match="Multiple independent losses found in graph"):
        poptorch.trainingModel(TwoLosses())(torch.randn(4, 3))


def test_no_loss_error_keeps_poptorchs_sentence_and_says_what_forward_must_return():
    class NoGrad(nn.Module):  # a 0-dim output, but computed without a gradient
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x).detach().mean()

    for model in (nn.Linear(3, 2), NoGrad()):
        with pytest.raises(poptorch.Error) as caught:
            poptorch.trainingModel(model)(torch.randn(4, 3))
        message = str(caught.value)
        assert message.startswith("Couldn't find a loss in graph! ")
        assert "0-dim tensor that requires grad" in message and "poptorch.identity_loss" in message
        assert "poptorch.inferenceModel" in message


def test_the_final_loss_is_the_one_computed_from_the_others():
    class Parts(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 1)

        def forward(self, x):
            first, second = self.a(x).mean(), self.a(x).pow(2).mean()
            return first, second, first + second

    opts = poptorch.Options().outputMode(poptorch.OutputMode.All)
    first, second, total = poptorch.trainingModel(Parts(), opts)(torch.randn(4, 3))
    torch.testing.assert_close(total, first + second)


def test_identity_loss_marks_the_loss_and_reduces():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 2)

        def forward(self, x):
            out = self.a(x)
            return out.sum(), poptorch.identity_loss(out.abs(), reduction="mean")

    total, loss = poptorch.trainingModel(Custom())(torch.randn(4, 3))
    assert loss.shape == () and loss > 0
    x = torch.randn(2, 3)
    assert torch.equal(poptorch.identity_loss(x, reduction="sum"), x.sum())
    with pytest.raises(ValueError, match='reduction must be "sum", "mean" or "none"'):
        poptorch.identity_loss(x, reduction="max")


def test_the_users_module_keeps_its_train_or_eval_mode():
    module = WithLoss().eval()
    poptorch.trainingModel(module)(*batch())
    assert not module.training


def test_wrapper_reads_through_to_the_module():
    module = WithLoss()
    model = poptorch.trainingModel(module)
    assert model.linear is module.linear and model.model is module
    assert list(model.parameters()) == list(module.parameters())


def test_backward_on_an_output_is_poptorchs_error():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x):
            out = self.fc(x)
            return out, out.pow(2).mean()

    message = (
        r"backward\(\) cannot be called explicitly on outputs of a PopTorch model. If you're using a trainingModel, "
        r"the backwards pass is performed automatically when invoking the model. If you're using an "
        r"inferenceModel, you should use a trainingModel instead."
    )
    out, loss = poptorch.trainingModel(Net())(torch.randn(3, 4))
    for tensor in (loss, out):
        with pytest.raises(poptorch.Error, match=message):
            tensor.backward()
    with pytest.raises(poptorch.Error, match=message):
        poptorch.inferenceModel(Net())(torch.randn(3, 4))[1].backward()


def test_a_returned_tensor_saves_and_loads_as_a_plain_tensor(tmp_path):
    """The backward refusal is not pickled: torch.load with weights_only (its default) reads the file."""
    net = torch.nn.Linear(4, 2)
    out = poptorch.inferenceModel(net)(torch.randn(3, 4))
    out.note = "kept"  # the user's own attributes are saved as before
    torch.save(out, tmp_path / "out.pt")
    loaded = torch.load(tmp_path / "out.pt", weights_only=True)
    assert type(loaded) is torch.Tensor and torch.equal(loaded, out) and loaded.note == "kept"
    assert "backward" not in vars(loaded)
    with pytest.raises(poptorch.Error):
        out.backward()


@pytest.mark.parametrize(
    "optimizer", [torch.optim.Adam, torch.optim.AdamW, poptorch.optim.Adam, poptorch.optim.AdamW]
)
def test_amsgrad_is_poptorchs_error(optimizer):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"^Only non-amsgrad Adam/AdamW optimizers are supported.$"):
        poptorch.trainingModel(model, optimizer=optimizer(model.parameters(), amsgrad=True))
    poptorch.trainingModel(model, optimizer=optimizer(model.parameters()))  # the model was not left wrapped


class TrainingOnlyHead(nn.Module):
    """A loss head that only the training branch runs (as CLIP's does), placed on the second IPU."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.head = poptorch.BeginBlock(nn.Linear(4, 2), ipu_id=1)
        self.modes: list[bool] = []

    def forward(self, x, y):
        self.modes.append(self.training)
        out = self.body(x)
        if not self.training:
            return out
        return nn.functional.cross_entropy(self.head(out), y)


@pytest.mark.parametrize("training", [True, False])
def test_a_wrapper_traces_and_runs_the_model_in_the_mode_its_user_left_it_in(training):
    """PopTorch calls neither train() nor eval() (its trainingModel / inferenceModel docstrings: call them
    before wrapping): a training module traces the training branch (its second IPU is placed), an eval
    one the eval branch, and the mode stays as the user set it."""
    module = TrainingOnlyHead().train() if training else TrainingOnlyHead().eval()
    opts = poptorch.Options().deviceIterations(1 if training else 2)
    opts.Training.gradientAccumulation(3 if training else 1)
    wrap = poptorch.trainingModel if training else poptorch.inferenceModel
    model = wrap(module, opts)
    x, y = batch(6 if training else 4)
    model.compile(x, y)
    assert set(module.modes) == {training}
    assert model.num_ipus == (2 if training else 1)
    model(x, y)
    assert set(module.modes) == {training} and module.training is training


def test_a_batch_norm_frozen_with_eval_stays_frozen_in_a_training_model():
    """Fine-tuning with frozen normalisation (`model.bn.eval()`), PopTorch's test_batchNorm_eval_during_training:
    the running statistics are used and not updated, as in plain PyTorch."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    module.train()
    module[1].eval()
    reference = copy.deepcopy(module)
    x, y = batch(6)

    class WithLoss(nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x, y):
            return nn.functional.cross_entropy(self.net(x), y)

    model = poptorch.trainingModel(WithLoss(module), optimizer=torch.optim.SGD(module.parameters(), lr=0.1))
    model(x, y)
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    nn.functional.cross_entropy(reference(x), y).backward()
    sgd.step()
    torch.testing.assert_close(module[1].running_mean, reference[1].running_mean)
    torch.testing.assert_close(module[0].weight, reference[0].weight)
    assert torch.equal(module[1].running_mean, torch.zeros(4))


def test_latency_and_cycle_count_are_the_cost_models_estimate_of_the_last_call():
    """PopTorch times the IPU; here `getLatency()` is the estimated call time per device iteration and
    `cycleCount()` the estimated device time in Mk2 cycles (1.33 GHz), with PopTorch's errors and zeros."""
    opts = poptorch.Options().deviceIterations(4)
    model = poptorch.inferenceModel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), opts)
    assert model.getLatency() == (0.0, 0.0, 0.0)  # nothing has run
    with pytest.raises(poptorch.Error, match="Cycle count logging is disabled"):
        model.cycleCount()
    opts = poptorch.Options().deviceIterations(4)
    opts.logCycleCount(True)
    model = poptorch.inferenceModel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), opts)
    with pytest.raises(poptorch.Error, match="run the model at least once"):
        model.cycleCount()
    model(torch.randn(8, 8))
    performance = model.compile_result.report.performance
    low, high, mean = model.getLatency()
    assert low == high == mean == pytest.approx(performance.call_time / 4) and mean > 0
    assert model.cycleCount() == round((performance.call_time - performance.host_time) * 1.33e9) > 0
