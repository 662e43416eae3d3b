"""Combined batches are cut, cast, padded, moved and put back together row for row."""

from __future__ import annotations

import pytest
import torch

from optimum_ipu.runtime.batches import (
    batch_size_of,
    cast_floating,
    concatenate,
    move_to,
    pad_by_repeating,
    slice_batch,
    split_batch,
)


def _batch():
    # A flag and a 0-d tensor are shared by every piece; only tensors with a first dimension are cut.
    return {
        "flag": True,
        "scale": torch.tensor(2.0),
        "ids": torch.arange(6),
        "pixels": torch.arange(12.0).view(6, 2),
    }


def test_batch_size_is_the_first_dimension_of_the_first_batched_tensor():
    assert batch_size_of(_batch()) == 6
    assert batch_size_of({"scale": torch.tensor(1.0), "x": torch.zeros(4, 9), "y": torch.zeros(5)}) == 4
    assert batch_size_of({"labels": torch.zeros(3), "x": torch.zeros(5, 2)}) == 3  # one dimension is enough


def test_a_batch_without_a_batched_tensor_is_refused_with_its_keys():
    with pytest.raises(ValueError, match=r"no tensor with a batch dimension \(keys: \['flag', 'scale'\]\)"):
        batch_size_of({"scale": torch.tensor(1.0), "flag": 1})


def test_split_cuts_batched_tensors_in_order_and_shares_the_rest():
    pieces = split_batch(_batch(), 3)
    assert len(pieces) == 3
    for i, piece in enumerate(pieces):
        assert piece["ids"].tolist() == [2 * i, 2 * i + 1]
        assert piece["pixels"].tolist() == [[4.0 * i, 4.0 * i + 1], [4.0 * i + 2, 4.0 * i + 3]]
        assert piece["flag"] is True and piece["scale"].item() == 2.0


def test_slice_takes_the_rows_of_batched_tensors_and_shares_the_rest():
    piece = slice_batch(_batch(), 1, 4)
    assert piece["ids"].tolist() == [1, 2, 3]
    assert piece["pixels"][:, 0].tolist() == [2.0, 4.0, 6.0]
    assert piece["flag"] is True and piece["scale"].item() == 2.0


def test_cast_changes_floating_tensors_only():
    cast = cast_floating(_batch(), torch.float16)
    assert cast["pixels"].dtype == torch.float16 and cast["scale"].dtype == torch.float16
    assert cast["ids"].dtype == torch.int64 and cast["flag"] is True
    same = {"pixels": torch.ones(2, dtype=torch.float16)}
    assert cast_floating(same, torch.float16)["pixels"] is same["pixels"]  # no copy when already right


def test_padding_repeats_samples_from_the_first_one_up_to_the_size():
    padded = pad_by_repeating(
        {"ids": torch.tensor([10, 11, 12]), "full": torch.arange(7), "scale": torch.tensor(2.0), "n": 3}, 7
    )
    assert padded["ids"].tolist() == [10, 11, 12, 10, 11, 12, 10]
    assert padded["full"].tolist() == list(range(7))
    full = torch.arange(7)
    assert pad_by_repeating({"full": full}, 7)["full"] is full  # a full-size tensor is not copied
    with torch.device("meta"):  # a default device other than the batch's (as when a model runs on a GPU)
        assert pad_by_repeating({"ids": torch.tensor([10, 11], device="cpu")}, 3)["ids"].tolist() == [
            10,
            11,
            10,
        ]
    assert padded["scale"].item() == 2.0 and padded["n"] == 3


def test_move_reaches_tensors_nested_in_tuples_lists_and_dicts():
    value = (torch.ones(2), [torch.zeros(1), {"a": torch.ones(3), "b": "text"}], 5)
    moved = move_to(value, "meta")
    assert isinstance(moved, tuple) and isinstance(moved[1], list) and isinstance(moved[1][1], dict)
    assert moved[0].device.type == moved[1][0].device.type == moved[1][1]["a"].device.type == "meta"
    assert moved[1][1]["a"].shape == (3,) and moved[1][1]["b"] == "text" and moved[2] == 5


def test_concatenate_joins_per_sample_outputs_and_keeps_the_first_of_the_rest():
    logits = [torch.zeros(2, 3), torch.ones(3, 3)]
    losses = [torch.tensor(0.5), torch.tensor(0.7)]
    joined = concatenate([(logits[0], losses[0], "a"), (logits[1], losses[1], "b")], [2, 3])
    assert isinstance(joined, tuple)
    assert torch.equal(joined[0], torch.cat(logits)) and joined[1].item() == 0.5 and joined[2] == "a"
    as_list = concatenate([[logits[0]], [logits[1]]], [2, 3])
    per_sample_values = concatenate([torch.zeros(2), torch.ones(3)], [2, 3])
    assert per_sample_values.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert isinstance(as_list, list) and as_list[0].shape == (5, 3)
    # A first dimension that is not the micro-batch's size (here 3 rows for a micro-batch of 2) is not per sample.
    hidden = [torch.zeros(3, 4), torch.ones(3, 4)]
    assert concatenate(hidden, [2, 3]) is hidden[0]
    mixed = [torch.zeros(2), torch.tensor(1.0)]  # a later piece without a batch dimension
    assert concatenate(mixed, [2, 1]) is mixed[0]
