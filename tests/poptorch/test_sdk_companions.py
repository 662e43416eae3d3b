"""The Poplar SDK's companions PopTorch programs import: popart's enums and popdist (outside a poprun launch).

poprun itself and the launches are tested in tests/distributed/test_poprun.py.
"""

from __future__ import annotations

import enum

import pytest
import torch

import optimum_ipu.sdk.popart as sdk_popart
import popart
import popdist
import poptorch
from optimum_ipu.poptorch import _distributed

# PopART 3.4.0's Python names and values (willow/include/popart/sessionoptions.hpp, python/popart/popart_core/
# popart.cpp in graphcore/popart), written out here independently of the module.
POPART_3_4 = {
    "AccumulateOuterFragmentSchedule": {"Scheduler": 0, "Serial": 1, "OverlapCycleOptimized": 2,
                                        "OverlapMemoryOptimized": 3},
    "BatchSerializationBatchSchedule": {"Scheduler": 0, "Isomorphic": 1, "OverlapOnIo": 2, "OverlapOnCompute": 3},
    "BatchSerializationMethod": {"UnrollDynamic": 0, "UnrollStatic": 1, "Loop": 2},
    "BatchSerializationTransformContext": {"Fwd": 0, "Bwd": 1, "Forward": 0, "Backward": 1},
    "ExecutionPhaseIOSchedule": {"Preload": 0, "OnDemand": 1},
    "ExecutionPhaseSchedule": {"Interleaving": 0, "Batch": 1, "BatchClusteredIO": 2},
    "Instrumentation": {"Outer": 0, "Inner": 1},
    "MeanReductionStrategy": {"Running": 0, "Post": 1},
    "MergeVarUpdateType": {"Off": 0, "All": 1, "AutoLoose": 2, "AutoTight": 3},
    "RecomputationType": {"NoRecompute": 0, "Standard": 1, "NormOnly": 2, "Pipeline": 3, "RecomputeAll": 4},
    "SubgraphCopyingStrategy": {"OnEnterAndExit": 0, "JustInTime": 1},
    "SyntheticDataMode": {"Off": 0, "Zeros": 1, "RandomNormal": 2, "RandomUniform": 3},
    "VirtualGraphMode": {"Off": 0, "Manual": 1, "Auto": 2, "ExecutionPhases": 3},
}  # fmt: skip


# -- popart --------------------------------------------------------------------------------------------


def test_the_sdk_names_are_the_same_module_objects_as_the_implementation():
    """popart, popdist and poptorch, as the SDK names them, are optimum-ipu's modules (one implementation)."""
    import importlib

    import optimum_ipu.poptorch
    import optimum_ipu.poptorch.optim
    import optimum_ipu.sdk.popdist
    import optimum_ipu.sdk.popdist.poptorch

    assert popart is sdk_popart
    assert popdist is optimum_ipu.sdk.popdist and popdist.poptorch is optimum_ipu.sdk.popdist.poptorch
    assert importlib.import_module("popdist.poptorch") is optimum_ipu.sdk.popdist.poptorch
    assert poptorch is optimum_ipu.poptorch and importlib.import_module("poptorch.optim") is optimum_ipu.poptorch.optim
    assert popdist.poptorch.Options is optimum_ipu.sdk.popdist.poptorch.Options


def test_popart_says_it_is_a_stand_in():
    assert popart.__version__.startswith("3.4.0+")
    assert "optimum-ipu's stand-in" in popart.versionString()


def test_popart_enums_have_popart_3_4s_names_and_values():
    enums = {
        name: getattr(popart, name)
        for name in dir(popart)
        if isinstance(getattr(popart, name), enum.EnumMeta)
    }
    assert set(enums) == set(POPART_3_4)
    for name, members in POPART_3_4.items():
        assert issubclass(enums[name], enum.IntEnum)
        assert {m: int(enums[name][m]) for m in members} == members, name
        assert set(enums[name].__members__) == set(members), name


def test_the_applications_popart_calls_reach_poptorch_options():
    """As Graphcore's applications pass them: int(popart.X.Y) into opts._Popart.set / enableSyntheticData."""
    opts = poptorch.Options()
    opts._Popart.set("accumulateOuterFragmentSettings.schedule",
                     int(popart.AccumulateOuterFragmentSchedule.OverlapMemoryOptimized))  # fmt: skip
    opts._Popart.set("subgraphCopyingStrategy", int(popart.SubgraphCopyingStrategy.JustInTime))
    opts._Popart.set("virtualGraphMode", int(popart.VirtualGraphMode.Manual))
    opts._Popart.set(
        "batchSerializationSettings.batchSchedule", int(popart.BatchSerializationBatchSchedule.Isomorphic)
    )
    opts.enableSyntheticData(int(popart.SyntheticDataMode.RandomNormal))
    assert opts._Popart._values["accumulateOuterFragmentSettings.schedule"] == 3
    assert opts._Popart._values["subgraphCopyingStrategy"] == 1


@pytest.mark.parametrize("recompute", ["Standard", "Pipeline", "RecomputeAll"])
def test_auto_recomputation_is_on_for_every_type_but_no_recompute(recompute):
    opts = poptorch.Options()
    opts._Popart.set("autoRecomputation", int(popart.RecomputationType[recompute]))
    assert opts._Popart._values["autoRecomputation"] and not int(popart.RecomputationType.NoRecompute)


def test_popart_session_api_is_an_attribute_error_naming_poptorchs_api():
    with pytest.raises(
        AttributeError, match=r"popart.Builder is not provided.*not simulated.*poptorch.trainingModel"
    ):
        popart.Builder()
    assert not hasattr(popart, "InferenceSession")
    assert not hasattr(
        popart, "__wrapped__"
    )  # dunders stay plain AttributeErrors (copy, pickle, inspect ask)


# -- popdist outside a poprun launch ---------------------------------------------------------------------


@pytest.fixture
def no_launch(monkeypatch):
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "POPDIST_NUM_TOTAL_REPLICAS",
        "POPDIST_NUM_IPUS_PER_REPLICA",
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def instance_1_of_2(no_launch):
    """The environment poprun --num-instances 2 --num-replicas 4 --ipus-per-replica 2 gives instance 1 (poprun
    starts its instances with torchrun, whose rendezvous variables come with them)."""
    no_launch.setenv("MASTER_ADDR", "127.0.0.1")
    no_launch.setenv("MASTER_PORT", "29500")
    no_launch.setenv("RANK", "1")
    no_launch.setenv("WORLD_SIZE", "2")
    no_launch.setenv("POPDIST_NUM_TOTAL_REPLICAS", "4")
    no_launch.setenv("POPDIST_NUM_IPUS_PER_REPLICA", "2")
    return no_launch


def test_outside_poprun_popdist_describes_one_instance(no_launch):
    assert not popdist.isPopdistEnvSet()
    facts = (popdist.getInstanceIndex(), popdist.getNumInstances(), popdist.getNumTotalReplicas(),
             popdist.getNumLocalReplicas(), popdist.getNumIpusPerReplica())  # fmt: skip
    assert facts == (0, 1, 1, 1, 1)
    popdist.init()  # alone: nothing to join
    assert not torch.distributed.is_initialized()
    ran = []
    assert popdist.execute_on_instances({0}, ran.append, "zero") is None and ran == ["zero"]
    popdist.execute_on_instances({1}, ran.append, "one")
    assert ran == ["zero"]


def test_under_plain_torchrun_each_process_is_an_instance_of_one_replica(no_launch):
    no_launch.setenv("RANK", "2")
    no_launch.setenv("WORLD_SIZE", "3")
    assert not popdist.isPopdistEnvSet()
    assert (popdist.getInstanceIndex(), popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas()) == (
        2,
        3,
        1,
    )


def test_popdist_reads_what_poprun_sets(instance_1_of_2):
    assert popdist.isPopdistEnvSet()
    facts = (popdist.getInstanceIndex(), popdist.getNumInstances(), popdist.getNumTotalReplicas(),
             popdist.getNumLocalReplicas(), popdist.getNumIpusPerReplica())  # fmt: skip
    assert facts == (1, 2, 4, 2, 2)


def test_popdist_options_lay_the_instance_out_as_the_runtimes_processes(instance_1_of_2):
    """The whole run's 4 replicas, this instance 1 of 2: it runs replicas 2 and 3, and its DataLoader hands
    it their samples, batch_size x DI x 2 local replicas x GA per step (PopTorch's per-instance batch)."""
    opts = popdist.poptorch.Options(ipus_per_replica=2)
    assert type(opts) is poptorch.Options
    assert opts.deviceIterations(3) is opts  # the caller chains the other setters
    opts.Training.gradientAccumulation(5)
    assert (opts.replication_factor, opts.Distributed.processId, opts.Distributed.numProcesses) == (4, 1, 2)
    assert _distributed.local_replicas(opts) == range(2, 4)
    dataset = torch.utils.data.TensorDataset(torch.arange(600.0))
    loader = poptorch.DataLoader(opts, dataset, batch_size=2)
    assert loader.combinedBatchSize == 2 * 3 * popdist.getNumLocalReplicas() * 5
    assert popdist.poptorch.Options(2).replication_factor == 4  # positional, as the applications pass it
    assert popdist.poptorch.Options().replication_factor == 4


def test_popdist_errors_name_the_fix(instance_1_of_2):
    with pytest.raises(ValueError, match="Launch with poprun --ipus-per-replica 4"):
        popdist.poptorch.Options(ipus_per_replica=4)
    with pytest.raises(TypeError, match=r"got keyword arguments \['replicas'\].*call the setters"):
        popdist.poptorch.Options(replicas=2)
    with pytest.raises(
        AttributeError, match="popdist.getReplicaIndexOffset is not provided.*isPopdistEnvSet"
    ):
        popdist.getReplicaIndexOffset()


def test_without_poprun_ipus_per_replica_is_the_programs(no_launch):
    assert popdist.poptorch.Options(ipus_per_replica=4).replication_factor == 1


@pytest.mark.parametrize(
    "name, value, says",
    [
        # 3 replicas cannot be shared by 2 instances, each running the same number
        ("POPDIST_NUM_TOTAL_REPLICAS", "3", "POPDIST_NUM_TOTAL_REPLICAS=3 cannot be: the 2 instances each run the "
         "same number of replicas (replicas / instances), so the replicas must be a multiple of 2 (2 or 4)"),
        ("POPDIST_NUM_TOTAL_REPLICAS", "0", "POPDIST_NUM_TOTAL_REPLICAS=0 cannot be: a launch runs at least one "
         "replica per instance"),
        ("POPDIST_NUM_TOTAL_REPLICAS", "-2", "POPDIST_NUM_TOTAL_REPLICAS=-2 cannot be"),
        ("POPDIST_NUM_TOTAL_REPLICAS", "four", "POPDIST_NUM_TOTAL_REPLICAS='four' is not an integer"),
        ("POPDIST_NUM_IPUS_PER_REPLICA", "0", "POPDIST_NUM_IPUS_PER_REPLICA=0 cannot be: a replica uses at least one IPU"),
    ],
)
def test_popdist_rejects_launch_values_that_cannot_be(instance_1_of_2, name, value, says):
    """Values set by hand (not by poprun) that no launch can have: every call that reads them says which, and why."""
    instance_1_of_2.setenv(name, value)
    reads = [popdist.poptorch.Options]
    if name == "POPDIST_NUM_TOTAL_REPLICAS":
        reads += [popdist.getNumTotalReplicas, popdist.getNumLocalReplicas]
    else:
        reads += [popdist.getNumIpusPerReplica]
    for read in reads:
        with pytest.raises(ValueError) as raised:
            read()
        assert says in str(raised.value), read
        assert "poprun" in str(raised.value)  # where the numbers should come from


@pytest.mark.parametrize("cuda, backend", [(False, "gloo"), (True, "cpu:gloo,cuda:nccl")])
def test_every_join_of_the_process_group_takes_the_runtimes_backend(no_launch, cuda, backend):
    """PopTorch's processes, popdist.init() and horovod's init() join the group with one backend choice."""
    from optimum_ipu.runtime import distributed
    from optimum_ipu.sdk import horovod_torch as hvd

    joined = []
    no_launch.setattr(distributed.torch.cuda, "is_available", lambda: cuda)
    no_launch.setattr(torch.distributed, "is_initialized", lambda: False)
    no_launch.setattr(torch.distributed, "init_process_group", lambda backend: joined.append(backend))
    no_launch.setenv("WORLD_SIZE", "2")
    assert distributed.process_group_backend() == backend
    _distributed.join_process_group()
    popdist.init()
    hvd.init()
    hvd.shutdown()
    assert joined == [backend] * 3
