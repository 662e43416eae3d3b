"""PopTorch 3.4 names programs use: option values read back, defaults from the environment, compile
hooks, `module_repr`, offline targets, legacy blocks, picklable block functions, resolved output modes.

Each rule is PopTorch 3.4's (python/options.py, _poplar_executor.py, _printing.py, ops.py), checked here
on our `poptorch`.
"""


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
