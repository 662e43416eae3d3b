"""poptorch.Options: builder API, sub-objects, freezing, clone, and options with no effect saying so."""

import logging
import os
import re
import subprocess
import sys

import pytest
import torch

import optimum_ipu.poptorch as impl
import poptorch
from optimum_ipu import _once


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
    _once.forget()
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


# -- set(name=value) runs the named setter's checks ---------------------------------------------------


@pytest.mark.parametrize(
    "owner, values, named",
    [
        (lambda o: o, {"device_iterations": 0}, lambda o: o.deviceIterations(0)),
        (lambda o: o, {"replication_factor": "2"}, lambda o: o.replicationFactor("2")),
        (lambda o: o, {"output_mode": poptorch.OutputMode.EveryN, "output_return_period": -1},
         lambda o: o.outputMode(poptorch.OutputMode.EveryN, -1)),
        (lambda o: o, {"random_seed": "x"}, lambda o: o.randomSeed("x")),
        (lambda o: o, {"available_memory_proportion": {"IPU0": 2}},
         lambda o: o.setAvailableMemoryProportion({"IPU0": 2})),
        (lambda o: o.Training, {"gradient_accumulation": 0}, lambda o: o.Training.gradientAccumulation(0)),
        (lambda o: o.Distributed, {"distributed_process_id": 3}, lambda o: o.Distributed.configureProcessId(3, 1)),
    ],
)  # fmt: skip
def test_set_refuses_what_the_named_setter_refuses_with_its_message(owner, values, named):
    with pytest.raises(Exception) as by_name:
        named(poptorch.Options())
    opts = poptorch.Options()
    before = opts.toDict()
    with pytest.raises(type(by_name.value)) as by_set:
        owner(opts).set(**values)
    assert str(by_set.value) == str(by_name.value)
    assert opts.toDict() == before


def test_set_stores_through_the_named_setters():
    opts = poptorch.Options()
    opts.set(device_iterations=4, output_mode=poptorch.OutputMode.EveryN, output_return_period=2)
    opts.Training.set(gradient_accumulation=3)
    reference = poptorch.Options().deviceIterations(4).outputMode(poptorch.OutputMode.EveryN, 2)
    reference.Training.gradientAccumulation(3)
    assert opts.toDict() == reference.toDict()


def test_set_keeps_no_value_of_a_call_with_one_refused():
    opts = poptorch.Options()
    with pytest.raises(ValueError, match="replicationFactor must be a positive integer, got 0"):
        opts.set(device_iterations=4, replication_factor=0)
    assert opts.device_iterations == 1


def test_set_of_an_unknown_option_names_it_and_the_closest():
    with pytest.raises(
        ValueError, match=r"Options has no option 'device_iteration' \(did you mean 'device_iterations'\?\)"
    ):
        poptorch.Options().set(device_iteration=4)
    with pytest.raises(ValueError, match=r"Training has no option 'foo': set\(\) takes accumulation_and"):
        poptorch.Options().Training.set(foo=1)
    with pytest.raises(ValueError, match=r"'anchored_tensors' has no set\(\): use Options.anchorTensor"):
        poptorch.Options().set(anchored_tensors={})


def test_every_option_a_setter_stores_can_be_set_by_name():
    opts = poptorch.Options().randomSeed(1).useIpuId(0).modelName("m").logDir("d").disableModuleNamescope()
    for part in (opts, opts.Training, opts.Precision, opts.Distributed, opts.TensorLocations, opts.Jit,
                 poptorch.TensorLocationSettings().useOnChipStorage(True)):  # fmt: skip
        assert set(part._values) <= set(part._SETTERS), type(part).__name__
        for name in part._values:
            if part._SETTERS[name] is not None:
                part.set(**{name: part._values[name]})  # each stored value is one its setter accepts


def test_the_poptorch_logger_prints_what_its_level_lets_through_in_poptorchs_format(capsys):
    """PopTorch's logger has its own console handler: after `setLogLevel("INFO")` an info message is
    printed ("[12:34:56.789] [poptorch] [info] ..."), where a logger without a handler drops it."""
    try:
        poptorch.setLogLevel("INFO")
        poptorch.logger.info("compiled in %d s", 3)
        poptorch.setLogLevel("WARN")
        poptorch.logger.info("not shown at WARN")
    finally:
        poptorch.setLogLevel("WARN")
    err = capsys.readouterr().err
    assert re.search(r"^\[\d\d:\d\d:\d\d\.\d{3}\] \[poptorch\] \[info\] compiled in 3 s$", err, re.M), err
    assert "not shown" not in err


@pytest.mark.parametrize("level, expected", [(0, logging.DEBUG), (1, logging.DEBUG), (2, logging.INFO),
                                             (3, logging.WARNING), (4, logging.ERROR), (6, logging.CRITICAL)])  # fmt: skip
def test_set_log_level_reads_an_integer_as_poptorchs_legacy_level(level, expected):
    """PopTorch's integer levels are its C++ ones (0 trace ... 6 off), not `logging`'s numbers."""
    try:
        poptorch.setLogLevel(level)
        assert poptorch.logger.level == expected
    finally:
        poptorch.setLogLevel("WARN")
    with pytest.raises(ValueError, match="Invalid log level integer 5"):
        poptorch.setLogLevel(5)


def test_poptorch_log_level_is_read_from_the_environment_at_import():
    code = "import logging, poptorch; print(logging.getLevelName(poptorch.logger.level))"
    env = {**os.environ, "POPTORCH_LOG_LEVEL": "ERR"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ERROR"
