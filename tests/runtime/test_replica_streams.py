"""Each replica draws its own dropout masks, the same ones run after run, whatever else runs.

The masks are read off a dropout layer applied to ones (an element kept is 1 / (1 - p), dropped is 0),
micro-batch by micro-batch in the order the executable runs them: device iteration, replica,
accumulation step.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from optimum_ipu.call_layout import CallLayout
from optimum_ipu.runtime.executor import TrainingExecutable
from optimum_ipu.runtime.loss_scaling import LossScaler
from optimum_ipu.runtime.replicas import ReplicaStreams, replica_seed


class DropoutProbe(nn.Module):
    """A weight times dropout(ones): records each call's dropout mask."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(64))
        self.dropout = nn.Dropout(0.5)
        self.masks: list[torch.Tensor] = []

    def forward(self, x):
        kept = self.dropout(torch.ones_like(x)) != 0
        self.masks.append(kept)
        return (self.weight * x * kept).sum()


def masks_by_replica(replicas: int, ga: int = 2, di: int = 1, seed: int = 0) -> list[list[torch.Tensor]]:
    """masks[r] = replica r's masks over the call, in order."""
    model = DropoutProbe()
    config = CallLayout(gradient_accumulation_steps=ga, replication_factor=replicas, device_iterations=di)  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    executable = TrainingExecutable(model, config, lambda mb: model(mb["x"]), optimizer, LossScaler(),
                                    ReplicaStreams(seed, replicas))  # fmt: skip
    executable({"x": torch.ones(di * replicas * ga, 64)})
    by_replica: list[list[torch.Tensor]] = [[] for _ in range(replicas)]
    for i, mask in enumerate(model.masks):
        by_replica[(i // ga) % replicas].append(mask)
    return by_replica


def test_replicas_draw_different_dropout_masks():
    first, second = masks_by_replica(replicas=2)
    for a, b in zip(first, second):
        assert not torch.equal(a, b)
        assert 0.3 < a.float().mean() < 0.7 and 0.3 < b.float().mean() < 0.7  # dropout 0.5 really drops


def test_a_replicas_masks_repeat_run_to_run_and_depend_on_the_seed():
    assert all(torch.equal(a, b) for a, b in zip(masks_by_replica(2)[1], masks_by_replica(2)[1]))
    assert not torch.equal(masks_by_replica(2)[1][0], masks_by_replica(2, seed=1)[1][0])


def test_a_replica_draws_the_same_masks_however_many_replicas_run_beside_it():
    """Replica 1 of 2 and replica 1 of 4 see the same stream: a replica's randomness is its own."""
    assert all(torch.equal(a, b) for a, b in zip(masks_by_replica(2)[1], masks_by_replica(4)[1]))


def test_a_replicas_stream_goes_on_across_device_iterations_without_repeating():
    two_iterations = masks_by_replica(replicas=2, di=2)[0]
    assert not torch.equal(two_iterations[0], two_iterations[2])  # iteration 2 does not restart the stream


def test_the_trainers_own_stream_does_not_depend_on_the_replicas():
    torch.manual_seed(5)
    masks_by_replica(replicas=1)
    after_one = torch.rand(4)
    torch.manual_seed(5)
    masks_by_replica(replicas=4)
    assert torch.equal(torch.rand(4), after_one)


def test_both_kinds_of_replicas_give_the_executable_the_whole_interface():
    import inspect

    from optimum_ipu.runtime.distributed import ProcessReplicas
    from optimum_ipu.runtime.replicas import LocalReplicas, Replicas

    wanted = {n for n, _ in inspect.getmembers(Replicas, inspect.isfunction) if not n.startswith("_")}
    assert wanted == {"local_replicas", "sum_", "any", "sum_over_stages", "gather_losses"}
    for kind in (LocalReplicas, ProcessReplicas):
        signatures = {n: list(inspect.signature(getattr(kind, n)).parameters) for n in wanted}
        assert signatures == {n: list(inspect.signature(getattr(Replicas, n)).parameters) for n in wanted}, (
            kind
        )
    assert isinstance(LocalReplicas(), Replicas)


def test_no_replica_replays_the_run_seeds_own_stream():
    # The trainer draws data order and initial weights from torch.manual_seed(seed): a replica seeded
    # with the same number would drop out in step with them.
    for seed in (0, 42, 2**63 - 1):
        assert all(replica_seed(seed, r) != seed for r in range(64))


def test_replicas_never_share_a_seed():
    for seed in (0, 42):
        assert len({replica_seed(seed, r) for r in range(1024)}) == 1024


def test_replica_seeds_leave_room_for_a_device_index_in_torchs_seed_range():
    # CUDA devices are seeded with replica_seed + device index; torch accepts seeds below 2**64.
    seeds = [replica_seed(seed, r) for seed in (0, 7, 2**63 - 1, 2**64 - 1) for r in range(256)]
    assert all(0 <= s < 2**63 for s in seeds)
    torch.Generator().manual_seed(max(seeds) + 1024)


def _draws(streams, replica, n=4):
    with streams.use(replica):
        return torch.rand(n)


def test_a_saved_stream_resumes_where_it_stopped_in_a_fresh_run():
    streams = ReplicaStreams(seed=3, replicas=2)
    _draws(streams, 0), _draws(streams, 1)
    state = streams.state_dict()
    assert set(state) == {"seed", "cpu", "cuda"} and state["seed"] == 3 and state["cuda"] == [None, None]
    expected = [_draws(streams, 0), _draws(streams, 1)]  # what the uninterrupted run draws next
    resumed = ReplicaStreams(seed=99, replicas=2)
    resumed.load_state_dict(state)
    assert [torch.equal(a, b) for a, b in zip([_draws(resumed, 0), _draws(resumed, 1)], expected)] == [
        True,
        True,
    ]
    again = resumed.state_dict()
    assert again["seed"] == 3 and again["cuda"] == [None, None] and len(again["cpu"]) == 2


def test_a_saved_state_is_a_snapshot_later_draws_do_not_change():
    streams = ReplicaStreams(seed=3, replicas=1)
    state = streams.state_dict()
    before = state["cpu"][0].clone()
    _draws(streams, 0)
    assert torch.equal(state["cpu"][0], before)
    resumed = ReplicaStreams(seed=3, replicas=1)
    resumed.load_state_dict(state)
    _draws(resumed, 0)
    assert torch.equal(state["cpu"][0], before)  # drawing after a load leaves the loaded state alone


def test_streams_saved_for_another_replica_count_are_refused():
    state = ReplicaStreams(seed=3, replicas=2).state_dict()
    with pytest.raises(
        ValueError,
        match=re.escape(
            "the checkpoint has random streams for 2 replicas, this run has 4: resume with the checkpoint's "
            "replication factor, or accept the change with --allow_batch_change_on_resume."
        ),
    ):
        ReplicaStreams(seed=3, replicas=4).load_state_dict(state)


def test_a_checkpoints_replica_streams_load_into_another_replica_count_only_when_the_change_was_accepted():
    saved = ReplicaStreams(7, 2)
    with saved.use(0):
        torch.rand(3)  # replica 0's stream has moved on
    wider = ReplicaStreams(0, 3)
    with pytest.raises(ValueError, match="streams for 2 replicas, this run has 3.*--allow_batch_change_on_resume"):
        wider.load_state_dict(saved.state_dict())
    wider.load_state_dict(saved.state_dict(), replicas_may_change=True)
    assert wider.seed == 7
    assert all(torch.equal(wider.states[r], saved.states[r]) for r in (0, 1))  # carried on
    assert torch.equal(wider.states[2], ReplicaStreams(7, 3).states[2])  # its own, from the run's seed
