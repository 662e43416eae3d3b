"""The host call's arithmetic, in its one home (`optimum_ipu.call_layout`): hand-worked numbers."""

from __future__ import annotations

import re

import pytest

from optimum_ipu.call_layout import CallLayout, InvalidBatchError, replicas_of_process
from optimum_ipu.configuration import IPUConfig


def test_a_combined_batch_splits_into_di_x_replicas_x_ga_micro_batches():
    layout = CallLayout(device_iterations=2, replication_factor=2, gradient_accumulation_steps=3)
    assert layout.micro_batches == 12
    assert layout.combined_batch(4) == 48
    assert layout.micro_batch_size(48) == 4
    assert type(layout.micro_batch_size(48)) is int  # a size to cut tensors with, not 4.0
    assert CallLayout(1, 1, 12).micro_batch_size(12) == 1
    message = (
        "Invalid batch dimension: the combined batch of 36 samples is not a multiple of device_iterations (2) x "
        "replicas (2) x gradient_accumulation_steps (4) = 16. Feed combined batches of micro_batch_size x 16 "
        "samples (IPUTrainer's data loaders do)."
    )
    with pytest.raises(InvalidBatchError, match="^" + re.escape(message) + "$"):
        CallLayout(2, 2, 4).micro_batch_size(36)
    with pytest.raises(InvalidBatchError, match="the combined batch of 0 samples"):
        CallLayout(2, 2, 4).micro_batch_size(0)  # a multiple of 16, but no micro-batch


def test_an_update_divides_by_replicas_x_accumulation_for_the_mean_and_by_one_for_the_sum():
    layout = CallLayout(device_iterations=5, replication_factor=4, gradient_accumulation_steps=3)
    assert layout.micro_batches_per_update == 12
    assert layout.gradient_divisor("mean") == 12
    assert layout.gradient_divisor("sum") == 1
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum', got 'max'"):
        layout.gradient_divisor("max")


def test_micro_batches_are_laid_out_iteration_then_replica_then_accumulation_step():
    layout = CallLayout(device_iterations=2, replication_factor=3, gradient_accumulation_steps=4)
    # [d][r][g]: iteration 1, replica 2 starts after 1 x 3 x 4 + 2 x 4 micro-batches
    assert layout.first_micro_batch(1, 2) == 20
    assert [layout.first_micro_batch(0, r) for r in range(3)] == [0, 4, 8]
    # PopTorch's order, [d][g][r]: iteration 1, step 3, replica 2 comes after 1 x 4 x 3 + 3 x 3 micro-batches
    assert layout.poptorch_index(1, 3, 2) == 23
    assert [layout.poptorch_index(0, 0, r) for r in range(3)] == [0, 1, 2]


def test_processes_take_consecutive_slices_of_the_replicas():
    assert [replicas_of_process(4, 2, k) for k in (0, 1)] == [range(0, 2), range(2, 4)]
    assert [replicas_of_process(6, 3, k) for k in (0, 1, 2)] == [range(0, 2), range(2, 4), range(4, 6)]
    assert replicas_of_process(3, 1, 0) == range(0, 3)
    with pytest.raises(ValueError, match="3 processes cannot share replication_factor=4 out"):
        replicas_of_process(4, 3, 0)
    with pytest.raises(ValueError, match="process index 2 is outside 0..1"):
        replicas_of_process(4, 2, 2)


def test_an_ipu_config_gives_its_training_and_inference_calls_whatever_its_mode():
    config = IPUConfig(device_iterations=3, replication_factor=2, gradient_accumulation_steps=5,
                       inference_device_iterations=7, inference_replication_factor=4)  # fmt: skip
    for mode_config in (config.train(), config.eval()):
        assert CallLayout.from_ipu_config(mode_config) == CallLayout(3, 2, 5)
        assert CallLayout.from_ipu_config(mode_config, for_inference=True) == CallLayout(7, 4, 1)
    assert config.batch_size_factor() == 30
    assert config.batch_size_factor(for_inference=True) == 28


def test_a_layout_refuses_counts_below_one():
    for bad in (0, -1, True, 1.0):
        with pytest.raises(ValueError, match="CallLayout.device_iterations must be an integer >= 1"):
            CallLayout(device_iterations=bad)
