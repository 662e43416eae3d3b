"""PopTorch 3.4 names programs use: option values read back, defaults from the environment, compile
hooks, `module_repr`, offline targets, legacy blocks, picklable block functions, resolved output modes.

Each rule is PopTorch 3.4's (python/options.py, _poplar_executor.py, _printing.py, ops.py), checked here
on our `poptorch`.
"""


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


# -- option values a program reads back ------------------------------------------------------------
def test_mean_reduction_strategy_reads_back_under_poptorchs_name_post_by_default():
    opts = poptorch.Options()
    assert opts.Training.meanAccumulationAndReplicationReductionStrategy == poptorch.MeanReductionStrategy.Post
    opts.Training.setMeanAccumulationAndReplicationReductionStrategy(poptorch.MeanReductionStrategy.Running)
    assert opts.Training.meanAccumulationAndReplicationReductionStrategy == poptorch.MeanReductionStrategy.Running
    opts.Training.set(meanAccumulationAndReplicationReductionStrategy=poptorch.MeanReductionStrategy.Post)
    assert opts.Training.meanAccumulationAndReplicationReductionStrategy == poptorch.MeanReductionStrategy.Post


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
    with pytest.raises(poptorch.Error, match=r"Trying to run a model on an offline device \(ConnectionType.Never\)"):
        model(x)
    with pytest.raises(AssertionError, match="Trying to run a model on an offline device"):  # as PopTorch raises it
        model(x)
    with pytest.raises(poptorch.Error, match=r"Trying to attach to an offline device \(ConnectionType.Never\)"):
        model.attachToDevice()
    loaded = poptorch.load(path)  # as on PopTorch, a loaded file connects
    assert loaded.options.connection_type == poptorch.ConnectionType.Always
    assert not loaded.options.exists("ipu_version")
    out, loss = loaded(x)
    assert out.shape == (4, 2)


def test_an_uncompiled_offline_model_refuses_a_call_before_compiling():
    model = poptorch.inferenceModel(torch.nn.Linear(2, 2), poptorch.Options().connectionType(poptorch.ConnectionType.Never))
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
