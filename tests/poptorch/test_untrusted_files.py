"""Files a PopTorch program reads run none of their own code: `poptorch.load` / `loadExecutable` unpickle
only model classes, optimizers and optimum-ipu's own types (`_export.py`), and `Options.loadFromFile`
reads setter calls with literal arguments, never running a line as Python (`options.py`).

Each crafted file's payload would write a marker file; the tests check the marker does not exist.
"""

import pathlib
import sys
import types

import pytest
import torch
from torch import nn

import poptorch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        poptorch.BeginBlock(self.head, "head", ipu_id=1)

    def forward(self, x, target=None):
        out = self.head(torch.tanh(self.body(x)))
        return out if target is None else (out, nn.functional.mse_loss(out, target))


def scale_output(module, args, output):
    """A forward hook at a module's top level: pickled by reference, as torch.save(model) does."""
    return output * 2


class Payload:
    """Unpickling it calls `Path.write_text(marker, ...)`: a stand-in for any code a crafted file runs."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.write_text, (self.marker, "the file's code ran")


def exported(tmp_path, model=None, **kwargs) -> str:
    path = str(tmp_path / "model.poptorch")
    model = poptorch.inferenceModel(model or Net(), poptorch.Options().deviceIterations(2))
    model.compileAndExport(path, torch.randn(6, 4), **kwargs)
    return path


def crafted(tmp_path, marker) -> str:
    """A file in the format compileAndExport writes, whose model is the payload."""
    path = str(tmp_path / "crafted.poptorch")
    content = torch.load(exported(tmp_path), weights_only=False)
    content["model"] = Payload(marker)
    torch.save(content, path)
    return path


@pytest.mark.parametrize("read", [poptorch.load, lambda path: poptorch.inferenceModel(Net(), poptorch.Options().deviceIterations(2)).loadExecutable(path)],
                         ids=["poptorch.load", "loadExecutable"])  # fmt: skip
def test_a_crafted_executable_file_runs_nothing_and_is_refused_naming_it(tmp_path, read):
    marker = tmp_path / "marker"
    path = crafted(tmp_path, marker)
    with pytest.raises(
        poptorch.Error, match=r"crafted\.poptorch: loading it would call .*pathlib.*nothing in the file ran"
    ):
        read(path)
    assert not marker.exists()


def test_an_exported_model_loads_without_unpickling_code(tmp_path):
    model = Net()
    path = exported(tmp_path, model)
    loaded = poptorch.load(path)
    x = torch.randn(6, 4)
    torch.testing.assert_close(loaded(x), model(x))  # blocks of 3 rows: last-bit differences
    assert loaded.num_stages == 2  # BeginBlock's hook (optimum-ipu's own function) came along


def test_a_model_with_a_hook_of_its_own_loads_only_when_the_file_is_trusted(tmp_path):
    model = Net()
    model.head.register_forward_hook(scale_output)
    path = exported(tmp_path, model)
    with pytest.raises(poptorch.Error, match=r"scale_output.*trust_file=True"):
        poptorch.load(path)
    loaded = poptorch.load(path, trust_file=True)
    x = torch.randn(6, 4)
    torch.testing.assert_close(loaded(x), model(x))  # blocks of 3 rows: last-bit differences


def test_a_model_class_whose_module_is_not_imported_is_named(tmp_path):
    module = types.ModuleType("user_models_not_imported")
    module.Net = type("Net", (Net,), {"__module__": module.__name__})
    sys.modules[module.__name__] = module
    try:
        path = exported(tmp_path, module.Net())
    finally:
        del sys.modules[module.__name__]
    with pytest.raises(
        poptorch.Error, match=r"user_models_not_imported.*not imported.*import user_models_not_imported"
    ):
        poptorch.load(path)


def test_a_file_saved_without_the_model_loads_into_a_model_given(tmp_path):
    path = exported(tmp_path, export_model=False)
    with pytest.raises(poptorch.Error, match=r"export_model=False.*loadExecutable"):
        poptorch.load(path)
    model = poptorch.inferenceModel(Net(), poptorch.Options().deviceIterations(2))
    model.loadExecutable(path)
    assert model.isCompiled()
    assert torch.load(path, weights_only=False)["model"] is None  # no model, weights or optimizer


def _training_options():
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(3)  # at least the 3 stages of a 2-IPU pipeline
    return opts


@pytest.fixture
def torchs_own_safe_globals():
    """torch's allow-list as a fresh process has it: importing torch-geometric (tests/poptorch/test_geometric.py)
    adds `collections.defaultdict` to it for the whole process, and torch then builds one without asking."""
    added = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        yield
    finally:
        torch.serialization.add_safe_globals(added)


def test_a_training_model_saved_before_the_checks_loads_only_when_trusted(tmp_path, torchs_own_safe_globals):
    # Earlier versions pickled the optimizer's state as a defaultdict, which weights_only cannot build.
    model = Net()
    training = poptorch.trainingModel(
        model,
        _training_options(),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
    )
    training.compileAndExport(str(tmp_path / "new.poptorch"), torch.randn(6, 4), torch.randn(6, 2))
    path = str(tmp_path / "old.poptorch")
    torch.save(torch.load(str(tmp_path / "new.poptorch"), weights_only=False), path)
    with pytest.raises(
        poptorch.Error,
        match=r"old\.poptorch: loading it would call collections\.defaultdict.*trust_file=True",
    ):
        poptorch.load(path)
    assert poptorch.load(path, trust_file=True).isCompiled()


def test_a_file_that_is_not_a_torch_file_is_named(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not an executable")
    with pytest.raises(poptorch.Error, match=r"notes\.txt is not a file written by compileAndExport"):
        poptorch.load(str(path))


# -- options files ----------------------------------------------------------------------------------


def test_options_file_setter_chains_with_literal_and_poptorch_arguments_load(tmp_path):
    conf = tmp_path / "poptorch.conf"
    conf.write_text(
        "deviceIterations(3)\n"
        "outputMode(poptorch.OutputMode.All)\n"
        "Precision.setPartialsType(torch.float16)\n"
        "TensorLocations.setOptimizerLocation(poptorch.TensorLocationSettings().useOnChipStorage(False))\n"
        "setAvailableMemoryProportion({'IPU0': 0.3, 'IPU1': 0.25})\n"
        "Training.gradientAccumulation(2).accumulationAndReplicationReductionType(ReductionType.Sum)\n"
        "setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))\n"
    )
    opts = poptorch.Options().loadFromFile(str(conf))
    assert opts.device_iterations == 3 and opts.Training.gradient_accumulation == 2
    assert type(opts.execution_strategy) is poptorch.PipelinedExecution


@pytest.mark.parametrize(
    "line, reason",
    [
        ("deviceIterations(__import__('pathlib').Path({marker!r}).write_text('x'))", "__import__"),
        ("deviceIterations(open({marker!r}, 'w').write('x'))", "open"),
        ("__class__.__init__.__globals__['os'].system('touch {marker}')", "__class__"),
        ("deviceIterations(torch.save(1, {marker!r}))", "torch.save"),
        ("deviceIterations(poptorch.load({marker!r}))", "poptorch.load"),
        ("deviceIterations(3); import os", "one setter call"),
        ("import os", "one setter call"),
        ("x = 3", "one setter call"),
        ("loadFromFile('/etc/passwd')", "cannot load another"),
        ("deviceIterations(lambda: 3)", "lambda"),
        ("deviceIterations(9 ** 9 ** 9)", "is not a literal"),
    ],
)
def test_an_options_file_line_that_is_not_a_setter_call_runs_nothing_and_is_refused(tmp_path, line, reason):
    marker = tmp_path / "marker"
    conf = tmp_path / "poptorch.conf"
    conf.write_text("deviceIterations(2)\n" + line.format(marker=str(marker)) + "\n")
    with pytest.raises(
        ValueError,
        match=r"poptorch\.conf:2: .* is not (an Options setter call with literal arguments \(|a setter call: ).*"
        + reason.replace(".", r"\."),
    ) as error:
        poptorch.Options().loadFromFile(str(conf))
    assert "Options setter" in str(error.value)
    assert not marker.exists()
