"""poprun: a PopTorch program written for poprun (popdist, horovod.torch) equals its one-process run.

The launches (gloo, 2 processes) run `_poprun_worker.py` as Graphcore's applications are run:
`poprun --num-instances 2 --num-replicas R python program.py`. Faster checks, without a launch: how
poprun reads its command line, what it gives the instances, and the horovod.torch stand-in alone.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from optimum_ipu.sdk import horovod_torch as hvd
from optimum_ipu.sdk import poprun

WORKER = Path(__file__).with_name("_poprun_worker.py")
HVD_CHECKS = Path(__file__).with_name("_horovod_checks_worker.py")
PYTHON = sys.executable  # the program poprun launches: an executable, as `python` is on a pod
gloo = pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch.distributed with gloo")


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run(
        args, capture_output=True, text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "1"}
    )


def _poprun(*args: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "optimum_ipu.sdk.poprun", *args])


def _one_process_and_poprun(tmp_path: Path, replicas: int) -> tuple[dict, dict, Path]:
    one = _run([sys.executable, str(WORKER), str(tmp_path / "one"), "--replicas", str(replicas)])
    assert one.returncode == 0, one.stderr[-4000:]
    two = _poprun("--num-instances", "2", "--num-replicas", str(replicas), "--vipu-partition=pod16",
                  sys.executable, str(WORKER), str(tmp_path / "two"))  # fmt: skip
    assert two.returncode == 0, two.stderr[-4000:]
    assert two.stderr.count("--vipu-partition has no effect here") == 1
    return (
        torch.load(tmp_path / "one" / "result.pt"),
        torch.load(tmp_path / "two" / "result.pt"),
        tmp_path / "two",
    )


@gloo
def test_two_instances_of_two_replicas_equal_one_process(tmp_path):
    """popdist.poptorch.Options lays the 2 instances out as 1 replica each of a 2-replica run: the losses
    (averaged over the instances by hvd.allreduce) and the final weights are the one-process run's."""
    one, two, out = _one_process_and_poprun(tmp_path, replicas=2)
    torch.testing.assert_close(two["losses"], one["losses"], rtol=0, atol=1e-6)
    torch.testing.assert_close(two["weights"], one["weights"], rtol=0, atol=1e-6)
    seen = [json.loads((out / f"instance{k}.json").read_text()) for k in (0, 1)]
    assert seen[0]["start"] == seen[1]["start"]  # hvd.broadcast_parameters: instance 0's initial weights
    for k, facts in enumerate(seen):
        del facts["start"]
        assert facts == {"isPopdistEnvSet": True, "instance": k, "instances": 2, "total_replicas": 2,
                         "local_replicas": 1, "replication_factor": 2, "process": [k, 2],
                         "hvd": {"rank": k, "size": 2, "local_rank": k, "seed": 7.0, "allgather": [0, 0, 1, 10],
                                 "grouped": [2.0, 1.0]}}  # fmt: skip
    assert sorted(p.name for p in out.glob("saved_by*")) == ["saved_by0"]  # execute_on_instances({0}, ...)


@gloo
def test_two_instances_of_four_replicas_equal_one_process(tmp_path):
    """Two replicas per instance: each instance averages its own two losses, horovod averages the instances."""
    one, two, out = _one_process_and_poprun(tmp_path, replicas=4)
    torch.testing.assert_close(two["losses"], one["losses"], rtol=0, atol=1e-6)
    torch.testing.assert_close(two["weights"], one["weights"], rtol=0, atol=1e-6)
    facts = json.loads((out / "instance1.json").read_text())
    assert (facts["total_replicas"], facts["local_replicas"], facts["replication_factor"]) == (4, 2, 4)


@gloo
def test_the_exit_status_is_the_programs(tmp_path):
    program = tmp_path / "exits.py"
    program.write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    result = _poprun("--num-instances", "2", sys.executable, str(program))
    assert result.returncode == 3, result.stderr[-2000:]
    assert "instance 1 exited with status 3" in result.stderr


@gloo
def test_horovods_collectives_check_what_the_instances_pass(tmp_path):
    """A collective the instances call with tensors that do not match (or a root that is no instance) raises on
    every instance, naming what each passed, instead of a wrong result on one and a hang; the group stays usable."""
    result = _poprun("--num-instances", "2", sys.executable, str(HVD_CHECKS), str(tmp_path))
    assert result.returncode == 0, result.stderr[-4000:]
    seen = [json.loads((tmp_path / f"instance{k}.json").read_text()) for k in (0, 1)]
    for facts in seen:
        assert "hvd.allreduce" in facts["allreduce_shapes"]
        assert "instance 0 passed shape (2,)" in facts["allreduce_shapes"]
        assert "instance 1 passed shape (3,)" in facts["allreduce_shapes"]
        assert "torch.int64" in facts["allreduce_dtypes"] and "torch.float32" in facts["allreduce_dtypes"]
        assert "(1, 2)" in facts["broadcast_shapes"] and "(1, 3)" in facts["broadcast_shapes"]
        for key, root in (("broadcast_root_2", 2), ("broadcast_root_-1", -1), ("broadcast_object_root_2", 2)):
            assert f"root_rank={root} names no instance: the 2 instances are 0 and 1" in facts[key], key
        assert "shape (1, 2)" in facts["allgather_trailing"] and "shape (2, 3)" in facts["allgather_trailing"]
        assert facts["after"] == [3.0]


# -- the command line, without a launch -------------------------------------------------------------


def test_poprun_reads_its_options_and_leaves_the_programs_alone():
    launch = poprun.parse(["--num-instance=2", "--num-replicas", "4", "--ipus-per-replica", "2", "-vv",
                           "--mpi-local-args=-x PATH", "--host", "a,b", "--vv", "-vv",
                           "--vipu-new", "x", PYTHON, "train.py", "--num-instances", "5", "-vv"])  # fmt: skip
    assert (launch.instances, launch.replicas, launch.ipus_per_replica) == (2, 4, 2)
    assert launch.program == [PYTHON, "train.py", "--num-instances", "5", "-vv"]
    assert launch.ignored == ["-vv", "--mpi-local-args", "--host", "--vv", "--vipu-new"]
    assert poprun.parse(["--num-instances", "3", PYTHON]).replicas == 3  # one replica per instance by default


@pytest.mark.parametrize(
    ("argv", "says", "status"),
    [
        (
            ["--num-instances", "2", "--num-replicas", "3", PYTHON],
            "Use --num-replicas 2 or 4, or --num-instances 1 or 3",
            2,
        ),
        (["--num-instances", "2"], "no program to run: write it after poprun's options", 2),
        (["--num-instances", "0", PYTHON], "--num-instances takes a positive integer, got '0'", 2),
        (["--num-replicas"], "--num-replicas needs a value", 2),
        (["--only-output-from-instance", "1", PYTHON], "the 1 instances are 0 ... 0", 2),
        (["--nu", "2", PYTHON], "--nu is ambiguous: it could be --num-instances, --num-replicas", 2),
        (["--frobnicate", PYTHON], "unknown option --frobnicate: optimum-ipu's poprun reads --num-instances", 2),
        (["--frobnicate=1", PYTHON], "unknown option --frobnicate: optimum-ipu's poprun reads --num-instances", 2),
        # a misspelt option is an error naming the right one, whether its value follows it or is attached
        (["--num-replcias=4", PYTHON], "unknown option --num-replcias: did you mean --num-replicas?", 2),
        (["--num-replcias", "4", PYTHON], "unknown option --num-replcias: did you mean --num-replicas?", 2),
        (["--ipus-per-replcia", "2", PYTHON], "did you mean --ipus-per-replica?", 2),
        (["--executable-cache=/c", PYTHON], None, 0),  # an abbreviation poprun's own parser accepts
        (["-vv=1", PYTHON], "-vv takes no value", 2),
        (["train.py"], "To run a Python file, write `python train.py`", 127),
    ],
)
def test_poprun_names_what_to_change(argv, says, status, capsys):
    if says is None:  # accepted: parsed without a launch
        assert poprun.parse(argv).program == [PYTHON]
        return
    assert poprun.main(argv) == status
    err = capsys.readouterr().err
    assert says in err
    assert "--num-replcias=VALUE" not in err and "no effect" not in err  # the misspelling is not the fix


@pytest.mark.parametrize("instances", [1, 2, 3, 4])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 6, 8])
def test_poprun_and_popdist_keep_one_launch_contract(instances, replicas, monkeypatch):
    """What poprun launches, popdist reads back as launched; what poprun refuses, popdist refuses when set by hand."""
    import popdist

    for name in ("RANK", "WORLD_SIZE", "POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_NUM_IPUS_PER_REPLICA"):
        monkeypatch.delenv(name, raising=False)
    argv = ["--num-instances", str(instances), "--num-replicas", str(replicas), "--ipus-per-replica", "2", PYTHON]
    try:
        env = poprun._environment(poprun.parse(argv))
    except poprun.PoprunError:
        env = None
    monkeypatch.setenv("WORLD_SIZE", str(instances))
    monkeypatch.setenv("RANK", str(instances - 1))
    monkeypatch.setenv("POPDIST_NUM_TOTAL_REPLICAS", str(replicas))
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    if env is None:
        with pytest.raises(ValueError, match="cannot be"):
            popdist.getNumTotalReplicas()
    else:
        assert popdist.isPopdistEnvSet()
        assert (popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas(), popdist.getNumIpusPerReplica()) == (
            replicas, replicas // instances, 2)  # fmt: skip


def test_instances_get_popdists_numbers_and_horovod_only_when_it_is_not_installed(monkeypatch):
    launch = poprun.parse(["--num-instances", "2", "--num-replicas", "4", "--ipus-per-replica", "2", PYTHON])
    monkeypatch.setenv("PYTHONPATH", "/theirs")
    env = poprun._environment(launch)
    assert env["POPDIST_NUM_TOTAL_REPLICAS"] == "4" and env["POPDIST_NUM_IPUS_PER_REPLICA"] == "2"
    horovod, utils = poprun.STAND_INS / "for_horovod", poprun.STAND_INS / "for_examples_utils"
    assert env["PYTHONPATH"] == os.pathsep.join([str(horovod), str(utils), "/theirs"])
    assert (horovod / "horovod" / "torch.py").is_file() and (utils / "examples_utils" / "__init__.py").is_file()

    find_spec = importlib.util.find_spec
    for installed, left in (("horovod", utils), ("examples_utils", horovod)):
        real = importlib.machinery.ModuleSpec(installed, None)
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, real=real: real if name == real.name else find_spec(name, *a))  # fmt: skip
        # a real installation is never shadowed; the other stand-in is still served
        assert poprun._environment(launch)["PYTHONPATH"] == os.pathsep.join([str(left), "/theirs"])


# -- the horovod.torch stand-in in one process ---------------------------------------------------------


@pytest.fixture
def alone(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield hvd
    hvd.shutdown()


def test_horovod_needs_init_then_answers_for_one_process(alone):
    with pytest.raises(ValueError, match=r"use hvd.init\(\)"):
        alone.rank()
    alone.init()
    assert (alone.size(), alone.rank(), alone.local_rank(), alone.local_size()) == (1, 0, 0, 1)
    t = torch.tensor([1.0, 3.0])
    for reduced in (alone.allreduce(t), alone.allreduce(t, average=False), alone.allreduce(t, op=alone.Sum),
                    alone.broadcast(t, root_rank=0), alone.allgather(t)):  # fmt: skip
        assert reduced is not t and torch.equal(reduced, t)
    assert torch.equal(alone.allreduce(t, op=alone.Sum, prescale_factor=2.0), 2 * t)
    assert [r.item() for r in alone.grouped_allreduce([torch.tensor(1), torch.tensor(2)], op=alone.Sum)] == [
        1,
        2,
    ]
    assert alone.allgather(torch.tensor(5.0)).shape == (1,)
    assert alone.broadcast_object({"seed": 1}, root_rank=0) == {"seed": 1}
    alone.broadcast_parameters(torch.nn.Linear(2, 2).state_dict(), root_rank=0)


def test_horovod_errors_name_the_fix(alone):
    alone.init()
    with pytest.raises(ValueError, match="op parameter supersedes average"):
        alone.allreduce(torch.ones(1), average=True, op=alone.Sum)
    with pytest.raises(ValueError, match="use hvd.Average, hvd.Sum"):
        alone.allreduce(torch.ones(1), op=2)  # Horovod's Adasum
    with pytest.raises(ValueError, match="pass model.state_dict"):
        alone.broadcast_parameters({"step": 3}, root_rank=0)
    for call in (alone.broadcast, alone.broadcast_, alone.broadcast_parameters, alone.broadcast_object):
        with pytest.raises(ValueError, match=r"root_rank=1 names no instance: the 1 instance is 0\."):
            call({} if call is alone.broadcast_parameters else torch.ones(1), root_rank=1)
    with pytest.raises(AttributeError, match="DistributedOptimizer is not provided.*trainingModel already"):
        alone.DistributedOptimizer  # noqa: B018


def test_examples_utils_load_lib_checks_the_source_and_loads_nothing(tmp_path, caplog):
    from optimum_ipu.sdk.examples_utils import load_lib

    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_lib(tmp_path / "missing.cpp")
    source = tmp_path / "custom_ops.cpp"
    source.write_text("// a Poplar custom op\n")
    with caplog.at_level("WARNING"):
        assert load_lib(source) is None
        load_lib(source)
    assert caplog.text.count("not built or loaded") == 1
