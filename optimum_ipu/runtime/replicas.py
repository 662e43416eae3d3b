"""Replicas: which of a combined batch's replicas this process runs, and how their results combine.

A combined batch is laid out [device iteration][replica][accumulation step][micro-batch]. In one
process every replica runs here, one after another on the same weights, and "reducing over replicas"
is a sum over what was accumulated locally: the math of r data-parallel copies and an all-reduce.
A distributed group (see `distributed.py`) runs a slice of the replicas per process and reduces with
`torch.distributed` collectives; both expose the same small interface, so the executable does not
care which one it has.

Each replica has its own random stream for dropout (and anything else drawn from torch's global
generator inside the model), seeded from the run seed and the replica index, as PopTorch seeds
replicas differently: a replicated run is not a longer accumulation of one replica. Stochastic
rounding of the weight update is not drawn from these streams: the update is replica-identical
(the IPU's identical-seeds rule), so its generator lives with the optimizer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import torch

_GOLDEN = 0x9E3779B97F4A7C15  # spreads consecutive replica indices over the seed space


def replica_seed(seed: int, replica: int) -> int:
    """The seed of replica `replica`'s random stream in a run seeded with `seed`."""
    return (int(seed) + _GOLDEN * (replica + 1)) % (2**63)


class ReplicaStreams:
    """One random-number stream per replica for torch's global CPU (and CUDA) generators.

    `with streams.use(r):` swaps replica r's state in, and on exit saves it back and restores the
    state that was there before, so the trainer's own stream (data order) does not depend on
    how many replicas ran.
    """

    def __init__(self, seed: int, replicas: int):
        self.seed = seed
        self.states: list[torch.Tensor] = [
            torch.Generator().manual_seed(replica_seed(seed, r)).get_state() for r in range(replicas)
        ]
        self.cuda_states: list[list[torch.Tensor] | None] = [None] * replicas

    @contextlib.contextmanager
    def use(self, replica: int) -> Iterator[None]:
        outer = torch.get_rng_state()
        outer_cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        torch.set_rng_state(self.states[replica])
        if outer_cuda is not None:
            cuda = self.cuda_states[replica]
            if cuda is None:
                for device in range(torch.cuda.device_count()):
                    with torch.cuda.device(device):
                        torch.cuda.manual_seed(replica_seed(self.seed, replica) + device)
            else:
                torch.cuda.set_rng_state_all(cuda)
        try:
            yield
        finally:
            self.states[replica] = torch.get_rng_state()
            torch.set_rng_state(outer)
            if outer_cuda is not None:
                self.cuda_states[replica] = torch.cuda.get_rng_state_all()
                torch.cuda.set_rng_state_all(outer_cuda)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "cpu": list(self.states), "cuda": list(self.cuda_states)}

    def load_state_dict(self, state: dict, replicas_may_change: bool = False) -> None:
        """Take a checkpoint's streams. With `replicas_may_change` (a resume that accepted a changed setup,
        `--allow_batch_change_on_resume`) a run of another replica count keeps the streams of the replicas
        both have, and a replica the checkpoint lacks starts its own stream from the checkpoint's seed."""
        saved, count = len(state["cpu"]), len(self.states)
        if saved != count and not replicas_may_change:
            raise ValueError(
                f"the checkpoint has random streams for {saved} replicas, this run has {count}: resume with the "
                "checkpoint's replication factor, or accept the change with --allow_batch_change_on_resume."
            )
        self.seed = state["seed"]
        fresh = ReplicaStreams(self.seed, count)
        self.states = [state["cpu"][r].clone() if r < saved else fresh.states[r] for r in range(count)]
        cuda = list(state["cuda"])
        self.cuda_states = [cuda[r] if r < saved else None for r in range(count)]


@runtime_checkable
class Replicas(Protocol):
    """Which replicas this process runs and how their values meet: what an executable asks of replicas.

    `LocalReplicas` (every replica in this process, the reference) and `distributed.ProcessReplicas`
    (replicas spread over torch.distributed processes) implement it, so an executable runs unchanged
    on one process or many.
    """

    def local_replicas(self, replication_factor: int) -> range:
        """Indices of the replicas this process runs."""

    def sum_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Sum `tensors` in place over the processes that hold other replicas."""

    def any(self, flag: bool) -> bool:
        """True if `flag` is True in any process."""

    def sum_over_stages(self, value: torch.Tensor) -> torch.Tensor:
        """Sum a per-stage value over the pipeline stages of one replica."""

    def gather_losses(self, losses: torch.Tensor) -> torch.Tensor:
        """Every replica's losses, in replica order."""


class LocalReplicas:
    """Every replica in this process: collectives are identities (the single-process reference)."""

    def local_replicas(self, replication_factor: int) -> range:
        """Indices of the replicas this process runs."""
        return range(replication_factor)

    def sum_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Sum `tensors` in place over processes (nothing to do in one process)."""

    def any(self, flag: bool) -> bool:
        """True if `flag` is True in any process."""
        return bool(flag)

    def sum_over_stages(self, value: torch.Tensor) -> torch.Tensor:
        """Sum a per-stage value over the pipeline stages of one replica (one process holds them all)."""
        return value

    def gather_losses(self, losses: torch.Tensor) -> torch.Tensor:
        """Every replica's losses (all of them ran here)."""
        return losses
