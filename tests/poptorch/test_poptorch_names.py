"""PopTorch 3.4 names programs use: option values read back, defaults from the environment, compile
hooks, `module_repr`, offline targets, legacy blocks, picklable block functions, resolved output modes.

Each rule is PopTorch 3.4's (python/options.py, _poplar_executor.py, _printing.py, ops.py), checked here
on our `poptorch`.
"""

import copy
import json
import pickle

import pytest
import torch

import poptorch


class _WithLoss(torch.nn.Module):
    """A one-layer model whose forward returns (output, loss), as a trainingModel's does."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, x):
        out = self.linear(x)
        return out, out.sum()


# -- POPTORCH_DEFAULT_OPTIONS and Options.from_json -------------------------------------------------------
def test_poptorch_default_options_seeds_every_options_and_the_wrappers_default(monkeypatch):
    monkeypatch.setenv("POPTORCH_DEFAULT_OPTIONS", json.dumps({
        "deviceIterations": 2, "Training.gradientAccumulation": 3, "outputMode": ["OutputMode.EveryN", 2],
        "Training.accumulationAndReplicationReductionType": "ReductionType.Sum", "_Popart.set": ["outlineThreshold", 10],
        "logDir": "./logs", "setAvailableMemoryProportion": {"IPU0": 0.3},
    }))  # fmt: skip
    opts = poptorch.Options()
    assert (opts.device_iterations, opts.Training.gradient_accumulation) == (2, 3)
    assert (opts.output_mode, opts.output_return_period) == (poptorch.OutputMode.EveryN, 2)
    assert opts.Training.accumulation_and_replication_reduction_type == poptorch.ReductionType.Sum
    assert opts._Popart.outlineThreshold == 10
    assert opts.log_dir == "./logs"  # a string with a dot that names no enum member stays a string
    assert opts.available_memory_proportion == {"IPU0": 0.3}
    assert poptorch.trainingModel(_WithLoss()).options.device_iterations == 2


def test_options_from_json_calls_the_setters_it_names():
    opts = poptorch.Options().from_json(
        '{"replicationFactor": 2, "Precision.enableFloatingPointExceptions": true}'
    )
    assert opts.replication_factor == 2 and opts.Precision.floating_point_exceptions is True


@pytest.mark.parametrize(
    "text, message",
    [
        ("{deviceIterations: 4}", r"POPTORCH_DEFAULT_OPTIONS is not valid JSON \(Expecting property name"),
        ("[4]", "POPTORCH_DEFAULT_OPTIONS must be a JSON object, got '\\[4\\]'"),
        ('{"deviceIteration": 4}', r"POPTORCH_DEFAULT_OPTIONS: Options.deviceIteration is not an option \(did you mean deviceIterations\?\)"),
        ('{"deviceIterations": 0}', "POPTORCH_DEFAULT_OPTIONS: the setter deviceIterations refused 0: deviceIterations must be a positive integer"),
        ('{"_store": 1}', "POPTORCH_DEFAULT_OPTIONS: _store is not an option a JSON of options can set"),
        ('{"Training": 1}', "POPTORCH_DEFAULT_OPTIONS: Training is not a setter"),
    ],
)  # fmt: skip
def test_a_bad_poptorch_default_options_is_an_error_naming_the_variable(monkeypatch, text, message):
    monkeypatch.setenv("POPTORCH_DEFAULT_OPTIONS", text)
    with pytest.raises(ValueError, match=message):
        poptorch.Options()


# -- option values a program reads back ------------------------------------------------------------
def test_mean_reduction_strategy_reads_back_under_poptorchs_name_post_by_default():
    opts = poptorch.Options()
    assert (
        opts.Training.meanAccumulationAndReplicationReductionStrategy == poptorch.MeanReductionStrategy.Post
    )
    opts.Training.setMeanAccumulationAndReplicationReductionStrategy(poptorch.MeanReductionStrategy.Running)
    assert (
        opts.Training.meanAccumulationAndReplicationReductionStrategy
        == poptorch.MeanReductionStrategy.Running
    )
    opts.Training.set(meanAccumulationAndReplicationReductionStrategy=poptorch.MeanReductionStrategy.Post)
    assert (
        opts.Training.meanAccumulationAndReplicationReductionStrategy == poptorch.MeanReductionStrategy.Post
    )


def test_log_dir_reads_back_the_current_directory_by_default_and_what_logDir_stored():
    opts = poptorch.Options()
    assert opts.log_dir == "."
    assert opts.logDir("logs").log_dir == "logs"


def test_connection_and_sync_defaults_read_back_as_poptorchs():
    opts = poptorch.Options()
    assert opts.connection_type == poptorch.ConnectionType.Always
    assert opts.sync_pattern == poptorch.SyncPattern.Full
    assert opts.max_repeat_logs == 4


# -- a wrapped model's options -----------------------------------------------------------------------
def test_a_wrapped_models_default_output_mode_reads_final_in_training_and_all_in_inference():
    opts = poptorch.Options()
    training = poptorch.trainingModel(_WithLoss(), opts)
    inference = poptorch.inferenceModel(torch.nn.Linear(2, 2), opts)
    assert training.options.output_mode == poptorch.OutputMode.Final
    assert inference.options.output_mode == poptorch.OutputMode.All
    assert opts.output_mode == poptorch.OutputMode.Default  # the user's own Options are unchanged
    chosen = poptorch.Options().outputMode(poptorch.OutputMode.Sum)
    assert poptorch.trainingModel(_WithLoss(), chosen).options.output_mode == poptorch.OutputMode.Sum


# -- offline IPU targets ----------------------------------------------------------------------------
def test_an_offline_target_compiles_and_exports_but_refuses_to_run_or_attach(tmp_path):
    opts = poptorch.Options().useOfflineIpuTarget()
    assert (opts.connection_type, opts.ipu_version) == (poptorch.ConnectionType.Never, 2)
    model = poptorch.trainingModel(_WithLoss(), opts)
    x = torch.randn(4, 2)
    model.compile(x)
    assert model.isCompiled() and not model.isAttachedToDevice()
    path = str(tmp_path / "offline.poptorch")
    model.compileAndExport(path)
    with pytest.raises(
        poptorch.Error, match=r"Trying to run a model on an offline device \(ConnectionType.Never\)"
    ):
        model(x)
    with pytest.raises(
        AssertionError, match="Trying to run a model on an offline device"
    ):  # as PopTorch raises it
        model(x)
    with pytest.raises(
        poptorch.Error, match=r"Trying to attach to an offline device \(ConnectionType.Never\)"
    ):
        model.attachToDevice()
    loaded = poptorch.load(path)  # as on PopTorch, a loaded file connects
    assert loaded.options.connection_type == poptorch.ConnectionType.Always
    assert not loaded.options.exists("ipu_version")
    out, loss = loaded(x)
    assert out.shape == (4, 2)


def test_an_uncompiled_offline_model_refuses_a_call_before_compiling():
    model = poptorch.inferenceModel(
        torch.nn.Linear(2, 2), poptorch.Options().connectionType(poptorch.ConnectionType.Never)
    )
    with pytest.raises(poptorch.Error, match="use model.compile"):
        model(torch.randn(2, 2))
    assert not model.isCompiled()


def test_connection_type_takes_a_connection_type_only():
    with pytest.raises(TypeError, match="connectionType takes a poptorch.ConnectionType"):
        poptorch.Options().connectionType("Never")


# -- compile hooks ----------------------------------------------------------------------------------
def test_compile_hooks_run_before_and_after_every_compile_until_removed():
    model = poptorch.inferenceModel(torch.nn.Linear(2, 2))
    seen = []
    pre = poptorch.registerPreCompileHook(lambda: seen.append(("pre", model.isCompiled())))
    post = poptorch.registerPostCompileHook(lambda: seen.append(("post", model.isCompiled())))
    try:
        model(torch.randn(2, 2))
        model(torch.randn(2, 2))  # compiled already: no hook
        assert seen == [("pre", False), ("post", True)]
        model.destroy()
        model.compile(torch.randn(2, 2))
        assert len(seen) == 4
    finally:
        pre.remove()
        post.remove()
    model.destroy()
    model.compile(torch.randn(2, 2))
    assert len(seen) == 4


def test_post_compile_hooks_run_when_the_compile_fails():
    model = poptorch.inferenceModel(torch.nn.Linear(2, 2), poptorch.Options().deviceIterations(2))
    seen = []
    handle = poptorch.registerPostCompileHook(lambda: seen.append("post"))
    try:
        with pytest.raises(AssertionError, match="Invalid batch dimension"):
            model.compile(torch.randn(3, 2))
    finally:
        handle.remove()
    assert seen == ["post"]


def test_a_compile_hook_must_be_callable():
    with pytest.raises(RuntimeError, match="Pre-compile hook must be callable"):
        poptorch.registerPreCompileHook(3)
    with pytest.raises(RuntimeError, match="Post-compile hook must be callable"):
        poptorch.registerPostCompileHook(None)


# -- printing a placed model --------------------------------------------------------------------------
def _placed():
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 3), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(3, 1))
    )
    poptorch.BeginBlock(model[1], "head", ipu_id=1)
    return model


def test_module_repr_shows_each_begin_block_before_the_module_it_starts():
    assert poptorch.module_repr(_placed()) == (
        "Sequential(\n"
        "  (0): Linear(in_features=2, out_features=3, bias=True)\n"
        "  (1): BeginBlock(user_id=head, ipu_id=1) Sequential(\n"
        "    (0): ReLU()\n"
        "    (1): Linear(in_features=3, out_features=1, bias=True)\n"
        "  )\n"
        ")"
    )
    unplaced = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.LSTM(3, 3), torch.nn.Identity())
    assert poptorch.module_repr(unplaced) == repr(unplaced)


def test_poptorch_print_prints_a_module_with_its_blocks_then_as_print_does(capsys):
    model = _placed()
    poptorch.print(model)
    assert capsys.readouterr().out == f"{poptorch.module_repr(model)}\n{model!r}\n"
    poptorch.print(3)
    assert capsys.readouterr().out == "3\n"


# -- BeginBlock's legacy form: a function --------------------------------------------------------------
def _halve(x):
    return x / 2


class _WithLegacyBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.head = poptorch.BeginBlock(
            _halve, "head", 1
        )  # positional user_id and ipu_id, as PopTorch 3.4 takes

    def forward(self, x):
        out = self.head(self.linear(x))
        return out, out.sum()


def test_begin_block_of_a_function_returns_a_module_that_starts_the_block():
    model = _WithLegacyBlock()
    assert isinstance(model.head, torch.nn.Module) and repr(model.head) == "LegacyBeginBlockFn()"  # PopTorch's
    x = torch.randn(6, 2)
    first = poptorch.trainingModel(model)
    with pytest.raises(poptorch.Error, match="gradient"):  # 2 pipelined IPUs need gradientAccumulation >= 3
        first.compile(x)
    first.destroy()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(3)
    wrapped = poptorch.trainingModel(model, opts)
    wrapped.compile(x)
    assert wrapped.num_ipus == 2
    inference = poptorch.inferenceModel(_WithLegacyBlock().eval(), poptorch.Options().deviceIterations(2))
    out, _ = inference(x)
    torch.testing.assert_close(out, inference.model.linear(x) / 2)


def test_begin_block_of_something_not_callable_names_it():
    with pytest.raises(
        poptorch.Error, match="module is not an instance of torch.nn.Module or function: .* int"
    ):
        poptorch.BeginBlock(3, "a", 0)


# -- what blocks leave on a model pickles and copies ------------------------------------------------------
@poptorch.BlockFunction("top", ipu_id=0)
def _top_level_block(x):
    """A decorated top-level function."""
    return x + 1


class _WithBlockFunctions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = poptorch.BeginBlock(torch.nn.Linear(2, 2), "body", ipu_id=0)
        self.act = poptorch.BlockFunction("act", ipu_id=0)(torch.relu)
        self.shift = _top_level_block

    @poptorch.BlockFunction("main", ipu_id=0)
    def forward(self, x):
        return self.shift(self.act(self.linear(x)))


def test_a_model_with_block_functions_and_blocks_pickles_and_deep_copies():
    model = _WithBlockFunctions()
    x = torch.randn(3, 2)
    for copied in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        torch.testing.assert_close(copied(x), model(x))
        assert copied.shift is _top_level_block  # a decorated top-level function goes by its name
        assert poptorch.module_repr(copied) == poptorch.module_repr(model)  # the blocks came along
    relu = pickle.loads(pickle.dumps(poptorch.BlockFunction(ipu_id=0)(torch.relu)))
    torch.testing.assert_close(relu(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))
    assert (_top_level_block.__name__, _top_level_block.__doc__) == (
        "_top_level_block",
        "A decorated top-level function.",
    )


def _tanh_and_loss(x):
    out = torch.tanh(x)
    return out, out.sum()  # inside the block: PopTorch refuses an op after a BlockFunction returns


class _WithHeadOnIpu1(torch.nn.Module):
    """A model whose head, a wrapped function kept on the module, runs on IPU 1."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)
        self.head = poptorch.BlockFunction("head", ipu_id=1)(_tanh_and_loss)

    def forward(self, x):
        return self.head(self.linear(x))


def test_a_pickled_block_function_still_starts_its_block():
    model = pickle.loads(pickle.dumps(_WithHeadOnIpu1()))
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(3)
    wrapped = poptorch.trainingModel(model, opts)
    wrapped.compile(torch.randn(6, 2))
    assert wrapped.num_ipus == 2
