"""`optimum.graphcore.data.pad_on_batch_axis` and `optimum.graphcore.utils.check_min_version`
(optimum_ipu/compat/data.py, versions.py)."""

import pytest
import torch

from optimum.graphcore.data import pad_on_batch_axis
from optimum.graphcore.utils import check_min_version


def collate(rows):
    return {"x": torch.tensor(rows), "ids": torch.tensor(rows) * 10, "name": "kept"}


def test_pad_on_batch_axis_repeats_samples_to_a_fixed_batch():
    padded = pad_on_batch_axis(5)(collate)
    batch = padded([1, 2])
    assert batch["x"].tolist() == [1, 2, 1, 2, 1] and batch["ids"].tolist() == [10, 20, 10, 20, 10]
    assert batch["name"] == "kept" and padded.__name__ == "collate"
    assert padded([1, 2, 3, 4, 5])["x"].tolist() == [1, 2, 3, 4, 5]
    assert padded([1, 2, 3, 4, 5, 6])["x"].tolist() == [1, 2, 3, 4, 5]  # a longer batch is cut to size
    with pytest.raises(ValueError, match="batch_size >= 1"):
        pad_on_batch_axis(0)


def test_check_min_version_compares_with_the_optimum_graphcore_api_provided():
    check_min_version("0.6.0.dev0")  # what the original example scripts ask for
    check_min_version("0.7.1")
    with pytest.raises(ImportError, match="API of Optimum Graphcore 0.7.1"):
        check_min_version("0.8.0")
