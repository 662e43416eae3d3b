"""Replicas and pipeline stages as processes: the IPU system laid out over `torch.distributed`.

Launched with `torchrun --nproc_per_node K ...`, every process runs the same script. The processes
form a 2-D mesh, pipeline stages x data-parallel groups (`DeviceMesh` dims "pp" and "dp"):

- data parallel: each dp rank runs `replication_factor / dp` of the replicas of every combined batch
  (rank k takes replicas k*R/dp ... (k+1)*R/dp - 1, so replica r sees the same samples as in one
  process); the fp32 gradient sums are all-reduced over "dp" before the update;
- pipeline: when the world size covers `ipus_per_replica`, each process of a pipeline holds one
  IPU's stage and the micro-batches of an accumulation run through the stages concurrently
  (`runtime.stages`, `torch.distributed.pipelining`).

Every process loads the whole combined batch (the Trainer's sampler is the same on every rank) and
runs its slice, so the data layout is exactly the single-process one. Decisions that must agree
(an overflow on any replica skips the update everywhere, the loss scale, the gradient norm) are
reduced over all processes, and every process applies the same update, so the weights stay equal on
every rank and rank 0 saves them. Collectives are torch's: gloo on CPU, NCCL on GPU.
"""

from __future__ import annotations

import atexit
import gc
import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from optimum_ipu.call_layout import replicas_of_process


@dataclass(frozen=True)
class ProcessLayout:
    """How the processes of a run map onto the IPU system.

    Attributes:
        world_size: processes in the run.
        stages: processes per pipeline (1: each process runs whole replicas).
        data_parallel: pipelines side by side; each runs `replication_factor / data_parallel` replicas.
    """

    world_size: int
    stages: int
    data_parallel: int


def processes_share_replicas(world_size: int, replication_factor: int) -> bool:
    """Whether `world_size` processes each run whole replicas: the first branch of `process_layout`."""
    return replication_factor % world_size == 0


def process_layout(world_size: int, replication_factor: int, ipus_per_replica: int) -> ProcessLayout:
    """Lay `world_size` processes out as pipeline stages x data-parallel groups, or say why not.

    The one rule of both front ends (IPUTrainer here, PopTorch's wrappers in `poptorch._distributed`):
    when the processes divide the replicas, each runs whole replicas (as a poprun instance does, and as
    PopTorch's DataLoader, which shares the data out before any model is traced, assumes); otherwise,
    when the world is whole pipelines of `ipus_per_replica` processes whose count divides the replicas,
    each process holds one pipeline stage. Anything else is a `ValueError` naming the sizes that work.
    """
    if world_size <= 1:
        return ProcessLayout(1, 1, 1)
    if processes_share_replicas(world_size, replication_factor):
        return ProcessLayout(world_size, 1, world_size)
    stages = ipus_per_replica if ipus_per_replica > 1 and world_size % ipus_per_replica == 0 else 1
    data_parallel = world_size // stages
    if stages > 1 and replication_factor % data_parallel == 0:
        return ProcessLayout(world_size, stages, data_parallel)
    if stages > 1:
        reason = (
            f"{world_size} processes = {stages} pipeline stages x {data_parallel} data-parallel groups, "
            f"and {data_parallel} does not divide replication_factor={replication_factor}"
        )
    else:
        reason = f"replication_factor={replication_factor} is not a multiple of the world size {world_size}"
    raise ValueError(
        f"Cannot lay {world_size} processes out over the IPU system: {reason}. Launch "
        f"torchrun --nproc_per_node with a number of processes that divides the replicas "
        f"({_valid_sizes(replication_factor, ipus_per_replica)}), or change the replication "
        "(--pod_type / --n_ipu / replication_factor)."
    )


def valid_process_counts(replication_factor: int, ipus_per_replica: int) -> list[int]:
    """The world sizes `process_layout` accepts: divisors of the replicas (whole replicas per process), and
    as many whole pipelines of `ipus_per_replica` stage processes."""
    replicas = [d for d in range(1, replication_factor + 1) if replication_factor % d == 0]
    return sorted(
        set(replicas) | ({ipus_per_replica * d for d in replicas} if ipus_per_replica > 1 else set())
    )


def _valid_sizes(replication_factor: int, ipus_per_replica: int) -> str:
    return ", ".join(str(s) for s in valid_process_counts(replication_factor, ipus_per_replica))


def process_group_backend() -> str:
    """The backend every process group of ours is made with: gloo for CPU tensors, and, where CUDA is
    available, NCCL beside it for GPU ones (`cpu:gloo,cuda:nccl`). PopTorch's processes, popdist's
    `init()` and `horovod.torch`'s `init()` join one group with it, so whichever comes first serves all."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


class ProcessReplicas:
    """This process's replicas of a run spread over `torch.distributed` processes.

    The same interface as `LocalReplicas` (the single-process reference), so the executable runs
    unchanged: `local_replicas` names this process's slice, `sum_` all-reduces gradient sums over
    the data-parallel group, `any` agrees on a flag over every process, and `sum_over_stages` adds
    the pipeline stages' parts of a value (the squared gradient norm). `share_streams` is the
    trainer's, before a save: each process advances only its own replicas' random streams.
    """

    def __init__(self, layout: ProcessLayout, mesh: DeviceMesh, device: torch.device | str = "cpu"):
        self.layout = layout
        self.mesh = mesh
        # Where the collectives' tensors must be: NCCL reduces only GPU tensors, gloo CPU ones. The
        # decisions (overflow, loss-scale counts, logged losses) are made on CPU scalars.
        self.device = torch.device(device)
        self.dp_group = mesh.get_group("dp")
        self.pp_group = mesh.get_group("pp")
        self.dp_rank = mesh.get_local_rank("dp")
        self.stage = mesh.get_local_rank("pp")
        hold_process_groups(self)

    def release_process_groups(self) -> None:
        """Drop this object's references to the process groups (at exit, see `_close_process_group`)."""
        self.mesh = self.dp_group = self.pp_group = None

    def local_replicas(self, replication_factor: int) -> range:
        return replicas_of_process(replication_factor, self.layout.data_parallel, self.dp_rank)

    def sum_(self, tensors: Sequence[torch.Tensor]) -> None:
        """All-reduce (sum) `tensors` in place over the data-parallel group, in one flat message."""
        if self.layout.data_parallel == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, group=self.dp_group)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()

    def any(self, flag: bool) -> bool:
        value = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item() > 0)

    def sum_over_stages(self, value: torch.Tensor) -> torch.Tensor:
        if self.layout.stages == 1:
            return value
        summed = value.detach().to(self.device, copy=True)
        dist.all_reduce(summed, group=self.pp_group)
        return summed.to(value.device)

    def gather_losses(self, losses: torch.Tensor) -> torch.Tensor:
        """losses[d, r, g] with every replica's entries, from the processes that ran them."""
        if self.layout.data_parallel == 1:
            return losses
        known = ~losses.isnan()
        total = torch.where(known, losses, torch.zeros_like(losses)).to(self.device)
        dist.all_reduce(total, group=self.dp_group)
        return total.to(losses.device)

    def share_streams(self, streams) -> None:
        """Give every process the random streams of every replica (rank 0 saves them all)."""
        if self.layout.data_parallel == 1:
            return
        local = self.local_replicas(len(streams.states))
        mine = {r: (streams.states[r], streams.cuda_states[r]) for r in local}  # CPU and CUDA generators
        gathered: list[dict | None] = [None] * self.layout.data_parallel
        dist.all_gather_object(gathered, mine, group=self.dp_group)
        for part in gathered:
            for r, (cpu, cuda) in part.items():
                streams.states[r], streams.cuda_states[r] = cpu, cuda


def build_process_replicas(replication_factor: int, ipus_per_replica: int, device: torch.device | str):
    """The `ProcessReplicas` of this process when torch.distributed runs more than one; else None."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    layout = process_layout(dist.get_world_size(), replication_factor, ipus_per_replica)
    device_type = torch.device(device).type
    mesh = init_device_mesh(device_type, (layout.data_parallel, layout.stages), mesh_dim_names=("dp", "pp"))
    atexit.register(_close_process_group)
    return ProcessReplicas(layout, mesh, device)


# Objects of ours that keep process groups (replicas, pipeline stages); released at exit.
_GROUP_HOLDERS: weakref.WeakSet = weakref.WeakSet()


def hold_process_groups(holder) -> None:
    """Register `holder` (with a `release_process_groups()` method) to let go of its groups at exit."""
    _GROUP_HOLDERS.add(holder)


def gloo_threads() -> list[str]:
    """Names of this process's threads that gloo runs (Linux; empty elsewhere): its workers and I/O loops."""
    import os

    names = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return names
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as handle:
                name = handle.read().strip()
        except OSError:
            continue
        if "gloo" in name:
            names.append(name)
    return sorted(names)


# How long a process waits at exit: for the others to end too, or, when another process failed first,
# for the launcher to stop this one (see `_close_process_group`).
EXIT_WAIT = timedelta(seconds=10)
_EXIT_KEY = "optimum_ipu/exit"
_LEFT_KEY = "optimum_ipu/left_first"


def _ending_on_an_error() -> bool:
    """Whether this process is ending on an exception its program did not handle.

    The interpreter records such an exception in `sys.last_value` (`sys.last_exc` from 3.12) before
    the atexit callbacks run; `optimum-ipu run`, which catches the program's exception to print it,
    records it the same way (`launcher.runner.print_user_traceback`).
    """
    return getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None


def _launch_store():
    """The key-value store of the launch (torchrun's agent holds it), or None where there is none."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError):
        return None


def _leave_first(store) -> bool:
    """Record that this process leaves before the others reached their exit; True unless another did so first.

    A process whose collective breaks because a peer left (closing its group) fails after that peer,
    which recorded its leaving before closing: the launch's failure is the peer's.
    """
    rank = str(dist.get_rank())
    try:
        return store.compare_set(_LEFT_KEY, "", rank) == rank.encode()
    except RuntimeError:
        return True


def _all_reached_exit(store, timeout: timedelta | None) -> bool:
    """Note that this process reached its exit, then wait until every process of the group has too,
    `timeout` at most (None: not at all); whether they all have.

    The wait is on the launch's store, not a collective: a gloo barrier on rank k > 0 waits for rank
    0 without any time limit (`monitored_barrier`'s timeout is rank 0's only), so a rank 0 blocked in
    a collective waiting for this process held both until gloo's 30-minute timeout. A process that
    gave up waiting has still arrived: the others do not wait for it. A store that cannot be reached
    (its host is gone) ends the wait.
    """
    try:
        if store.add(_EXIT_KEY, 1) >= dist.get_world_size():
            store.set(_EXIT_KEY + "/all", "1")
            return True
        if timeout is None:
            return False
        store.wait([_EXIT_KEY + "/all"], timeout)
        return True
    except RuntimeError:  # the timeout (DistStoreError is a RuntimeError), or the store's host is gone
        return False


def _close_process_group() -> None:
    """Shut the process groups down together, and end gloo's threads, before the interpreter exits.

    The abort this prevents (SIGABRT, "terminate called without an active exception", about 1 in 75
    two-process launches, after a run that succeeded): `destroy_process_group()` only unregisters the
    groups; a gloo group's worker and I/O threads live until its C++ object is destroyed, which
    happens when the last Python reference goes, in the usual script (the trainer is garbage in a
    reference cycle) during the interpreter's finalization. A C++ thread that then needs the GIL
    (freeing the last reference to a tensor a Python object still owns, at the end of a collective)
    is ended by CPython 3.11 with pthread_exit, whose unwinding through a `noexcept` destructor calls
    std::terminate, the message above. So every process first waits for the others to reach their
    exit (`EXIT_WAIT` at most, on the launch's store), unregisters the groups, lets go of the groups
    our objects hold, and collects the garbage: the groups' destructors join gloo's threads while the
    interpreter is whole. Nothing of gloo runs during finalization.

    A process ending on an unhandled exception never waits for the others: they may be blocked in a
    collective waiting for it, which only its leaving ends (closing its group breaks their collective,
    its exit makes torchrun stop them). Waiting there held every process of the launch until gloo's
    30-minute timeout. A process that leaves before the others reached their exit (on an error, or
    after `EXIT_WAIT`, as after `sys.exit(3)` while a peer waits for it) records it in the store
    first; a process that then fails, its collective broken by that leaving, waits `EXIT_WAIT` at most
    for the launcher to stop it, so that the launch ends with the status of the process that left
    first, and names it.
    """
    if dist.is_available() and dist.is_initialized():
        store = _launch_store()
        if store is None:
            pass
        elif _ending_on_an_error():
            _all_reached_exit(store, None)  # arrived (the others need not wait for it), but waits for none
            if not _leave_first(store):
                time.sleep(EXIT_WAIT.total_seconds())  # another process left first: its failure is the launch's
        elif not _all_reached_exit(store, EXIT_WAIT):
            _leave_first(store)
        dist.destroy_process_group()
    for holder in list(_GROUP_HOLDERS):
        holder.release_process_groups()
    gc.collect()
