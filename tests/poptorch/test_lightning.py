"""Lightning's `IPUStrategy` (lightning-graphcore 0.1, pytorch-lightning 2.0.x) on our poptorch, against the
same LightningModule trained, validated and predicted by plain Lightning on CPU (docs/poptorch.md#lightning).

What an IPU host call means, worked by hand for 32 samples and a DataLoader of batch_size 4:

* Through `accelerator="ipu"` (Lightning 2.0's own IPU accelerator) Lightning rebuilds every loader as a
  `poptorch.DataLoader` with the strategy's options, so `batch_size` is the micro-batch and each item is
  deviceIterations x gradientAccumulation micro-batches. The device steps the optimizer once per device
  iteration, on the mean of its accumulated micro-batch gradients: deviceIterations(2) is plain Lightning
  with batch_size 4 (two steps per host call, 4 calls), gradientAccumulation(2) or Lightning's
  `accumulate_grad_batches=2` is plain Lightning with `accumulate_grad_batches=2` (one step per call).
* Through lightning-graphcore's `IPUAccelerator()` object, pytorch-lightning 2.0 does not recognise the
  accelerator as an IPU: it neither rebuilds the training and validation loaders (the loader's batch is then
  the whole host call, cut into micro-batches, as PopTorch does with any input) nor picks the IPU precision
  (pass `IPUPrecision`; without it Lightning's default `loss.backward()` fails on the host copy of the loss,
  as lightning-graphcore's own tests record for real IPUs).
"""

import importlib.util
import logging
import sys
import types

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import poptorch
from optimum_ipu import _once


def _import_lightning():
    """pytorch-lightning 2.0.x calls `pkg_resources.declare_namespace` when imported, and setuptools 82
    dropped `pkg_resources`. That call only declares a namespace package, which an installed wheel does not
    need, so while Lightning imports a stand-in with that one function takes its place (users install
    `setuptools<82`); the stand-in is gone again afterwards."""
    stand_in = "pkg_resources" not in sys.modules and importlib.util.find_spec("pkg_resources") is None
    if stand_in:
        module = types.ModuleType("pkg_resources")
        module.declare_namespace = lambda name: None
        sys.modules["pkg_resources"] = module
    try:
        import lightning_graphcore
        import pytorch_lightning
    finally:
        if stand_in:
            del sys.modules["pkg_resources"]
    return pytorch_lightning, lightning_graphcore


pl, lightning_graphcore = _import_lightning()
IPUAccelerator, IPUPrecision, IPUStrategy = (
    lightning_graphcore.IPUAccelerator, lightning_graphcore.IPUPrecision, lightning_graphcore.IPUStrategy
)  # fmt: skip

SAMPLES, BATCH = 32, 4


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(SAMPLES, 4, generator=g), torch.randn(SAMPLES, 1, generator=g)


def loader(batch_size=BATCH):
    return DataLoader(TensorDataset(*data()), batch_size=batch_size)


class Regression(pl.LightningModule):
    """A linear regression that keeps what each step hands back to Lightning (in the batch-end hooks, on
    the host: on an IPU `self.log` inside a step is not supported)."""

    def __init__(self, step_lr: bool = False):
        super().__init__()
        self.linear = nn.Linear(4, 1)
        with torch.no_grad():  # the same start for every trainer
            self.linear.weight.copy_(torch.tensor([[0.5, -0.25, 0.125, 1.0]]))
            self.linear.bias.fill_(0.1)
        self.step_lr = step_lr
        self.train_losses, self.val_losses = [], []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.linear(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.linear(x), y)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self.linear(batch[0])

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.train_losses.append(outputs["loss"].detach().reshape(-1))

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.val_losses.append(outputs.detach().reshape(-1))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        if self.step_lr:
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]
        return optimizer


def trainer(tmp_path, **kwargs):
    kwargs.setdefault("max_epochs", 1)
    return pl.Trainer(
        default_root_dir=tmp_path, devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **kwargs,
    )  # fmt: skip


def on_cpu(tmp_path, batch_size=BATCH, accumulate=1, epochs=1, step_lr=False):
    """Plain Lightning on CPU: the reference."""
    model = Regression(step_lr)
    trainer(tmp_path / "cpu", accelerator="cpu", accumulate_grad_batches=accumulate, max_epochs=epochs).fit(
        model, loader(batch_size), loader(batch_size)
    )
    return model


def options(device_iterations=1, accumulation=1):
    opts = poptorch.Options().deviceIterations(device_iterations)
    opts.Training.gradientAccumulation(accumulation)
    return opts


def assert_same_weights(model, reference):
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-5, atol=1e-6, msg=name)


def cat(losses):
    return torch.cat(losses) if losses else torch.empty(0)


FIT_CASES = {  # strategy arguments (fresh options each run), Trainer arguments, the CPU reference's
    # (batch_size, accumulate_grad_batches), IPU host calls per epoch
    "one micro-batch a call": (dict, dict(), (4, 1), 8),
    "deviceIterations(2) in the options":
        (lambda: dict(training_opts=options(2), inference_opts=options(2)), dict(), (4, 1), 4),
    "IPUStrategy(device_iterations=2)": (lambda: dict(device_iterations=2), dict(), (4, 1), 4),
    "gradientAccumulation(2) in the options": (lambda: dict(training_opts=options(1, 2)), dict(), (4, 2), 4),
    "Lightning's accumulate_grad_batches=2": (dict, dict(accumulate_grad_batches=2), (4, 2), 4),
    "deviceIterations(2) x gradientAccumulation(2)":
        (lambda: dict(training_opts=options(2, 2), inference_opts=options(2)), dict(), (4, 2), 2),
}  # fmt: skip


@pytest.mark.parametrize("case", FIT_CASES)
def test_fit_through_accelerator_ipu_equals_plain_lightning(case, tmp_path):
    strategy_args, trainer_args, (cpu_batch, cpu_accumulation), calls = FIT_CASES[case]
    reference = on_cpu(tmp_path, cpu_batch, cpu_accumulation)
    model = Regression()
    ipu = trainer(tmp_path, accelerator="ipu", strategy=IPUStrategy(**strategy_args()), **trainer_args)
    ipu.fit(model, loader(), loader())

    assert_same_weights(model, reference)
    assert len(model.train_losses) == calls
    # a training call returns its last micro-batch's loss (OutputMode.Final); Lightning divides a loss by
    # its own accumulate_grad_batches before handing it to the hooks
    per_call = len(reference.train_losses) // calls
    last_micro_batches = cat(reference.train_losses[per_call - 1 :: per_call]) * cpu_accumulation
    lightning_accumulation = trainer_args.get("accumulate_grad_batches", 1)
    torch.testing.assert_close(cat(model.train_losses), last_micro_batches / lightning_accumulation)
    # validation after the epoch, one loss per device iteration
    torch.testing.assert_close(cat(model.val_losses), cat(reference.val_losses))


def test_given_training_options_keep_their_accumulation_over_lightnings(tmp_path):
    """lightning-graphcore reads `accumulate_grad_batches` only into the options it builds itself: beside
    your own `training_opts` (accumulation 1 here) the device updates every call, as plain Lightning does
    without accumulation, while Lightning counts one optimizer step per two calls."""
    reference = on_cpu(tmp_path)
    model = Regression()
    strategy = IPUStrategy(training_opts=options(1, 1))
    ipu = trainer(
        tmp_path, accelerator="ipu", strategy=strategy, accumulate_grad_batches=2, limit_val_batches=0
    )
    ipu.fit(model, loader())
    assert_same_weights(model, reference)
    assert (len(model.train_losses), ipu.global_step) == (8, 4)


@pytest.mark.parametrize("device_iterations", [1, 2])
def test_validate_and_predict_through_accelerator_ipu_equal_the_plain_model(device_iterations, tmp_path):
    model, plain = Regression(), Regression()
    strategy = IPUStrategy(inference_opts=options(device_iterations))
    ipu = trainer(tmp_path, accelerator="ipu", strategy=strategy)

    ipu.validate(model, loader())
    x, y = data()
    with torch.no_grad():
        per_batch = [F.mse_loss(plain.linear(xb), yb) for xb, yb in zip(x.split(BATCH), y.split(BATCH))]
        expected = plain.linear(x)
    calls = SAMPLES // (BATCH * device_iterations)
    assert len(model.val_losses) == calls
    torch.testing.assert_close(cat(model.val_losses), torch.stack(per_batch))

    predictions = ipu.predict(model, loader())
    assert [p.shape for p in predictions] == [(BATCH * device_iterations, 1)] * calls
    torch.testing.assert_close(torch.cat(predictions), expected)


def test_a_step_lr_schedule_and_validation_each_epoch_follow_plain_lightning(tmp_path):
    """Two epochs: the strategy hands the scheduler's new learning rate to the device before each call,
    and the validation model sees the weights the training model has just written."""
    reference = on_cpu(tmp_path, epochs=2, step_lr=True)
    model = Regression(step_lr=True)
    ipu = trainer(tmp_path, accelerator="ipu", strategy=IPUStrategy(training_opts=options(2)), max_epochs=2)
    ipu.fit(model, loader(), loader())
    assert_same_weights(model, reference)
    torch.testing.assert_close(cat(model.val_losses), cat(reference.val_losses))


@pytest.mark.parametrize(
    "device_iterations, accumulation, cpu_batch",
    [
        (1, 1, 4),
        (2, 1, 2),  # the loader's 4 samples are 2 device iterations of 2: two steps a call
        (1, 2, 4),  # 2 micro-batches of 2, one step on their mean
    ],
    ids=["one micro-batch a call", "deviceIterations(2)", "gradientAccumulation(2)"],
)
def test_fit_through_the_accelerator_object_takes_the_loader_batch_as_the_host_call(
    device_iterations, accumulation, cpu_batch, tmp_path
):
    reference = on_cpu(tmp_path, cpu_batch)
    model = Regression()
    opts = options(device_iterations, accumulation)
    strategy = IPUStrategy(precision_plugin=IPUPrecision("32-true"), training_opts=opts)
    ipu = trainer(tmp_path, accelerator=IPUAccelerator(), strategy=strategy, limit_val_batches=0)
    ipu.fit(model, loader())
    assert_same_weights(model, reference)
    assert len(model.train_losses) == SAMPLES // BATCH


def test_predict_through_the_accelerator_object_combines_device_iterations(tmp_path):
    """Lightning rebuilds a predict loader for every accelerator (to track indices), so here too each
    prediction is deviceIterations x batch_size rows."""
    model = Regression()
    strategy = IPUStrategy(precision_plugin=IPUPrecision("32-true"), inference_opts=options(2))
    predictions = trainer(tmp_path, accelerator=IPUAccelerator(), strategy=strategy).predict(model, loader())
    assert [p.shape for p in predictions] == [(8, 1)] * 4
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(predictions), model.linear(data()[0]))


def test_the_accelerator_object_without_ipu_precision_fails_as_on_ipus(tmp_path):
    """pytorch-lightning 2.0 gives lightning-graphcore's accelerator its default precision plugin, whose
    `loss.backward()` has no graph to go through: a training call's loss is a host copy, on PopTorch too
    (lightning-graphcore's tests mark this failure as expected on IPU hardware)."""
    ipu = trainer(tmp_path, accelerator=IPUAccelerator(), strategy=IPUStrategy(), limit_val_batches=0)
    with pytest.raises(RuntimeError, match="does not require grad"):
        ipu.fit(Regression(), loader())


def test_16_mixed_precision_trains_close_to_float32(tmp_path):
    """`Trainer(precision="16-mixed")`: the strategy casts the float inputs to half, and the float32 weights
    follow the activations' precision (docs/poptorch.md, Types): training to half precision."""
    reference = on_cpu(tmp_path)
    model = Regression()
    trainer(tmp_path, accelerator="ipu", precision="16-mixed", strategy=IPUStrategy()).fit(model, loader())
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.detach().float(), theirs.detach(), rtol=0, atol=5e-3)


def test_autoreport_says_that_no_popvision_report_is_written(tmp_path, monkeypatch, caplog):
    """`IPUStrategy(autoreport=True)` asks Poplar for PopVision reports through POPLAR_ENGINE_OPTIONS (and
    leaves it set): compiling says once that it has no effect here, and writes nothing."""
    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS", raising=False)  # removed again after the test
    monkeypatch.setattr(_once, "_SAID", set())
    reports = tmp_path / "reports"
    strategy = IPUStrategy(autoreport=True, autoreport_dir=str(reports))
    ipu = trainer(tmp_path, accelerator="ipu", strategy=strategy, limit_val_batches=0)
    with caplog.at_level(logging.WARNING, logger="poptorch"):
        ipu.fit(Regression(), loader())
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("POPLAR_ENGINE_OPTIONS")]
    assert len(said) == 1 and "no PopVision report" in said[0]
    assert list(reports.iterdir()) == []  # the strategy makes the folder; nothing is written in it
