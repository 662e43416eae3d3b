"""Seed 004's program ("Intro to PopTorch", MNIST) runs unchanged: examples/poptorch/mnist_poptorch.py
has its structure (Network, TrainingModelWithLoss, the same PopTorch calls in the same places), run
here on generated MNIST-shaped data; its test accuracy must rise far above chance (10%)."""

import torch
from fixtures import EXAMPLES_DIR, use_example

import poptorch

use_example(EXAMPLES_DIR / "poptorch")
import mnist_poptorch  # noqa: E402


def test_the_seed_program_learns(capsys):
    # At the tutorial's sizes one epoch of 1600 samples (200 updates) ends at 78-81 % depending on the
    # thread count; two epochs reach 90-96 %.
    accuracy = mnist_poptorch.main(
        ["--epochs", "2", "--device-iterations", "10", "--train-samples", "1600", "--test-samples", "400"]
    )
    assert accuracy > 80.0
    assert "Accuracy on test set" in capsys.readouterr().out


def test_dataloader_yields_combined_batches():
    opts = poptorch.Options().deviceIterations(5).replicationFactor(2)
    opts.Training.gradientAccumulation(3)
    data = mnist_poptorch.synthetic_mnist(100, seed=0)
    loader = poptorch.DataLoader(opts, data, batch_size=3)
    assert loader.combinedBatchSize == 90
    assert len(loader) == 1  # drop_last=True is PopTorch's default
    images, labels = next(iter(loader))
    assert images.shape == (90, 1, 28, 28) and labels.shape == (90,)
    rest = poptorch.DataLoader(opts, data, batch_size=3, drop_last=False)
    assert [len(y) for _, y in rest] == [90, 10]


def test_async_loader_gives_the_same_batches():
    opts = poptorch.Options().deviceIterations(2)
    data = mnist_poptorch.synthetic_mnist(40, seed=0)
    sync = [y for _, y in poptorch.DataLoader(opts, data, batch_size=4)]
    asynchronous = [
        y for _, y in poptorch.DataLoader(opts, data, batch_size=4, mode=poptorch.DataLoaderMode.Async)
    ]
    accessor = [
        y for _, y in poptorch.AsynchronousDataAccessor(poptorch.DataLoader(opts, data, batch_size=4))
    ]
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(sync, asynchronous, accessor))
    assert len(sync) == len(asynchronous) == len(accessor) == 5


def test_a_mode_that_is_not_a_dataloader_mode_loads_synchronously_as_on_poptorch(caplog):
    """PopTorch compares `mode` with the enum's members, so a string ("async_rebatched", as Graphcore's
    packed-BERT notebooks pass) loads synchronously there; here too, said once per value."""
    opts = poptorch.Options().deviceIterations(2)
    data = mnist_poptorch.synthetic_mnist(40, seed=0)
    sync = [y for _, y in poptorch.DataLoader(opts, data, batch_size=4)]
    with caplog.at_level("WARNING"):
        loaders = [poptorch.DataLoader(opts, data, batch_size=4, mode="async_rebatched") for _ in range(2)]
    assert all(loader._mode == poptorch.DataLoaderMode.Sync for loader in loaders)
    assert all(torch.equal(a, b) for a, b in zip(sync, [y for _, y in loaders[0]], strict=True))
    said = [r.getMessage() for r in caplog.records if "mode='async_rebatched'" in r.getMessage()]
    assert len(said) == 1 and "DataLoaderMode.AsyncRebatched" in said[0]
