"""Replicas and stages spread over processes, checked fast: ranks as threads, and a real one-process gloo group.

Unit tests of optimum_ipu/runtime/distributed.py. The collectives' rules (which group a value is
summed over, what every rank ends with) are checked with the ranks of a run as threads of this
process: a stand-in for `torch.distributed` whose all-reduce and all-gather meet at a barrier and
combine what each rank handed in, as gloo does, and refuses a tensor that is not on the CPU (gloo
reduces only CPU tensors). Each rank's result is compared with the single-process reference
(`LocalReplicas`, `ReplicaStreams` advanced in one process). What needs the real library (a mesh,
gloo's threads, shutting the groups down) runs on a real gloo group of one process.
The multi-process runs (torchrun, 2 and 4 processes) are in tests/distributed/.
"""

from __future__ import annotations

import atexit
import copy
import gc
import threading
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from optimum_ipu.runtime import distributed
from optimum_ipu.runtime.distributed import (
    ProcessLayout,
    ProcessReplicas,
    build_process_replicas,
    gloo_threads,
    hold_process_groups,
    process_layout,
)
from optimum_ipu.runtime.replicas import LocalReplicas, ReplicaStreams

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="needs torch.distributed with gloo")


# -- ranks as threads --------------------------------------------------------------------------------------


class Group:
    """A process group of some ranks: a collective is an exchange of what each rank hands in."""

    def __init__(self, name: str, ranks: list[int]):
        self.name, self.ranks = name, ranks
        self.barrier = threading.Barrier(len(ranks), timeout=10)
        self.slots: list = [None] * len(ranks)

    def exchange(self, value):
        self.slots[self.ranks.index(Ranks.current.rank)] = value
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()  # nobody writes the next collective's value before everyone has read this one
        return values


class Ranks:
    """`world_size` ranks laid out as a (dp, pp) mesh, row-major like `init_device_mesh`: rank = d x pp + s."""

    current = threading.local()

    def __init__(self, layout: ProcessLayout):
        self.layout = layout
        dp, pp = layout.data_parallel, layout.stages
        self.world = Group("world", list(range(dp * pp)))
        self.dp = [Group(f"dp{s}", [d * pp + s for d in range(dp)]) for s in range(pp)]
        self.pp = [Group(f"pp{d}", [d * pp + s for s in range(pp)]) for d in range(dp)]
        self.calls: list[tuple] = []

    # torch.distributed's functions used by distributed.py
    ReduceOp = dist.ReduceOp

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None):
        group = group or self.world
        if tensor.device.type != "cpu":
            raise RuntimeError(f"gloo reduces only CPU tensors, got one on {tensor.device}")
        values = group.exchange(tensor.clone())
        self.calls.append(("all_reduce", Ranks.current.rank, group.name, op, tuple(tensor.shape)))
        if op == dist.ReduceOp.SUM:
            result = sum(values[1:], values[0].clone())
        elif op == dist.ReduceOp.MAX:
            result = torch.stack(values).amax(0)
        else:
            raise NotImplementedError(op)
        tensor.copy_(result)

    def all_gather_object(self, object_list, obj, group=None):
        group = group or self.world
        values = group.exchange(copy.deepcopy(obj))  # pickled across processes: nobody shares the object
        self.calls.append(("all_gather_object", Ranks.current.rank, group.name))
        for i, value in enumerate(values):
            object_list[i] = copy.deepcopy(value)

    def mesh(self, rank: int) -> SimpleNamespace:
        pp = self.layout.stages
        d, s = divmod(rank, pp)
        groups = {"dp": self.dp[s], "pp": self.pp[d]}
        return SimpleNamespace(
            get_group=groups.__getitem__, get_local_rank=lambda name: groups[name].ranks.index(rank)
        )

    def run(self, fn, device="cpu") -> list:
        """fn(replicas, rank) on every rank at once; the results by rank (a rank's exception is raised)."""
        results: list = [None] * self.layout.world_size
        errors: list = []

        def main(rank):
            Ranks.current.rank = rank
            try:
                results[rank] = fn(ProcessReplicas(self.layout, self.mesh(rank), device), rank)
            except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
                errors.append(error)
                for group in (self.world, *self.dp, *self.pp):
                    group.barrier.abort()  # the other ranks stop waiting for this one

        threads = [threading.Thread(target=main, args=(r,)) for r in range(self.layout.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


@pytest.fixture
def ranks(monkeypatch):
    def make(world_size: int, stages: int, data_parallel: int) -> Ranks:
        fake = Ranks(ProcessLayout(world_size, stages, data_parallel))
        monkeypatch.setattr(distributed, "dist", fake)
        return fake

    return make


# -- which replicas a process runs ----------------------------------------------------------------------


@pytest.mark.parametrize("replicas, dp", [(1, 1), (4, 1), (4, 2), (4, 4), (6, 3), (8, 2)])
def test_data_parallel_ranks_take_consecutive_slices_that_together_are_the_single_process_replicas(
    replicas, dp
):
    layout = ProcessLayout(dp, 1, dp)
    slices = [
        ProcessReplicas.local_replicas(SimpleNamespace(layout=layout, dp_rank=k), replicas) for k in range(dp)
    ]
    assert all(len(s) == replicas // dp for s in slices)
    assert [r for s in slices for r in s] == list(
        LocalReplicas().local_replicas(replicas)
    )  # in order, once each


def test_a_stage_process_runs_the_replicas_of_its_data_parallel_rank(ranks):
    fake = ranks(4, 2, 2)  # ranks 0, 1: pipeline of dp rank 0; ranks 2, 3: dp rank 1
    seen = fake.run(
        lambda replicas, rank: (replicas.dp_rank, replicas.stage, list(replicas.local_replicas(4)))
    )
    assert seen == [(0, 0, [0, 1]), (0, 1, [0, 1]), (1, 0, [2, 3]), (1, 1, [2, 3])]


# -- gradient sums, flags, stage sums, losses ----------------------------------------------------------------


def _gradient_sums(rank: int) -> list[torch.Tensor]:
    """What rank `rank` accumulated: different shapes in one message, distinct values per rank."""
    return [
        torch.arange(6.0).reshape(2, 3) * (rank + 1),
        torch.full((4,), 10.0 * (rank + 1)),
        torch.tensor(0.5),
    ]


def test_gradient_sums_are_summed_over_the_data_parallel_ranks_of_a_stage_only(ranks):
    fake = ranks(4, 2, 2)

    def step(replicas, rank):
        tensors = _gradient_sums(rank)
        replicas.sum_(tensors)
        return tensors

    result = fake.run(step)
    for rank in range(4):
        partner = rank ^ 2  # the same stage of the other pipeline
        expected = [a + b for a, b in zip(_gradient_sums(rank), _gradient_sums(partner))]
        assert [t.shape for t in result[rank]] == [t.shape for t in expected]
        for ours, reference in zip(result[rank], expected):
            assert torch.equal(ours, reference)
    reduces = [c for c in fake.calls if c[0] == "all_reduce"]
    assert len(reduces) == 4 and all(
        c[2].startswith("dp") and c[4] == (11,) for c in reduces
    )  # one flat message


def test_one_data_parallel_rank_or_no_tensors_sends_nothing(ranks):
    fake = ranks(2, 2, 1)

    def step(replicas, rank):
        tensors = _gradient_sums(rank)
        replicas.sum_(tensors)
        replicas.sum_([])
        return tensors

    result = fake.run(step)
    assert all(torch.equal(a, b) for rank in range(2) for a, b in zip(result[rank], _gradient_sums(rank)))
    fake = ranks(2, 1, 2)
    assert fake.run(lambda replicas, rank: replicas.sum_([])) == [None, None]
    assert fake.calls == []


@pytest.mark.parametrize("flagged", [[], [3], [0], [1, 2]])
def test_a_flag_raised_on_any_process_is_seen_by_every_process(ranks, flagged):
    fake = ranks(4, 2, 2)

    def step(replicas, rank):
        with torch.device(
            "meta"
        ):  # a script that moved torch's default device: the flag is still a CPU tensor
            return replicas.any(rank in flagged)

    assert fake.run(step) == [bool(flagged)] * 4
    assert {c[2] for c in fake.calls} == {"world"} and {c[3] for c in fake.calls} == {dist.ReduceOp.MAX}


def test_a_flag_is_a_maximum_not_a_sum(ranks):
    # A sum of 1.0 flags is > 0 as well; MAX vs SUM shows where a flag is handed in as its value.
    fake = ranks(2, 1, 2)
    fake.run(lambda replicas, rank: replicas.any(True))
    assert [c[3] for c in fake.calls] == [dist.ReduceOp.MAX] * 2


def test_a_value_is_summed_over_the_stages_of_one_pipeline(ranks):
    fake = ranks(4, 2, 2)

    def step(replicas, rank):
        own = torch.tensor([float(rank + 1) ** 2])  # this stage's squared gradient norm
        total = replicas.sum_over_stages(own)
        return own, total

    result = fake.run(step)
    for rank, (own, total) in enumerate(result):
        assert own.item() == float(rank + 1) ** 2  # the stage's own part is left as it was
        pipeline = [rank - rank % 2, rank - rank % 2 + 1]
        assert total.item() == sum(float(r + 1) ** 2 for r in pipeline)
    assert all(c[2].startswith("pp") for c in fake.calls)


def test_one_stage_sums_nothing(ranks):
    fake = ranks(2, 1, 2)
    values = fake.run(
        lambda replicas, rank: (lambda v: (v, replicas.sum_over_stages(v)))(torch.tensor([3.0]))
    )
    assert all(total is own for own, total in values)  # the value itself, as LocalReplicas returns it
    assert fake.calls == []


def test_sums_over_stages_come_back_on_the_values_device(ranks):
    # A stage's value may live on its own device; the collective runs on the replicas' device (here the CPU).
    fake = ranks(2, 2, 1)

    def step(replicas, rank):
        with torch.device("meta"):
            return replicas.sum_over_stages(torch.tensor([2.0], device="cpu")).item()

    assert fake.run(step) == [4.0, 4.0]


class GpuOnlyCollectives:
    """NCCL's rule in a stand-in: a collective takes only tensors on the replicas' (GPU) device."""

    ReduceOp = dist.ReduceOp

    def __init__(self, device: torch.device):
        self.device, self.seen = device, []

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None):
        if tensor.device != self.device:
            raise RuntimeError(f"NCCL reduces only tensors on {self.device}, got one on {tensor.device}")
        self.seen.append((tensor.device, group))


def test_values_cross_to_the_replicas_device_for_a_collective_and_come_back_to_their_own(monkeypatch):
    """NCCL reduces only GPU tensors, while the norm and the losses the executable reads are CPU values.

    Without a GPU here, the meta device stands in for it: under FakeTensorMode a meta tensor copies
    to and from the CPU (no data moves), so only where each tensor lives is checked; the values are
    checked on the CPU above.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    meta = torch.device("meta")
    collectives = GpuOnlyCollectives(meta)
    monkeypatch.setattr(distributed, "dist", collectives)
    mesh = SimpleNamespace(get_group=lambda name: name, get_local_rank=lambda name: 0)
    replicas = ProcessReplicas(ProcessLayout(4, 2, 2), mesh, meta)
    with FakeTensorMode():
        total = replicas.sum_over_stages(torch.ones(1))
        losses = replicas.gather_losses(torch.ones(2, 4, 1))
    assert (total.device, losses.device) == (torch.device("cpu"), torch.device("cpu"))
    assert collectives.seen == [(meta, "pp"), (meta, "dp")]


def _losses(replicas: int) -> torch.Tensor:
    """losses[d, r, g] of a combined batch of 2 device iterations and 3 accumulation steps."""
    return torch.arange(2 * replicas * 3, dtype=torch.float32).reshape(2, replicas, 3) / 7 + 0.25


@pytest.mark.parametrize("world, stages, dp", [(2, 1, 2), (4, 2, 2), (4, 1, 4)])
def test_every_process_gets_every_replicas_losses_as_one_process_computes_them(ranks, world, stages, dp):
    fake = ranks(world, stages, dp)
    reference = LocalReplicas().gather_losses(_losses(4))

    def step(replicas, rank):
        mine = torch.full_like(reference, float("nan"))  # what the other processes ran is unknown here
        local = replicas.local_replicas(4)
        mine[:, local.start : local.stop] = reference[:, local.start : local.stop]
        gathered = replicas.gather_losses(mine)
        return mine, gathered

    for mine, gathered in fake.run(step):
        assert torch.equal(gathered, reference)
        assert (
            mine.isnan().sum() == reference.numel() * (dp - 1) // dp
        )  # the rank's own tensor is not changed


def test_with_one_data_parallel_rank_the_losses_are_returned_as_they_are(ranks):
    fake = ranks(2, 2, 1)
    losses = _losses(2)
    assert all(out is losses for out in fake.run(lambda replicas, rank: replicas.gather_losses(losses)))
    assert fake.calls == []


def test_losses_come_back_on_their_device_after_a_collective_on_the_replicas_device(ranks):
    fake = ranks(2, 1, 2)

    def step(replicas, rank):
        mine = torch.full((1, 2, 1), float("nan"))
        mine[0, rank, 0] = rank + 1.0
        with torch.device("meta"):
            return replicas.gather_losses(mine).flatten().tolist()

    assert fake.run(step) == [[1.0, 2.0], [1.0, 2.0]]


# -- random streams before a save ------------------------------------------------------------------------------


def _draws(replica: int) -> int:
    return 3 + 2 * replica  # each replica advanced its stream by a different amount


_GLOBAL_GENERATOR = threading.Lock()  # the ranks are threads of one process, which has one global generator


def _advance(streams: ReplicaStreams, replica: int) -> None:
    with _GLOBAL_GENERATOR, streams.use(replica):
        torch.rand(_draws(replica))


def test_sharing_streams_gives_every_process_every_replicas_stream_as_one_process_has_them(ranks):
    reference = ReplicaStreams(seed=11, replicas=4)
    for replica in range(4):
        _advance(reference, replica)
        reference.cuda_states[replica] = [torch.tensor([replica])]  # stands in for a CUDA generator's state
    fake = ranks(4, 2, 2)

    def step(replicas, rank):
        streams = ReplicaStreams(seed=11, replicas=4)
        for replica in replicas.local_replicas(4):  # a process runs, and advances, only its own replicas
            _advance(streams, replica)
            streams.cuda_states[replica] = [torch.tensor([replica])]
        replicas.share_streams(streams)
        return streams

    for streams in fake.run(step):
        assert all(torch.equal(a, b) for a, b in zip(streams.states, reference.states))
        assert [c[0].item() for c in streams.cuda_states] == [0, 1, 2, 3]
    assert {c[2] for c in fake.calls} == {"dp0", "dp1"}


def test_with_one_data_parallel_rank_the_streams_are_already_all_here(ranks):
    fake = ranks(2, 2, 1)
    streams = fake.run(lambda replicas, rank: (replicas.share_streams(ReplicaStreams(1, 2)), "done"))
    assert streams == [(None, "done")] * 2 and fake.calls == []


# -- the layout of processes ---------------------------------------------------------------------------------------


def test_one_process_is_one_stage_and_one_data_parallel_rank():
    assert process_layout(1, 4, 2) == process_layout(0, 1, 1) == ProcessLayout(1, 1, 1)


@pytest.mark.parametrize(
    "world, replicas, ipus, expected",
    [(2, 2, 1, (2, 1, 2)), (4, 2, 2, (4, 2, 2)), (2, 1, 2, (2, 2, 1)), (4, 4, 1, (4, 1, 4)),
     (8, 2, 4, (8, 4, 2)), (2, 2, 4, (2, 1, 2)), (6, 3, 2, (6, 2, 3)), (3, 3, 2, (3, 1, 3)),
     (2, 2, 2, (2, 1, 2)), (4, 4, 2, (4, 1, 4))],
)  # fmt: skip
def test_whole_replicas_when_the_processes_divide_them_else_whole_pipelines(world, replicas, ipus, expected):
    """One rule for IPUTrainer and PopTorch (whose DataLoader shares out the replicas' data before any
    model is traced): replica processes first, as poprun's instances; stage processes otherwise."""
    layout = process_layout(world, replicas, ipus)
    assert (layout.world_size, layout.stages, layout.data_parallel) == expected


def test_processes_that_do_not_divide_the_replicas_are_refused_with_the_sizes_that_would():
    with pytest.raises(ValueError) as error:
        process_layout(3, 4, 1)
    assert str(error.value) == (
        "Cannot lay 3 processes out over the IPU system: replication_factor=4 is not a multiple of the world size "
        "3. Launch torchrun --nproc_per_node with a number of processes that divides the replicas (1, 2, 4), or "
        "change the replication (--pod_type / --n_ipu / replication_factor)."
    )


def test_stage_processes_that_do_not_divide_the_replicas_are_refused_with_the_sizes_that_would():
    with pytest.raises(ValueError) as error:
        process_layout(6, 2, 2)
    assert str(error.value) == (
        "Cannot lay 6 processes out over the IPU system: 6 processes = 2 pipeline stages x 3 data-parallel groups, "
        "and 3 does not divide replication_factor=2. Launch torchrun --nproc_per_node with a number of processes "
        "that divides the replicas (1, 2, 4), or change the replication (--pod_type / --n_ipu / replication_factor)."
    )


@pytest.mark.parametrize(
    "replicas, ipus, sizes",
    [(4, 1, "1, 2, 4"), (6, 1, "1, 2, 3, 6"), (3, 2, "1, 2, 3, 6"), (4, 4, "1, 2, 4, 8, 16"), (1, 2, "1, 2")],
)  # fmt: skip
def test_the_sizes_offered_are_the_divisors_of_the_replicas_and_as_many_whole_pipelines(
    replicas, ipus, sizes
):
    # Each size offered is accepted, and a replication_factor of 1 with one IPU offers only 1.
    assert distributed._valid_sizes(replicas, ipus) == sizes
    assert distributed._valid_sizes(1, 1) == "1"


@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 6, 8, 12])
@pytest.mark.parametrize("ipus", [1, 2, 3, 4])
def test_the_sizes_offered_are_exactly_the_sizes_accepted(replicas, ipus):
    offered = {int(size) for size in distributed._valid_sizes(replicas, ipus).split(", ")}
    accepted = set()
    for world in range(1, 2 * replicas * ipus + 2):
        try:
            process_layout(world, replicas, ipus)
            accepted.add(world)
        except ValueError:
            pass
    assert offered == accepted


# -- building the replicas of this process ---------------------------------------------------------------------------


def test_no_process_group_or_one_process_builds_no_process_replicas(monkeypatch):
    assert not dist.is_initialized()
    assert build_process_replicas(4, 2, "cpu") is None
    monkeypatch.setattr(distributed, "dist", SimpleNamespace(is_available=lambda: False))
    assert build_process_replicas(4, 2, "cpu") is None


def test_several_processes_build_a_dp_by_pp_mesh_and_close_it_at_exit(monkeypatch):
    fake = Ranks(ProcessLayout(4, 2, 2))
    Ranks.current.rank = 3
    meshes, registered = [], []
    monkeypatch.setattr(distributed, "dist", SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                                             get_world_size=lambda: 4))  # fmt: skip

    def init_mesh(device_type, shape, mesh_dim_names):
        meshes.append((device_type, shape, mesh_dim_names))
        return fake.mesh(3)

    monkeypatch.setattr(distributed, "init_device_mesh", init_mesh)
    monkeypatch.setattr(atexit, "register", registered.append)
    replicas = build_process_replicas(2, 2, "cuda:1")
    assert meshes == [("cuda", (2, 2), ("dp", "pp"))]
    assert registered == [distributed._close_process_group]
    assert replicas.layout == ProcessLayout(4, 2, 2) and replicas.device == torch.device("cuda:1")
    assert replicas.mesh.get_local_rank("dp") == 1  # the DeviceMesh is kept for what builds on it
    assert (replicas.dp_rank, replicas.stage, replicas.dp_group.name, replicas.pp_group.name) == (
        1,
        1,
        "dp1",
        "pp1",
    )
    assert replicas in distributed._GROUP_HOLDERS


# -- a real gloo group of one process: the mesh, gloo's threads, shutting down ---------------------------------------


@pytest.fixture
def gloo_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def _replicas_on_a_real_mesh() -> ProcessReplicas:
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "pp"))
    return ProcessReplicas(ProcessLayout(1, 1, 1), mesh)


def test_one_process_of_a_real_group_is_dp_rank_0_stage_0_and_decides_alone(gloo_group):
    assert build_process_replicas(4, 2, "cpu") is None  # world size 1: the single-process reference runs
    replicas = _replicas_on_a_real_mesh()
    assert (replicas.dp_rank, replicas.stage, list(replicas.local_replicas(3))) == (0, 0, [0, 1, 2])
    assert replicas.any(True) is True and replicas.any(False) is False
    assert replicas in distributed._GROUP_HOLDERS


def test_closing_ends_gloos_threads_before_the_interpreter_does(gloo_group):
    replicas = _replicas_on_a_real_mesh()
    replicas.any(True)
    threads = gloo_threads()
    assert threads and threads == sorted(threads) and all("gloo" in name for name in threads)
    distributed._close_process_group()
    assert not dist.is_initialized()
    assert (replicas.mesh, replicas.dp_group, replicas.pp_group) == (None, None, None)
    assert gloo_threads() == []  # the groups' destructors joined them


class Holder:
    def __init__(self):
        self.released = 0

    def release_process_groups(self):
        self.released += 1


class FakeStore:
    """The launch's key-value store, recorded; `others_arrive` says whether the other processes reach their exit
    in time, `left_first` which rank recorded leaving before this one ("" if none)."""

    def __init__(self, calls, arrived_before=1, others_arrive=True, left_first=""):
        self.calls, self.count, self.others_arrive, self.left_first = calls, arrived_before, others_arrive, left_first

    def add(self, key, amount):
        self.calls.append(("add", key, amount))
        self.count += amount
        return self.count

    def set(self, key, value):
        self.calls.append(("set", key, value))

    def wait(self, keys, timeout):
        self.calls.append(("wait", keys, timeout))
        if not self.others_arrive:
            raise RuntimeError("wait timeout after 10000ms")  # torch raises DistStoreError, a RuntimeError

    def compare_set(self, key, expected, desired):
        self.calls.append(("compare_set", key, expected, desired))
        return (self.left_first or desired).encode()


class FakeShutdown:
    """torch.distributed's shutdown calls for rank 1 of 2, recorded; `store` None: the store cannot be had."""

    def __init__(self, initialized=True, store=True, **store_kwargs):
        self.initialized, self.calls = initialized, []
        self.store = FakeStore(self.calls, **store_kwargs) if store else None
        self.distributed_c10d = SimpleNamespace(_get_default_store=self._get_default_store)

    def _get_default_store(self):
        if self.store is None:
            raise ValueError("Default process group has not been initialized")
        return self.store

    def is_available(self):
        return True

    def is_initialized(self):
        return self.initialized

    def get_rank(self):
        return 1

    def get_world_size(self):
        return 2

    def destroy_process_group(self):
        self.calls.append(("destroy",))


EXIT, ALL, LEFT = "optimum_ipu/exit", "optimum_ipu/exit/all", "optimum_ipu/left_first"
ARRIVE = ("add", EXIT, 1)
WAIT = ("wait", [ALL], distributed.EXIT_WAIT)
LEAVE_FIRST = ("compare_set", LEFT, "", "1")
SLEEP = ("sleep", distributed.EXIT_WAIT.total_seconds())


@pytest.mark.parametrize(
    "failed, fake, calls",
    [
        # ending normally: the other process had reached its exit, or does within EXIT_WAIT
        (False, dict(arrived_before=1), [ARRIVE, ("set", ALL, "1"), ("destroy",)]),
        (False, dict(arrived_before=0), [ARRIVE, WAIT, ("destroy",)]),
        # ... or does not (it waits in a collective for this one): this one leaves first, and says so
        (False, dict(arrived_before=0, others_arrive=False), [ARRIVE, WAIT, LEAVE_FIRST, ("destroy",)]),
        # ending on an error: never waits for the others, and leaves first ...
        (True, dict(arrived_before=0), [ARRIVE, LEAVE_FIRST, ("destroy",)]),
        # ... unless another process left first (its leaving broke this one's collective): then the launcher
        # stops this one, EXIT_WAIT at most, and the launch's failure is the other's
        (True, dict(arrived_before=0, left_first="0"), [ARRIVE, LEAVE_FIRST, SLEEP, ("destroy",)]),
        (True, dict(store=False), [("destroy",)]),  # no store to record in
        (False, dict(store=False), [("destroy",)]),
        (False, dict(initialized=False), []),
    ],
)
def test_closing_waits_for_the_others_only_on_a_normal_exit_and_at_most_exit_wait(monkeypatch, failed, fake, calls):
    shutdown = FakeShutdown(**fake)
    monkeypatch.setattr(distributed, "dist", shutdown)
    monkeypatch.setattr(distributed.time, "sleep", lambda seconds: shutdown.calls.append(("sleep", seconds)))
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        monkeypatch.delattr(distributed.sys, name, raising=False)
    if failed:  # as the interpreter records an exception the program did not handle
        monkeypatch.setattr(distributed.sys, "last_value", RuntimeError("the program failed"), raising=False)
    holders = [Holder(), Holder()]
    for holder in holders:
        hold_process_groups(holder)
    distributed._close_process_group()
    assert shutdown.calls == calls
    assert [h.released for h in holders] == [1, 1]
    for holder in holders:
        distributed._GROUP_HOLDERS.discard(holder)


def test_holding_process_groups_does_not_keep_the_holder_alive():
    holder = Holder()
    hold_process_groups(holder)
    assert holder in distributed._GROUP_HOLDERS
    del holder
    gc.collect()
    assert not any(isinstance(h, Holder) for h in distributed._GROUP_HOLDERS)


def test_gloo_threads_are_read_from_proc_and_nothing_where_there_is_none(gloo_group, monkeypatch):
    import os

    _replicas_on_a_real_mesh().any(True)
    real_listdir = os.listdir
    before = gloo_threads()
    assert before
    monkeypatch.setattr(
        os, "listdir", lambda path: ["999999999", *real_listdir(path)]
    )  # a thread that just ended
    assert gloo_threads() == before

    def no_proc(path):
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(os, "listdir", no_proc)
    assert gloo_threads() == []
