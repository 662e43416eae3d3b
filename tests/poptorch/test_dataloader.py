"""poptorch.DataLoader as PopTorch 3.4 documents it: rebatching, a user's batch sampler, processes without torchrun.

Each expectation is a hand-worked list of sample indices or a plain torch loop over the same sampler, never
our own combined-batch formula.
"""

import math

import pytest
import torch

import poptorch


class Numbered(torch.utils.data.Dataset):
    """Sample i is the float i."""

    def __init__(self, length: int):
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(float(index))


class NumberedStream(torch.utils.data.IterableDataset):
    """Samples start .. start+length-1 in order; `split_between_workers` gives each torch worker its own run."""

    def __init__(self, length: int):
        self.total, self.start, self.length = length, 0, length

    def __len__(self) -> int:
        return self.total

    def __iter__(self):
        return (torch.tensor(float(i)) for i in range(self.start, self.start + self.length))


def split_between_workers(worker_id: int) -> None:
    """torch's recipe for an iterable dataset under workers: worker k reads the k-th run of ceil(n / workers)."""
    info = torch.utils.data.get_worker_info()
    stream = info.dataset
    per_worker = math.ceil(stream.total / info.num_workers)
    stream.start = per_worker * worker_id
    stream.length = max(0, min(per_worker, stream.total - stream.start))


def seen(loader) -> list[int]:
    return [int(v) for batch in loader for v in batch.reshape(-1)]


# -- 1. AsyncRebatched ---------------------------------------------------------------------------------
@pytest.mark.parametrize("worker_size", [1, 3, 4, None])
def test_async_rebatched_returns_every_sample_of_an_iterable_dataset_once(worker_size):
    """30 samples over 3 workers of 10 each: torch batches of 4 drop each worker's 2 left over (24 seen);
    PopTorch rebatches the workers' batches, so 28 are seen (7 batches of 4) and the last 2 are dropped."""
    loader = poptorch.DataLoader(
        poptorch.Options(), NumberedStream(30), batch_size=4, num_workers=3,
        mode=poptorch.DataLoaderMode.AsyncRebatched, rebatched_worker_size=worker_size,
        worker_init_fn=split_between_workers,
    )  # fmt: skip
    for _ in range(2):  # and again in a second epoch
        batches = list(loader)
        assert [b.shape[0] for b in batches] == [4] * 7
        values = seen(batches)
        assert len(values) == len(set(values)) == 28
    assert len(loader) == 7


@pytest.mark.parametrize("worker_size", [1, 3, None])
def test_async_rebatched_without_drop_last_returns_the_leftover_as_one_last_batch(worker_size):
    """30 samples, combined batch 4 (batch_size 2 x 2 device iterations): 7 full batches, then one of 2."""
    loader = poptorch.DataLoader(
        poptorch.Options().deviceIterations(2), NumberedStream(30), batch_size=2, num_workers=3, drop_last=False,
        mode=poptorch.DataLoaderMode.AsyncRebatched, rebatched_worker_size=worker_size,
        worker_init_fn=split_between_workers,
    )  # fmt: skip
    batches = list(loader)
    assert [b.shape[0] for b in batches] == [4] * 7 + [2]
    assert sorted(seen(batches)) == list(range(30))
    assert len(loader) == 8


def test_async_rebatched_over_a_map_style_dataset_gives_the_sync_batches():
    sync = list(poptorch.DataLoader(poptorch.Options(), Numbered(30), batch_size=4, drop_last=False))
    rebatched = poptorch.DataLoader(poptorch.Options(), Numbered(30), batch_size=4, drop_last=False, num_workers=2,
                                    mode=poptorch.DataLoaderMode.AsyncRebatched, rebatched_worker_size=3)  # fmt: skip
    assert [b.tolist() for b in rebatched] == [b.tolist() for b in sync]
    assert len(rebatched) == len(sync) == 8


def test_a_rebatched_worker_size_above_the_combined_batch_is_an_error_naming_both():
    with pytest.raises(poptorch.Error, match=r"rebatched_worker_size \(9\) must be <= to the combined batch size \(8\)"):
        poptorch.DataLoader(poptorch.Options().deviceIterations(2), Numbered(30), batch_size=4,
                            mode=poptorch.DataLoaderMode.AsyncRebatched, rebatched_worker_size=9)  # fmt: skip
