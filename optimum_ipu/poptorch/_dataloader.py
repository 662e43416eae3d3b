"""`poptorch.DataLoader`: a torch DataLoader whose batches are whole host calls (combined batches).

A combined batch is batch_size x deviceIterations x (replicationFactor / input group size) x
gradientAccumulation samples; PopTorch's default is `drop_last=True`. `DataLoaderMode.Async` and
`AsyncRebatched` load ahead in worker processes (torch's own workers, at least one) so the next
combined batch is ready while the model runs, as `AsynchronousDataAccessor` does on PopTorch. Rebatching
(`AsyncRebatched`, or `Async` with `drop_last=False`, as on PopTorch) re-cuts the workers' batches into
combined batches in the calling process, so every sample comes back once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import torch

from optimum_ipu._once import warn_once
from optimum_ipu.call_layout import CallLayout
from optimum_ipu.poptorch import _distributed
from optimum_ipu.poptorch._host_call import input_layout
from optimum_ipu.poptorch._logging import Error, logger, no_effect
from optimum_ipu.poptorch._utils import combine_batch_tensors_gen
from optimum_ipu.poptorch._worker_errors import worker_failures
from optimum_ipu.poptorch.custom_args import flatten_custom, rebuild_custom
from optimum_ipu.poptorch.enums import DataLoaderMode, SharingStrategy
from optimum_ipu.poptorch.options import Options

__all__ = ["AsynchronousDataAccessor", "DataLoader"]


def combined_batch_factor(options: Options) -> int:
    """Micro-batches per host call that read distinct data: DI x (replicas / input group size) x GA,
    of this process's replicas under torchrun (`_host_call.input_layout`)."""
    return input_layout(options).micro_batches


def _combined_batch(options: Options, batch_size: int, shared: bool) -> tuple[int, str]:
    """The samples one step takes from the dataset (this process's dataset under torchrun, unless
    `shared`: then every process's part of the combined batch), and how they multiply out."""
    factors = [f"batch_size({batch_size})", f"deviceIterations({options.device_iterations})",
               f"gradientAccumulation({options.Training.gradient_accumulation})"]  # fmt: skip
    replicas = [f"replicationFactor({options.replication_factor})"]
    if options.input_group_size != 1:
        replicas.append(f"input group size({options.input_group_size})")
    processes = _distributed.data_processes(options)
    if processes > 1 and not shared:  # each process's own dataset feeds its replicas only
        replicas.append(f"processes({processes})")
    factors.append(replicas[0] if len(replicas) == 1 else f"({' / '.join(replicas)})")
    layout = _distributed.loader_replicas(options)
    sharing = 1 if layout is None else layout[0] // len(layout[1])  # processes sharing each run's batch
    if shared and sharing > 1 and processes == 1:  # configureProcessId: each process's replicas its own
        factors.append(f"processes({sharing})")
    size = batch_size * combined_batch_factor(options) * (sharing if shared else 1)
    return size, " x ".join(factors)


def _no_batch(what: str, size: int, drop_last: bool) -> str:
    """The error for a loader that yields no combined batch: `what` it had against the batch, and the fix."""
    dropped = " (drop_last=True drops an incomplete one)" if drop_last else ""
    return (
        f"{what}: this DataLoader yields no batch{dropped}, so a loop over it would run no step. Use fewer "
        "device iterations, less gradient accumulation, fewer replicas or a smaller batch_size (a combined "
        f"batch no larger than the data), or a dataset of at least {size} sample{'s' if size > 1 else ''}."
    )


class _YieldsAtLeastOne:
    """The iterator of a DataLoader over an iterable dataset: an `Error` if it ends before its first item
    (the dataset held less than a combined batch, which a map-style dataset is checked for when created)."""

    def __init__(self, iterator: Iterator[Any], message: str):
        self._iterator, self._message, self._started = iterator, message, False

    def __iter__(self) -> _YieldsAtLeastOne:
        return self

    def __len__(self) -> int:
        return len(self._iterator)

    def __next__(self) -> Any:
        try:
            item = next(self._iterator)
        except StopIteration:
            if not self._started:
                raise Error(self._message) from None
            raise
        self._started = True
        return item


def _rows(batch: Any) -> int:
    """The samples a collated batch holds: dim 0 of its first tensor (custom types through their parsers)."""
    tensors = flatten_custom(batch)
    return tensors[0].shape[0] if tensors else 0


def _concatenated(batches: list[Any]) -> Any:
    """Consecutive collated batches of one structure as one: each tensor concatenated on dim 0, found and
    rebuilt as PopTorch does (`flatten_custom`, so a registered custom argument type is combined too)."""
    if len(batches) == 1:
        return batches[0]
    return rebuild_custom(batches[0], combine_batch_tensors_gen([flatten_custom(batch) for batch in batches]))


def _rows_of(batch: Any, rows: slice) -> Any:
    """`batch` with each tensor cut to `rows` on dim 0."""
    return rebuild_custom(batch, (tensor[rows] for tensor in flatten_custom(batch)))


def _rebatched(batches: Iterator[Any], size: int, drop_last: bool) -> Iterator[Any]:
    """`batches` (any sizes, e.g. the workers' `rebatched_worker_size` ones) re-cut into batches of `size`
    samples, in order; what is left at the end is one last, smaller batch unless `drop_last`. So no sample
    is lost to a worker's incomplete batch (`DataLoaderMode.AsyncRebatched`)."""
    pending: list[Any] = []
    held = 0
    for batch in batches:
        pending.append(batch)
        held += _rows(batch)
        while held >= size:
            whole = _concatenated(pending)
            yield _rows_of(whole, slice(0, size))
            held -= size
            pending = [_rows_of(whole, slice(size, None))] if held else []
    if held and not drop_last:
        yield _concatenated(pending)


def _combined(batches: Iterator[Any], count: int, drop_last: bool) -> Iterator[Any]:
    """Each `count` consecutive `batches` concatenated into one (a user's batch sampler's batches into
    combined batches, as PopTorch does); an incomplete last group too unless `drop_last`."""
    group: list[Any] = []
    for batch in batches:
        group.append(batch)
        if len(group) == count:
            yield _concatenated(group)
            group = []
    if group and not drop_last:
        yield _concatenated(group)


def _items_of(count: int, per_item: int, drop_last: bool) -> int:
    """Items made of `per_item` samples (`_rebatched`) or batches (`_combined`) out of `count`."""
    return count // per_item + (1 if count % per_item and not drop_last else 0)


def _mode_as_poptorch_reads_it(mode: Any) -> DataLoaderMode:
    """`mode` as PopTorch's DataLoader acts on it: it compares `mode` with `DataLoaderMode.Async` and
    `AsyncRebatched`, so a value equal to neither (a string such as "async_rebatched", which Graphcore's
    packed-BERT notebooks pass) loads synchronously there. So it does here, said once per value."""
    try:
        return DataLoaderMode(mode)
    except ValueError:
        pass
    names = ", ".join(f"DataLoaderMode.{m.name}" for m in DataLoaderMode)
    warn_once(
        logger,
        "poptorch.DataLoader(mode=%r): not a poptorch.DataLoaderMode, so, as on PopTorch (which compares the "
        "mode with the enum's members), the batches load synchronously in the calling process. Pass one of "
        "%s for another mode.", mode, names, key=("DataLoader mode", repr(mode)),
    )  # fmt: skip
    return DataLoaderMode.Sync


class DataLoader(torch.utils.data.DataLoader):
    """PopTorch's DataLoader: `batch_size` is the micro-batch; each item is a combined batch.

    Args:
        options: the `poptorch.Options` of the model the batches are for.
        dataset: a map-style or iterable dataset.
        batch_size: the micro-batch size (samples per replica per step), or None for unbatched items.
        shuffle, num_workers, drop_last (default True), persistent_workers: as torch's DataLoader.
        mode: `DataLoaderMode.Sync` (default), `Async` or `AsyncRebatched` (load ahead in workers).
        auto_distributed_partitioning: under torchrun, hand each process its replicas' part of every
            combined batch, or the whole combined batch when the replicas are not a multiple of the
            processes (stage processes); default True; False: each process's dataset is its own.
        async_options: accepted for PopTorch compatibility (torch's workers load ahead).
        rebatched_worker_size: with `AsyncRebatched`, the workers' batch size (at most the combined batch,
            its default); their batches are re-cut into combined batches, so none of an iterable dataset's
            samples is lost to a worker's incomplete batch.
        batch_sampler: PopTorch 3.4's: a sampler of index batches (the micro-batches); each item concatenates
            deviceIterations x (replicas / input group size) x gradientAccumulation consecutive ones (custom
            argument types through their registered parsers), the last incomplete group only with
            `drop_last=False`. Excludes `batch_size` and `shuffle`, and, in several processes,
            `auto_distributed_partitioning` (PopTorch's errors).
        **kwargs: passed to `torch.utils.data.DataLoader`.
    """

    def __init__(
        self,
        options: Options,
        dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        num_workers: int = 0,
        drop_last: bool = True,
        persistent_workers: bool | None = None,
        auto_distributed_partitioning: bool = True,
        mode: DataLoaderMode = DataLoaderMode.Sync,
        async_options: dict | None = None,
        rebatched_worker_size: int | None = None,
        batch_sampler: Any = None,
        **kwargs: Any,
    ):
        if not isinstance(options, Options):
            raise TypeError(
                f"poptorch.DataLoader's first argument is a poptorch.Options, got {type(options).__name__}: "
                "call poptorch.DataLoader(options, dataset, batch_size=...)."
            )
        self._options = options
        self._mode = _mode_as_poptorch_reads_it(mode)
        factor = combined_batch_factor(options)
        self._combine = 1  # a user's batch_sampler: its batches per item
        self._rebatch: int | None = None  # the size the workers' batches are re-cut into, when they are
        self._drop_last_item = drop_last  # an incomplete last item (rebatched or combined) is dropped
        self._empty_message: str | None = None  # an iterable dataset's: checked when iterated
        if self._mode != DataLoaderMode.Sync and num_workers == 0:
            num_workers = 1  # an asynchronous loader loads in a worker process
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        if batch_sampler is not None:
            batch_size = self._batch_sampler_size(batch_sampler, batch_size, shuffle, auto_distributed_partitioning)
            self._combined_batch_size = None if batch_size is None else batch_size * factor
            self._combine = factor
            self._check_batch_sampler_length(batch_sampler, drop_last)
            super().__init__(dataset, batch_sampler=batch_sampler, num_workers=num_workers,
                             persistent_workers=persistent_workers, **kwargs)  # fmt: skip
            return
        self._combined_batch_size = None if batch_size is None else batch_size * factor
        rebatch = self._rebatched_size(drop_last, rebatched_worker_size)
        if self._combined_batch_size is not None and drop_last is False and hasattr(dataset, "__len__"):
            if len(dataset) % self._combined_batch_size:
                logger.warning(
                    "The number of elements in the dataset (%d) is not divisible by the combined batch size "
                    "(%d = batch_size %d x %d): the last, smaller combined batch will fail the model's batch check "
                    "unless it divides evenly. Use drop_last=True (PopTorch's default).",
                    len(dataset), self._combined_batch_size, batch_size, factor,
                )  # fmt: skip
        share = (
            _distributed.processes(options) > 1 and auto_distributed_partitioning and batch_size is not None
        )
        if self._combined_batch_size is not None:
            self._check_holds_a_combined_batch(dataset, kwargs.get("sampler"), batch_size, drop_last, share)
        if share and not isinstance(dataset, torch.utils.data.IterableDataset):
            # Several processes: one shuffle for every process, and each takes its replicas' samples (every
            # replica's when the processes run pipeline stages under torchrun).
            sampler = kwargs.pop("sampler", None)
            if sampler is None:
                seed = options.random_seed if options.exists("random_seed") else None
                sampler = (
                    _distributed.SharedShuffle(dataset, seed)
                    if shuffle
                    else torch.utils.data.SequentialSampler(dataset)
                )
            replicas = options.replication_factor
            run_replicas, local = _distributed.loader_replicas(options) or (replicas, range(replicas))
            run = CallLayout(options.device_iterations, run_replicas,
                             options.Training.gradient_accumulation)  # every process's replicas
            batches = _distributed.LocalReplicaBatches(
                torch.utils.data.BatchSampler(sampler, run.combined_batch(batch_size), drop_last),
                batch_size, run, local,
            )  # fmt: skip
            super().__init__(
                dataset, batch_sampler=batches, num_workers=num_workers, persistent_workers=persistent_workers,
                **kwargs,
            )  # fmt: skip
            return
        loaded_batch, loaded_drop_last = self._combined_batch_size, drop_last
        if rebatch is not None:  # the workers load smaller batches, or keep their leftovers: re-cut here
            self._rebatch = rebatch
            loaded_batch, loaded_drop_last = rebatched_worker_size or rebatch, False
        super().__init__(
            dataset, batch_size=loaded_batch, shuffle=bool(shuffle), num_workers=num_workers,
            drop_last=loaded_drop_last, persistent_workers=persistent_workers, **kwargs,
        )  # fmt: skip

    def _rebatched_size(self, drop_last: bool, worker_size: int | None) -> int | None:
        """The combined batch the loader re-cuts the workers' batches into, or None when it does not.

        PopTorch rebatches in `AsyncRebatched` mode, and in `Async` mode with `drop_last=False` (so the
        leftover comes back as one last batch); its workers load `rebatched_worker_size` samples at a time
        (default: the combined batch). Rebatching is what keeps an iterable dataset's samples: each worker's
        incomplete last batch is combined with the others' instead of dropped.
        """
        size = self._combined_batch_size
        rebatch = self._mode == DataLoaderMode.AsyncRebatched or (
            self._mode == DataLoaderMode.Async and not drop_last and size is not None and size > 1
        )
        if not rebatch or size is None:
            return None
        if worker_size is not None and (
            isinstance(worker_size, bool) or not isinstance(worker_size, int) or not 1 <= worker_size <= size
        ):
            raise Error(
                f"The rebatched_worker_size ({worker_size!r}) must be <= to the combined batch size ({size}): the "
                f"workers' batches are combined into batches of {size}. Pass an integer from 1 to {size}, or "
                "leave rebatched_worker_size at None (the combined batch size)."
            )
        return size

    def __len__(self) -> int:
        """Items per epoch: torch's count, or, when rebatching, the combined batches of the dataset's samples
        (the last, smaller one counted when `drop_last=False`)."""
        if self._rebatch is not None:
            return _items_of(len(self.dataset), self._rebatch, self._drop_last_item)
        if self._combine > 1:
            return _items_of(len(self.batch_sampler), self._combine, self._drop_last_item)
        return super().__len__()

    def _batch_sampler_size(self, batch_sampler: Any, batch_size: int | None, shuffle: bool | None,
                            auto_distributed_partitioning: bool) -> int | None:  # fmt: skip
        """PopTorch's checks of a user's `batch_sampler`, and the micro-batch it implies: the sampler's
        `batch_size` when it has one (torch's `BatchSampler` does), else `batch_size` (1 unless given)."""
        if batch_size != 1 or shuffle:
            raise Error(
                "`batch_sampler` option is mutually exclusive with batch_size, shuffle. Got "
                f"batch_size={batch_size!r}, shuffle={shuffle!r}: the batch sampler's batches are the micro-batches "
                "(its batch_size), and it decides the order; leave batch_size and shuffle out (or shuffle inside "
                "the sampler)."
            )
        if _distributed.processes(self._options) > 1 and auto_distributed_partitioning:
            raise Error(
                "`batch_sampler` option is mutually exclusive with auto_distributed_partitioning=True. Pass "
                "auto_distributed_partitioning=False and give each process its own batches (a batch sampler over "
                f"a torch DistributedSampler for process {self._options.Distributed.processId} of "
                f"{self._options.Distributed.numProcesses})."
            )
        return getattr(batch_sampler, "batch_size", batch_size)

    def _check_batch_sampler_length(self, batch_sampler: Any, drop_last: bool) -> None:
        """An `Error` if the sampler (when it has a length) gives fewer batches than one item combines, which
        would yield nothing; PopTorch's warning when its last item will be smaller (`drop_last=False`)."""
        try:
            count = len(batch_sampler)
        except (TypeError, NotImplementedError):
            return
        factor = self._combine
        if count == 0 or (drop_last and count < factor):
            raise Error(
                f"The batch_sampler gives {count} batches, fewer than the {factor} consecutive batches one item "
                "combines (deviceIterations x replicas / input group size x gradientAccumulation): this DataLoader "
                "yields no batch, so a loop over it would run no step. Use fewer device iterations, less "
                "gradient accumulation or fewer replicas, drop_last=False, or a sampler with more batches."
            )
        if not drop_last and count % factor:
            logger.warning(
                "The number of batches generated by the batch sampler (%d) is not divisible by the number of "
                "batches combined per step (%d) and drop_last=False: the last item combines %d of them. Use "
                "drop_last=True to leave them out.", count, factor, count % factor,
            )  # fmt: skip

    def _check_holds_a_combined_batch(
        self, dataset, sampler, batch_size: int, drop_last: bool, shared: bool
    ) -> None:
        """An `Error` now if the data (the sampler's, when one is given) is less than one combined batch
        (none at all with `drop_last=False`): such a loader yields nothing and a training loop over it
        silently does nothing. An iterable dataset has no length: it is checked when iterated."""
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        size, factors = _combined_batch(self._options, batch_size, shared and not iterable)
        batch = f"one combined batch of {size} ({factors})"
        if iterable:
            self._empty_message = _no_batch(
                f"The iterable dataset {type(dataset).__name__} gave fewer samples than {batch}",
                size,
                drop_last,
            )
            return
        counted = dataset if sampler is None else sampler
        if not hasattr(counted, "__len__"):
            return
        count = len(counted)
        if count < size and (drop_last or count == 0):
            what = "The dataset has" if sampler is None else "The sampler draws"
            raise Error(_no_batch(f"{what} {count} samples, fewer than {batch}", size, drop_last))

    def __iter__(self) -> Iterator[Any]:
        """torch's iterator (re-cut into combined batches when rebatching); over an iterable dataset, one that
        raises if it ends before its first batch."""
        iterator = super().__iter__()
        if self._rebatch is not None:
            iterator = _rebatched(iterator, self._rebatch, self._drop_last_item)
        if self._combine > 1:
            iterator = _combined(iterator, self._combine, self._drop_last_item)
        if self._mode != DataLoaderMode.Sync:  # loading ahead in workers: a failing dataset is PopTorch's error
            iterator = worker_failures(iterator, "the DataLoader's workers")
        return iterator if self._empty_message is None else _YieldsAtLeastOne(iterator, self._empty_message)

    @property
    def combinedBatchSize(self) -> int | None:
        """Samples per item: batch_size x DI x (replicas / group size) x GA."""
        return self._combined_batch_size

    @property
    def options(self) -> Options:
        return self._options

    def terminate(self) -> None:
        """Stop the workers (torch stops them when the iterator ends; nothing else to do)."""


# PopTorch's accessor arguments that tune how its worker process fills its ring buffer, with their defaults:
# a thread loads ahead here, so a value given changes nothing, and the accessor says so once.
_WORKER_TUNING = {
    "miss_sleep_time_in_ms": 0.1,
    "load_indefinitely": True,
    "early_preload": False,
    "sharing_strategy": SharingStrategy.FileSystem,
}


class AsynchronousDataAccessor:
    """Loads the next items of `dataset` (a DataLoader or any iterable) ahead, in a background thread.

    PopTorch's accessor runs the loader in a worker process; a `poptorch.DataLoader` with
    `mode=DataLoaderMode.Async` already loads in worker processes, so this accessor only overlaps the
    hand-over with the model's run. With `rebatched_size=N` (over a loader of batch size 1, as PopTorch
    asks) each item is the next N rows, and rows that do not fill a last item are dropped, as PopTorch's
    worker does for a dataset that does not say otherwise (`rebatched_drop_last`).
    """

    def __init__(self, dataset, buffer_size: int = 3, rebatched_size: int | None = None, **tuning: Any):
        unknown = sorted(set(tuning) - set(_WORKER_TUNING))
        if unknown:
            raise TypeError(f"AsynchronousDataAccessor() got unexpected keyword arguments {unknown}.")
        given = [name for name, value in tuning.items() if value != _WORKER_TUNING[name]]
        if given:
            no_effect(
                "AsynchronousDataAccessor's " + ", ".join(given),
                "they tune how PopTorch's worker process fills its ring buffer; here a thread loads the next "
                f"items ahead (buffer_size={buffer_size} of them), and the items are the same.",
            )
        if rebatched_size is not None:
            assert rebatched_size > 1, "rebatched_size must be None or greater than 1"
        self._dataset = dataset
        self._buffer_size = max(1, int(buffer_size))
        self.rebatched_size = rebatched_size

    def __len__(self) -> int:
        if not self.rebatched_size:
            return len(self._dataset)
        rows = len(self._dataset) * (getattr(self._dataset, "batch_size", None) or 1)
        return rows // self.rebatched_size

    def _items(self) -> Iterator[Any]:
        if not self.rebatched_size:
            return iter(self._dataset)
        drop_last = getattr(self._dataset, "rebatched_drop_last", True)
        return _rebatched(iter(self._dataset), self.rebatched_size, drop_last)

    def terminate(self) -> None:
        """Nothing to stop: the thread ends with the iteration."""

    def __iter__(self) -> Iterator[Any]:
        items: queue.Queue = queue.Queue(self._buffer_size)
        end = object()

        def load():
            try:
                for item in self._items():
                    items.put(item)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                items.put(e)
            items.put(end)

        def received() -> Iterator[Any]:
            while (item := items.get()) is not end:
                if isinstance(item, BaseException):
                    raise item
                yield item

        threading.Thread(target=load, daemon=True).start()
        yield from worker_failures(received(), "the AsynchronousDataAccessor")
