"""poptorch.Options: builder API, sub-objects, freezing, clone, and options with no effect saying so."""

import logging

import pytest
import torch

import optimum_ipu.poptorch as impl
import poptorch
from optimum_ipu.poptorch import _logging


def test_poptorch_name_is_the_optimum_ipu_module():
    import poptorch.optim

    assert poptorch is impl
    assert poptorch.optim is impl.optim
    assert poptorch.Options is impl.options.Options


def test_setters_chain_and_read_back():
    opts = poptorch.Options().deviceIterations(50).replicationFactor(2).randomSeed(7)
    assert opts.Training.gradientAccumulation(4) is opts.Training
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    opts.outputMode(poptorch.OutputMode.EveryN, 5)
    assert (opts.device_iterations, opts.replication_factor, opts.random_seed) == (50, 2, 7)
    assert opts.Training.gradient_accumulation == 4
    assert opts.Training.accumulation_and_replication_reduction_type == poptorch.ReductionType.Sum
    assert (opts.output_mode, opts.output_return_period) == (poptorch.OutputMode.EveryN, 5)
    assert not opts.defaultOutputMode()


def test_bad_values_are_refused_with_the_value():
    with pytest.raises(ValueError, match="deviceIterations must be a positive integer, got 0"):
        poptorch.Options().deviceIterations(0)
    with pytest.raises(ValueError, match="ReductionType.Mean or poptorch.ReductionType.Sum"):
        poptorch.Options().Training.accumulationAndReplicationReductionType(
            poptorch.ReductionType.NoReduction
        )
    with pytest.raises(AssertionError, match="output_return_period"):
        poptorch.Options().outputMode(poptorch.OutputMode.EveryN)
    with pytest.raises(ValueError, match="input_group_size must be a factor"):
        poptorch.Options().replicationFactor(4).inputReplicaGrouping(3, poptorch.CommGroupType.Consecutive)


def test_options_are_frozen_once_given_to_a_wrapper_and_clone_unfreezes():
    opts = poptorch.Options().deviceIterations(2)
    poptorch.inferenceModel(torch.nn.Linear(2, 2), opts)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.deviceIterations(3)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.Training.gradientAccumulation(2)
    copy = opts.clone()
    copy.deviceIterations(3).Training.gradientAccumulation(2)
    assert (copy.device_iterations, opts.device_iterations) == (3, 2)


def test_every_documented_setter_exists():
    opts = poptorch.Options()
    opts.setExecutionStrategy(poptorch.ShardedExecution(poptorch.AutoStage.AutoIncrement))
    opts.setAvailableMemoryProportion({"IPU0": 0.3, "IPU1": 0.5})
    opts.TensorLocations.setOptimizerLocation(poptorch.TensorLocationSettings().useOnChipStorage(False))
    opts.Precision.setPartialsType(torch.half).enableStochasticRounding(True)
    opts.Training.setAutomaticLossScaling(True)
    opts.enableExecutableCaching("/tmp/cache").useIpuModel(True).autoRoundNumIPUs(True)
    opts._Popart.set("autoRecomputation", 3)
    opts.Distributed.disable()
    assert opts.auto_round_num_ipus and opts.available_memory_proportion == {"IPU0": 0.3, "IPU1": 0.5}
    assert isinstance(opts.execution_strategy, poptorch.ShardedExecution)
    assert opts._Popart.autoRecomputation == 3


def test_an_option_without_effect_says_so_once(caplog):
    _logging._said.discard("useIpuModel")
    with caplog.at_level(logging.WARNING, logger="poptorch"):
        poptorch.Options().useIpuModel(True)
        poptorch.Options().useIpuModel(False)
    said = [r.getMessage() for r in caplog.records if "useIpuModel" in r.getMessage()]
    assert said == ["useIpuModel has no effect on the simulated IPU: the whole IPU is simulated already."]


def test_set_log_level():
    poptorch.setLogLevel("ERR")
    assert poptorch.logger.level == logging.ERROR
    poptorch.setLogLevel("WARN")
    with pytest.raises(ValueError, match="Unknown log level 'LOUD'"):
        poptorch.setLogLevel("LOUD")
