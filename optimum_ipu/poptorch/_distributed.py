"""PopTorch programs under torchrun: the replicas of `replicationFactor` shared out over the processes.

`torchrun --nproc_per_node P program.py` runs the program P times; `opts.Distributed` reads which
process this is. The program is the one that runs in one process: `replicationFactor(R)` is the
whole run's replica count, and process k runs replicas k*R/P ... (k+1)*R/P - 1, as IPUTrainer's
processes do (`runtime.distributed.ProcessReplicas`: gradient sums all-reduced before every update,
so every process applies the same update).

The data follows the replicas: `poptorch.DataLoader` hands each process only its replicas' part of
every combined batch (batch_size x DI x R/P x GA samples, the samples those replicas get in the
one-process run), with one shuffle shared by all processes (process 0 draws the seed; with no process
group to send it, every process seeds its shuffle with `opts.randomSeed`, as PopTorch does).

`opts.Distributed.configureProcessId(k, P)` with no torchrun (PopTorch's multi-host launch: each host
runs its own program and nothing is exchanged) leaves each process its R replicas as its own, as on
PopTorch, whatever R: its DataLoader is handed replicas k*R ... (k+1)*R - 1 of a run of R x P replicas
(`loader_replicas`), so each process gets 1/P of the data in combined batches of its own R, its models run
their R replicas alone, and nothing waits for another process (`run_processes` is 1).

Under torchrun, when R is not a multiple of P, the processes do not split the replicas: each is handed the
whole combined batch, a pipelined training model of N stages runs as P / N pipelines of N stage processes
(`_stages`; P must be N x a divisor of R, else `layout_error`), and an inference model runs whole in
every process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

from optimum_ipu.call_layout import CallLayout, replicas_of_process
from optimum_ipu.poptorch._logging import Error
from optimum_ipu.runtime.distributed import processes_share_replicas, valid_process_counts

__all__ = ["data_processes", "ipu_processes", "join_process_group", "loader_replicas", "local_replicas",
           "process_group_available", "processes", "run_processes"]  # fmt: skip


def processes(options) -> int:
    """Processes of the launch (1 without torchrun, or after `Distributed.disable()`)."""
    count = options.Distributed.numProcesses
    if count > 1 and options.input_group_size != 1:
        raise Error(
            "inputReplicaGrouping under torchrun is not simulated: run the program in one process "
            "(the replicas are simulated there too), or leave the input grouping at 1."
        )
    return count


def run_processes(options) -> int:
    """How many processes run one IPU run together (sharing its replicas or its pipeline stages, exchanging
    gradients): the launch's processes when they have a process group to exchange through (torchrun, poprun),
    else 1: with `configureProcessId` alone each process runs its `replicationFactor` as its own program,
    as on PopTorch. The one rule every multi-process decision here starts from.

    Decided once per process count and kept on the options (and the copies a model makes of them), so a
    program that creates its process group itself between building its DataLoader and its model gets the
    same answer for both.
    """
    count = processes(options)
    if count == 1:
        return 1
    kept = options.Distributed.__dict__.get("_run_processes")
    if kept is None or kept[0] != count:
        kept = (count, count if process_group_available() else 1)
        options.Distributed.__dict__["_run_processes"] = kept
    return kept[1]


def data_processes(options) -> int:
    """How many processes split each combined batch between them.

    When `replicationFactor` is a multiple of the processes, each process runs its share of the
    replicas and is handed only their samples. Otherwise every process is handed the whole combined
    batch: a pipelined training model then runs as stage processes (`_stages`, where the N processes
    of a pipeline all need its replicas' micro-batches), and an inference model runs whole in each.
    The DataLoader is built before the model is traced, so this is decided from the options alone.
    """
    count = run_processes(options)
    return count if count > 1 and processes_share_replicas(count, options.replication_factor) else 1


def ipu_processes(options, training: bool) -> int:
    """How many processes share the run's IPUs out, each attaching to its share (`runtime.checks.ipus_of_process`):
    the processes that split the replicas, or, in training, the stage processes; 1 when each process runs
    every replica (one process, `configureProcessId` alone, or an inference model that runs whole in each)."""
    count = data_processes(options)
    if count == 1 and training:
        count = run_processes(options)
    return count


def local_replicas(options) -> range:
    """The replicas whose samples this process is handed (all of them unless the processes split them)."""
    count = data_processes(options)
    return replicas_of_process(options.replication_factor, count, options.Distributed.processId if count > 1 else 0)


def process_group_available() -> bool:
    """Whether the processes can exchange values: a torch.distributed group is up, or torchrun's rendezvous
    variables are set (`join_process_group` can join one). `configureProcessId` alone sets neither."""
    if not dist.is_available():
        return False
    rendezvous = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    return dist.is_initialized() or all(name in os.environ for name in rendezvous)


def loader_replicas(options) -> tuple[int, range] | None:
    """How a DataLoader shares the data out: (the replicas of the run whose combined batches it lays out,
    this process's slice of them), or None when every process is handed every combined batch.

    Processes that split `replicationFactor` R: (R, `local_replicas`). Processes with no process group
    (`configureProcessId` without torchrun): each runs its R replicas as its own, so (R x P, this process's
    R of them). Otherwise (one process, or stage processes): None.
    """
    count = processes(options)
    if count == 1:
        return None
    if data_processes(options) > 1:
        return options.replication_factor, local_replicas(options)
    if run_processes(options) > 1:
        return None
    run = options.replication_factor * count
    return run, replicas_of_process(run, count, options.Distributed.processId)


def layout_error(replicas: int, count: int, stages: int) -> Error:
    """The error for `count` processes that can run neither replica processes nor stage processes."""
    valid = ", ".join(str(n) for n in valid_process_counts(replicas, stages) if n > 1)  # the runtime's rule
    if stages > 1:
        how = (
            f"as stage processes, {count} processes must be {stages} pipeline stages x a number of pipelines that "
            f"divides replicationFactor({replicas}) ({count} is not)"
        )
    else:
        how = (
            "stage processes (one pipeline stage per process) need a training model pipelined over 2 or more "
            "stages with poptorch.PipelinedExecution"
        )
    return Error(
        f"replicationFactor({replicas}) cannot be shared by the {count} processes of this launch: each process "
        f"runs replicationFactor / processes replicas, and {how}. Launch torchrun --nproc_per_node with one of "
        f"{valid or 1}, or set opts.replicationFactor to a multiple of {count}."
    )


def join_process_group() -> None:
    """Join torchrun's process group (once): gloo for CPU tensors, NCCL beside it for GPU ones."""
    from optimum_ipu.runtime.distributed import process_group_backend

    if dist.is_initialized():
        return
    dist.init_process_group(backend=process_group_backend())


def broadcast_module(module: torch.nn.Module) -> None:
    """Every process starts from process 0's weights and buffers (as DistributedDataParallel does)."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


class SharedShuffle(torch.utils.data.RandomSampler):
    """torch's RandomSampler, shuffling alike in every process.

    With a process group (torchrun), process 0 draws each pass's seed for every process: each process
    draws as torch's sampler does (so the random state advances alike) and uses process 0's draw, so
    the processes shuffle alike, and like a one-process run seeded the same. With none (PopTorch's
    `configureProcessId` launch), every process shuffles with its own generator seeded from
    `opts.randomSeed`, as PopTorch does, each pass continuing the generator (another order per epoch).
    """

    def __init__(self, data_source, seed: int | None):
        self._broadcast = process_group_available()
        if not self._broadcast and seed is None:
            raise Error(
                "When using auto_distributed_partitioning you must set poptorch.Options.randomSeed() to ensure "
                "that tensors are in the same order in all processes. There is no process group (no torchrun) "
                "to share a seed through: call opts.randomSeed(42) (any int, the same in every process), or "
                "shuffle=False."
            )
        generator = None if self._broadcast else torch.Generator().manual_seed(seed)
        super().__init__(data_source, generator=generator)

    def __iter__(self) -> Iterator[int]:
        if self._broadcast:
            join_process_group()
            seed = [int(torch.empty((), dtype=torch.int64).random_().item())]
            dist.broadcast_object_list(seed, src=0)
            self.generator = torch.Generator().manual_seed(seed[0])
        yield from super().__iter__()


class LocalReplicaBatches(torch.utils.data.Sampler):
    """The indices of this process's replicas in each combined batch of `batches`.

    A combined batch of the whole run (`layout`: every replica) is laid out [device iteration]
    [accumulation step][replica][micro-batch]; the process keeps, in that order, the micro-batches of
    the replicas in `local`.
    """

    def __init__(self, batches, micro: int, layout: CallLayout, local: range):
        self.batches, self.micro, self.layout, self.local = batches, micro, layout, local

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[int]]:
        layout, micro = self.layout, self.micro
        full = layout.combined_batch(micro)
        ga = layout.gradient_accumulation_steps
        for indices in self.batches:
            if len(indices) != full:
                raise Error(
                    f"The last combined batch has {len(indices)} samples, not {full}: under torchrun each process "
                    "takes its replicas' part of full combined batches. Use drop_last=True (PopTorch's default)."
                )
            yield [
                indices[layout.poptorch_index(d, g, r) * micro + m]
                for d in range(layout.device_iterations)
                for g in range(ga)
                for r in self.local
                for m in range(micro)
            ]
