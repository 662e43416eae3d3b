"""poptorch.DataLoader as PopTorch 3.4 documents it: rebatching, a user's batch sampler, processes without torchrun.

Each expectation is a hand-worked list of sample indices or a plain torch loop over the same sampler, never
our own combined-batch formula.
"""

import logging
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


# -- 3. a user's batch_sampler -------------------------------------------------------------------------
def plain_loop(dataset, batch_sampler, combine: int, drop_last: bool, **kwargs) -> list:
    """The reference: torch's loader over the sampler's batches, `combine` consecutive ones concatenated."""
    batches = list(torch.utils.data.DataLoader(dataset, batch_sampler=batch_sampler, **kwargs))
    groups = [batches[i : i + combine] for i in range(0, len(batches), combine)]
    if groups and len(groups[-1]) < combine and drop_last:
        groups.pop()
    return [torch.cat(group).tolist() for group in groups]


@pytest.mark.parametrize("drop_last", [True, False])
def test_a_batch_sampler_gives_di_x_replicas_x_ga_consecutive_sampler_batches_per_item(drop_last):
    """23 samples in sampler batches of 2 (the last of 1): 12 batches; DI 2 x GA 3 = 6 per item, so 2 items."""
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(3)
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(23)), 2, drop_last=False)
    loader = poptorch.DataLoader(opts, Numbered(23), batch_sampler=sampler, drop_last=drop_last)
    assert [b.tolist() for b in loader] == plain_loop(Numbered(23), sampler, 6, drop_last)
    assert loader.combinedBatchSize == 2 * 6
    assert len(loader) == 2


def test_a_batch_sampler_of_7_batches_without_drop_last_ends_with_the_leftover_batch():
    """7 sampler batches, 3 per item (replicas): items of batches 0-2, 3-5, then 6 alone."""
    opts = poptorch.Options().replicationFactor(3)
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(14)), 2, drop_last=False)
    loader = poptorch.DataLoader(opts, Numbered(14), batch_sampler=sampler, drop_last=False)
    assert [b.tolist() for b in loader] == [[0.0, 1, 2, 3, 4, 5], [6.0, 7, 8, 9, 10, 11], [12.0, 13]]
    assert len(loader) == 3


def test_a_batch_sampler_of_a_distributed_sampler_as_lightning_injects_it_works_under_device_iterations():
    """Lightning's validate/predict hand PopTorch's DataLoader a BatchSampler over a DistributedSampler (or a
    SequentialSampler) with batch_size=1, shuffle=False, sampler=None, drop_last=False."""
    dataset = torch.utils.data.TensorDataset(torch.arange(40.0), torch.arange(40) % 3)
    shard = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=False)
    sampler = torch.utils.data.BatchSampler(shard, 4, drop_last=False)
    opts = poptorch.Options().deviceIterations(2)
    loader = poptorch.DataLoader(opts, dataset, batch_size=1, shuffle=False, sampler=None, drop_last=False,
                                 batch_sampler=sampler, num_workers=1, mode=poptorch.DataLoaderMode.Async)  # fmt: skip
    items = list(loader)
    reference = list(torch.utils.data.DataLoader(dataset, batch_sampler=sampler))  # 5 batches of 4
    assert [x.tolist() for x, _ in items] == [torch.cat([r[0] for r in reference[i : i + 2]]).tolist()
                                              for i in (0, 2, 4)]  # fmt: skip
    assert [y.tolist() for _, y in items] == [torch.cat([r[1] for r in reference[i : i + 2]]).tolist()
                                              for i in (0, 2, 4)]  # fmt: skip
    assert loader.combinedBatchSize == 8 and len(loader) == 3
    model = poptorch.inferenceModel(torch.nn.Identity(), opts)
    assert torch.equal(model(items[0][0]), items[0][0])


class Pair:
    """A custom argument type: the wrappers and the DataLoader find its tensors through its parser."""

    def __init__(self, data: torch.Tensor, label: torch.Tensor):
        self.data, self.label = data, label


class PairParser(poptorch.ICustomArgParser):
    def yieldTensors(self, struct):
        yield struct.data
        yield struct.label

    def reconstruct(self, original_structure, tensor_iterator):
        return Pair(*tensor_iterator)


def test_a_batch_sampler_combines_a_custom_type_through_its_registered_parser():
    poptorch.registerCustomArgParser(Pair, PairParser())
    try:
        def collate(samples):
            return Pair(torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples]))

        dataset = torch.utils.data.TensorDataset(torch.arange(12.0), -torch.arange(12.0))
        sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(dataset), 3, drop_last=True)
        items = list(poptorch.DataLoader(poptorch.Options().deviceIterations(2), dataset, batch_sampler=sampler,
                                         collate_fn=collate))  # fmt: skip
        assert [type(item) for item in items] == [Pair, Pair]
        assert [item.data.tolist() for item in items] == [list(range(6)), list(range(6, 12))]
        assert [item.label.tolist() for item in items] == [[-v for v in range(6)], [-v for v in range(6, 12)]]
    finally:
        poptorch.registerCustomArgParser(Pair, None)


def test_a_batch_sampler_with_batch_size_or_shuffle_is_poptorchs_error():
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(8)), 2, drop_last=False)
    with pytest.raises(poptorch.Error, match=r"`batch_sampler` option is mutually exclusive with batch_size, shuffle"):
        poptorch.DataLoader(poptorch.Options(), Numbered(8), batch_size=2, batch_sampler=sampler)
    with pytest.raises(poptorch.Error, match=r"mutually exclusive with batch_size, shuffle.*shuffle=True"):
        poptorch.DataLoader(poptorch.Options(), Numbered(8), shuffle=True, batch_sampler=sampler)


# -- 2. processes named by configureProcessId, without torchrun ------------------------------------------
def process_options(process: int, processes: int, replicas: int = 1, seed: int | None = None) -> poptorch.Options:
    opts = poptorch.Options().replicationFactor(replicas)
    if seed is not None:
        opts.randomSeed(seed)
    opts.Distributed.configureProcessId(process, processes)
    return opts


@pytest.fixture
def no_torchrun(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def test_configure_process_id_hands_each_of_3_processes_a_third_of_the_dataset(no_torchrun):
    """PopTorch's multi-host loader: each process's replicationFactor(1) is its own, so the run has 3 replicas
    and process k is handed replica k's samples: in every 12 samples, the k-th 4."""
    items = [list(poptorch.DataLoader(process_options(k, 3), Numbered(100), batch_size=4)) for k in range(3)]
    for k in range(3):
        assert [b.tolist() for b in items[k]] == [[12.0 * n + 4 * k + m for m in range(4)] for n in range(8)]
    assert sorted(v for k in range(3) for v in seen(items[k])) == list(range(96))
    assert [len(poptorch.DataLoader(process_options(k, 3), Numbered(100), batch_size=4)) for k in range(3)] == [8] * 3


def test_configure_process_id_shuffles_alike_in_every_process_from_the_options_seed(no_torchrun):
    """No process group to share a seed: every process shuffles with opts.randomSeed, so the 2 shards of an
    epoch are disjoint and cover the dataset (3 run batches of 2 processes x 2 replicas x 4 samples), and each
    epoch is another shuffle."""
    loaders = [poptorch.DataLoader(process_options(k, 2, replicas=2, seed=7), Numbered(48), batch_size=4,
                                   shuffle=True) for k in range(2)]  # fmt: skip
    epochs = [[seen(loader) for _ in range(2)] for loader in loaders]
    for epoch in range(2):
        assert sorted(epochs[0][epoch] + epochs[1][epoch]) == list(range(48))
    assert epochs[0][0] != epochs[0][1]
    again = poptorch.DataLoader(process_options(0, 2, replicas=2, seed=7), Numbered(48), batch_size=4, shuffle=True)
    assert seen(again) == epochs[0][0]


def test_a_shuffle_over_processes_without_a_seed_or_torchrun_is_poptorchs_error(no_torchrun):
    with pytest.raises(poptorch.Error, match=r"you must set poptorch.Options.randomSeed\(\) to ensure that tensors "
                                             r"are in the same order in all processes.*randomSeed\(42\)"):  # fmt: skip
        poptorch.DataLoader(process_options(0, 2, replicas=2), Numbered(40), batch_size=4, shuffle=True)


# -- 3. AsynchronousDataAccessor ---------------------------------------------------------------------------
def test_the_accessors_rebatched_size_makes_items_of_that_many_rows_and_drops_the_leftover():
    """PopTorch's accessor with `rebatched_size=N` over a loader of batch size 1: items of N rows, in order,
    `len` = rows // N; the rows that do not fill an item are dropped (its worker's `rebatched_drop_last`)."""
    loader = poptorch.DataLoader(poptorch.Options(), Numbered(18), batch_size=1)
    accessor = poptorch.AsynchronousDataAccessor(loader, rebatched_size=4)
    items = list(accessor)
    assert len(accessor) == 4
    assert [item.tolist() for item in items] == [[4.0 * n + m for m in range(4)] for n in range(4)]


def test_a_rebatched_size_of_one_or_less_is_poptorchs_error():
    loader = poptorch.DataLoader(poptorch.Options(), Numbered(8), batch_size=1)
    with pytest.raises(AssertionError, match="rebatched_size must be None or greater than 1"):
        poptorch.AsynchronousDataAccessor(loader, rebatched_size=1)


def test_the_accessors_timing_settings_say_once_that_they_change_nothing_here(caplog):
    """`early_preload`, `miss_sleep_time_in_ms`, `load_indefinitely` and `sharing_strategy` tune how PopTorch's
    worker process fills its ring buffer; here a thread loads ahead, so given they say so, once."""
    from optimum_ipu import _once

    _once.forget()
    caplog.set_level(logging.WARNING)
    loader = poptorch.DataLoader(poptorch.Options(), Numbered(8), batch_size=2)
    for _ in range(2):
        accessor = poptorch.AsynchronousDataAccessor(
            loader, early_preload=True, miss_sleep_time_in_ms=1, load_indefinitely=False,
            sharing_strategy=poptorch.SharingStrategy.SharedMemory,
        )  # fmt: skip
        assert [b.tolist() for b in accessor] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
    said = [r.getMessage() for r in caplog.records if "AsynchronousDataAccessor" in r.getMessage()]
    assert len(said) == 1, said
    for name in ("early_preload", "miss_sleep_time_in_ms", "load_indefinitely", "sharing_strategy"):
        assert name in said[0]
    _once.forget()
    caplog.clear()
    list(poptorch.AsynchronousDataAccessor(loader))  # nothing given: nothing said
    assert not [r for r in caplog.records if "AsynchronousDataAccessor" in r.getMessage()]


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_configure_process_id_leaves_each_process_its_own_replicas_whatever_their_count(no_torchrun, replicas):
    """PopTorch's combined batch is batch_size x DI x R x GA with R the process's own replicas, whether or not
    the processes could divide R: each of 2 processes is handed combined batches of its R replicas, its part
    of a run of 2R replicas (the k-th 2R samples of every 4R), so each gets half of the data."""
    for k in range(2):
        loader = poptorch.DataLoader(process_options(k, 2, replicas=replicas), Numbered(96), batch_size=2)
        assert loader.combinedBatchSize == 2 * replicas
        assert len(loader) == 96 // (4 * replicas)
        assert next(iter(loader)).tolist() == [float(2 * replicas * k + i) for i in range(2 * replicas)]


class _Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    def forward(self, x, y=None):
        out = self.linear(x)
        return out if y is None else (out, torch.nn.functional.mse_loss(out, y))


def test_configure_process_id_runs_each_processs_models_alone_as_its_own_program(no_torchrun):
    """With no process group nothing is exchanged: process 1 of 2's trainingModel with replicationFactor(2)
    trains as the same program does in one process (no process group is waited for), and its inferenceModel
    returns every row of its own replicas."""
    x, y = torch.randn(2 * 2 * 4, 3), torch.randn(2 * 2 * 4, 1)  # DI 2 x R 2 x micro-batch 4
    trained = []
    for processes in (2, 1):
        torch.manual_seed(0)
        model = _Regression()
        opts = process_options(processes - 1, processes, replicas=2).deviceIterations(2)
        training = poptorch.trainingModel(model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        training(x, y)
        training.destroy()
        trained.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        inference = poptorch.inferenceModel(model.eval(), process_options(processes - 1, processes, replicas=2))
        assert inference(x[:8]).shape == (8, 1)  # replicas 2 x micro-batch 4: the whole call's rows
    torch.testing.assert_close(trained[0], trained[1], rtol=0, atol=0)
