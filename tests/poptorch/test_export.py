"""compileAndExport / poptorch.load: the loaded model continues exactly where the exported one was.

Reference: the exported model itself, trained on after the export on the same batches.
"""

import pytest
import torch
from torch import nn

import poptorch


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh())
        self.head = nn.Linear(8, 3)
        poptorch.BeginBlock(self.head, "Head", ipu_id=1)

    def forward(self, x, labels=None):
        logits = self.head(self.body(x))
        if labels is None:
            return logits
        return logits, nn.functional.cross_entropy(logits, labels)


def _batches(n, size=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        lambda params: poptorch.optim.AdamW(params, lr=0.01, loss_scaling=8.0, max_grad_norm=1.0),
    ],
    ids=["torch SGD momentum", "poptorch AdamW loss scaling"],
)
def test_a_loaded_training_model_continues_as_the_exported_one(tmp_path, make_optimizer):
    torch.manual_seed(0)
    model = Classifier()
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(3)
    training = poptorch.trainingModel(model, opts, optimizer=make_optimizer(model.parameters()))
    for x, labels in _batches(2):
        training(x, labels)
    path = str(tmp_path / "model.poptorch")
    training.compileAndExport(path)

    loaded = poptorch.load(path)
    assert loaded.isCompiled() and loaded.isAttachedToDevice() and loaded.training
    assert loaded.num_stages == 2 and loaded.options.device_iterations == 2
    assert type(loaded.getOptimizer()) is type(training.getOptimizer())
    assert getattr(loaded.getOptimizer(), "loss_scaling", 1.0) == getattr(
        training.getOptimizer(), "loss_scaling", 1.0
    )
    for x, labels in _batches(2, seed=1):  # the optimizer state (momentum, moments) came along
        _, expected = training(x, labels)
        _, loss = loaded(x, labels)
        torch.testing.assert_close(loss, expected, atol=0, rtol=0)
    for p, q in zip(model.parameters(), loaded.model.parameters()):
        torch.testing.assert_close(p, q, atol=0, rtol=0)


def test_an_inference_model_exported_before_its_first_call_loads_with_its_options(tmp_path):
    model = Classifier().eval()
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(4))
    x = torch.randn(8, 6)
    path = str(tmp_path / "inference.poptorch")
    inference.compileAndExport(path, x)
    assert inference.isCompiled()

    loaded = poptorch.load(path, edit_opts_fn=lambda opts: opts.outputMode(poptorch.OutputMode.All))
    torch.testing.assert_close(loaded(x), model(x))
    assert not loaded.training


def test_load_refuses_a_file_compile_and_export_did_not_write(tmp_path):
    path = str(tmp_path / "weights.pt")
    torch.save(Classifier().state_dict(), path)
    with pytest.raises(poptorch.Error, match="is not a file written by compileAndExport"):
        poptorch.load(path)


def test_export_names_what_cannot_be_saved(tmp_path):
    model = Classifier()
    model.head.register_forward_hook(lambda m, i, o: o)  # a lambda: torch.save cannot pickle it
    training = poptorch.trainingModel(model, _options_ga3())
    with pytest.raises(poptorch.Error, match="cannot save the model"):
        training.compileAndExport(str(tmp_path / "m.poptorch"), *_batches(1)[0])


def _options_ga3():
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(3)
    return opts


def test_a_half_model_with_a_torch_optimizer_exports_and_continues(tmp_path):
    torch.manual_seed(0)
    model = Classifier().half()
    training = poptorch.trainingModel(
        model, _options_ga3(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    )
    x, labels = _batches(1)[0]
    training(x.half(), labels)  # optimum-ipu gives the torch optimizer PopTorch's fp32 update of fp16 weights
    path = str(tmp_path / "half.poptorch")
    training.compileAndExport(path)
    loaded = poptorch.load(path)
    x, labels = _batches(1, seed=1)[0]
    torch.testing.assert_close(loaded(x.half(), labels)[1], training(x.half(), labels)[1], atol=0, rtol=0)
    for p, q in zip(model.parameters(), loaded.model.parameters()):
        assert q.dtype == torch.float16
        torch.testing.assert_close(p, q, atol=0, rtol=0)


class Dropped(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.3))
        self.head = nn.Linear(16, 3)

    def forward(self, x, labels):
        logits = self.head(self.body(x))
        return logits, nn.functional.cross_entropy(logits.float(), labels)


@pytest.mark.parametrize("case", ["dropout-replicas", "half-rounding-auto-scale"])
def test_a_loaded_model_continues_its_random_streams_rounding_and_loss_scale(tmp_path, case):
    """What a call draws and scales by goes with the model: the replicas' dropout streams, stochastic
    rounding's generators and an automatic loss scale where it got to (PopTorch's save_rng_state); without
    them the loaded model's losses split from the exported one's at its first call."""
    torch.manual_seed(0)
    half = case.startswith("half")
    model = Dropped().half() if half else Dropped()
    opts = poptorch.Options().replicationFactor(2).randomSeed(5)
    opts.Training.gradientAccumulation(3)
    if half:
        opts.Precision.enableStochasticRounding(True)
        opts.Training.setAutomaticLossScaling(True)
    optimizer = poptorch.optim.AdamW(model.parameters(), lr=0.01, loss_scaling=4.0)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    cast = (lambda x: x.half()) if half else (lambda x: x)
    for x, labels in _batches(3, size=12):
        training(cast(x), labels)
    path = str(tmp_path / "model.poptorch")
    training.compileAndExport(path)
    loaded = poptorch.load(path)
    for x, labels in _batches(3, size=12, seed=1):
        _, expected = training(cast(x), labels)
        _, loss = loaded(cast(x), labels)
        torch.testing.assert_close(loss, expected, atol=0, rtol=0)
    for p, q in zip(model.parameters(), loaded.model.parameters()):
        torch.testing.assert_close(p, q, atol=0, rtol=0)
    assert loaded.rng_state["streams"]["cpu"][1].equal(training.rng_state["streams"]["cpu"][1])


def test_save_without_the_random_state_leaves_it_out(tmp_path):
    torch.manual_seed(0)
    model = Dropped()
    training = poptorch.trainingModel(model, poptorch.Options(), optimizer=poptorch.optim.SGD(model.parameters(), lr=0.1))
    x, labels = _batches(1)[0]
    training(x, labels)
    path = str(tmp_path / "model.poptorch")
    training.save(path, save_rng_state=False)
    from optimum_ipu.poptorch import _export

    assert set(_export.read(path)["run_state"]) == {"loss_scaler"}


def test_a_model_loaded_with_other_replicas_keeps_the_streams_both_have(tmp_path):
    torch.manual_seed(0)
    model = Dropped()
    opts = poptorch.Options().replicationFactor(2).randomSeed(5)
    training = poptorch.trainingModel(model, opts, optimizer=poptorch.optim.SGD(model.parameters(), lr=0.1))
    x, labels = _batches(1, size=8)[0]
    training(x, labels)
    path = str(tmp_path / "model.poptorch")
    training.compileAndExport(path)
    loaded = poptorch.load(path, edit_opts_fn=lambda options: options.replicationFactor(1))
    assert loaded.rng_state["streams"]["cpu"][0].equal(training.rng_state["streams"]["cpu"][0])
    loaded(x, labels)  # one replica of the same 8 rows
