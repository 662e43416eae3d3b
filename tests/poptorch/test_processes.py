"""Under torchrun the replicas are shared out over the processes (the launch itself: tests/distributed)."""

import pytest
import torch

import poptorch


def options(process: int, processes: int, replicas: int = 2) -> poptorch.Options:
    opts = poptorch.Options().deviceIterations(2).replicationFactor(replicas)
    opts.Training.gradientAccumulation(3)
    opts.Distributed.configureProcessId(process, processes)
    return opts


def test_each_process_is_handed_its_replicas_part_of_every_combined_batch():
    dataset = torch.utils.data.TensorDataset(torch.arange(96.0))
    whole = next(iter(poptorch.DataLoader(options(0, 1), dataset, batch_size=4)))[0]  # [DI][GA][R][micro]
    layout = whole.reshape(2, 3, 2, 4)
    for process in (0, 1):
        loader = poptorch.DataLoader(options(process, 2), dataset, batch_size=4)
        assert loader.combinedBatchSize == 4 * 2 * 3 and len(loader) == 2
        torch.testing.assert_close(next(iter(loader))[0], layout[:, :, process].reshape(-1))


def test_replicas_that_the_processes_cannot_share_are_an_error_naming_both():
    with pytest.raises(poptorch.Error, match=r"replicationFactor\(3\) cannot be shared by the 2 processes"):
        poptorch.trainingModel(torch.nn.Linear(2, 2), options(0, 2, replicas=3))
