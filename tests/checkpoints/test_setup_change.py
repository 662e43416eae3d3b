"""Resuming with a changed setup: which differences are named, how steps convert to samples, another model.

Unit tests of optimum_ipu/checkpoints/setup_change.py on checkpoint folders that hold only what it
reads (`ipu_config.json`, `trainer_state.json`, a safetensors header); the numbers are worked by
hand. The trainer-level behaviour (the error, the info line, the converted step) is in
tests/checkpoints/test_trainer_hooks.py and end to end in tests/test_checkpoints.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from optimum_ipu import IPUConfig
from optimum_ipu.checkpoints import SetupChange, compare_setup
from optimum_ipu.checkpoints.setup_change import BATCH_FIELDS, check_same_model


def saved(folder: Path, ipu_config: IPUConfig | dict | None, state: dict) -> Path:
    """A checkpoint folder with the given `ipu_config.json` (a config, raw JSON fields, or none)."""
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(ipu_config, IPUConfig):
        ipu_config.save_pretrained(folder)
    elif ipu_config is not None:
        (folder / "ipu_config.json").write_text(json.dumps(ipu_config))
    (folder / "trainer_state.json").write_text(json.dumps(state))
    return folder


# -- SetupChange: steps and samples -------------------------------------------------------------------------


def test_the_resumed_step_is_the_one_that_has_consumed_the_same_samples():
    change = SetupChange("ckpt", saved_step=6, saved_combined_batch=8, combined_batch=12)
    assert change.samples_seen == 48
    assert change.resumed_step == 4  # 48 / 12
    assert (
        SetupChange("c", saved_step=5, saved_combined_batch=8, combined_batch=12).resumed_step == 3
    )  # 40 // 12
    assert SetupChange("c", saved_step=7, saved_combined_batch=8, combined_batch=0).resumed_step == 7


def test_the_batch_message_names_the_fields_the_samples_and_the_new_step():
    change = SetupChange("out/checkpoint-6", batch={"gradient_accumulation_steps": (4, 6)}, saved_step=6,
                         saved_combined_batch=8, combined_batch=12)  # fmt: skip
    assert change.batch_message() == (
        "out/checkpoint-6 was written with a different batch arithmetic (gradient_accumulation_steps 4 -> 6): "
        "combined batch 8 -> 12. Its 6 steps consumed 48 samples, so training continues at step 4 of the new "
        "setup (epochs, data position and learning-rate schedule follow the samples)"
    )


def test_samples_that_do_not_fill_a_new_step_are_said_to_be_trained_again():
    change = SetupChange("c", batch={"per_device_train_batch_size": (1, 3), "replication_factor": (2, 4)},
                         saved_step=5, saved_combined_batch=8, combined_batch=12)  # fmt: skip
    message = change.batch_message()
    assert "(per_device_train_batch_size 1 -> 3, replication_factor 2 -> 4)" in message
    assert message.endswith(
        "continues at step 3 of the new setup (epochs, data position and learning-rate "
        "schedule follow the samples; the last 4 of them are trained again)"
    )  # 40 - 3 x 12


# -- compare_setup --------------------------------------------------------------------------------------------


def test_a_checkpoint_without_an_ipu_config_has_nothing_to_compare(tmp_path):
    folder = saved(tmp_path / "c", None, {"global_step": 3})
    assert compare_setup(folder, IPUConfig(), 2) is None


def test_an_unreadable_ipu_config_is_named_with_the_fix(tmp_path):
    folder = saved(tmp_path / "c", None, {"global_step": 3})
    (folder / "ipu_config.json").write_text("{cut")
    with pytest.raises(ValueError) as error:
        compare_setup(folder, IPUConfig(), 2)
    message = str(error.value)
    assert message.startswith(f"{folder / 'ipu_config.json'} is not valid JSON (")
    assert message.endswith("); restore it from the run's output folder or delete the checkpoint.")
    assert error.value.__cause__ is None and error.value.__suppress_context__


def test_the_same_setup_is_no_change(tmp_path):
    config = IPUConfig(layers_per_ipu=[1, 1], gradient_accumulation_steps=4, replication_factor=2)
    folder = saved(tmp_path / "c", config, {"global_step": 3, "train_batch_size": 16})
    change = compare_setup(str(folder), config.copy(), 2)
    assert change == SetupChange(
        str(folder), {}, {}, saved_step=3, saved_combined_batch=16, combined_batch=16
    )


def test_a_layout_change_is_not_a_batch_change(tmp_path):
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=4)
    folder = saved(tmp_path / "c", config, {"global_step": 2, "train_batch_size": 8})
    now = IPUConfig(layers_per_ipu=[1, 1], matmul_proportion=0.3, recompute_checkpoint_every_layer=True,
                    gradient_accumulation_steps=4)  # fmt: skip
    change = compare_setup(folder, now, 2)
    assert change.batch == {}
    assert change.layout == {"layers_per_ipu": ([-1], [1, 1]), "matmul_proportion": (0.2, 0.3),
                             "recompute_checkpoint_every_layer": (False, True)}  # fmt: skip
    assert list(change.layout) == ["layers_per_ipu", "matmul_proportion", "recompute_checkpoint_every_layer"]


def test_each_batch_field_is_a_batch_change_with_its_values(tmp_path):
    config = IPUConfig(gradient_accumulation_steps=4, replication_factor=2, device_iterations=1)
    folder = saved(tmp_path / "c", config, {"global_step": 5, "train_batch_size": 16})  # micro-batch 2
    now = IPUConfig(gradient_accumulation_steps=8, replication_factor=1, device_iterations=3)
    change = compare_setup(folder, now, 1)
    assert change.batch == {"per_device_train_batch_size": (2, 1), "gradient_accumulation_steps": (4, 8),
                            "replication_factor": (2, 1), "device_iterations": (1, 3)}  # fmt: skip
    assert list(change.batch) == list(BATCH_FIELDS)  # in the order of a batch's arithmetic
    assert change.layout == {}
    assert (change.saved_step, change.saved_combined_batch, change.combined_batch) == (5, 16, 24)


def test_inference_values_the_seed_and_the_cache_are_not_compared(tmp_path):
    config = IPUConfig(gradient_accumulation_steps=2)
    folder = saved(tmp_path / "c", config, {"global_step": 1, "train_batch_size": 4})
    now = IPUConfig(gradient_accumulation_steps=2, inference_device_iterations=8, inference_replication_factor=2,
                    inference_layers_per_ipu=[1, 1], seed=42, executable_cache_dir=str(tmp_path / "cache"))  # fmt: skip
    now.eval()  # the trainer may be between evaluations: training values are compared all the same
    change = compare_setup(folder, now, 2)
    assert (change.batch, change.layout) == ({}, {})


def test_the_saved_micro_batch_comes_from_the_saved_combined_batch(tmp_path):
    # 24 samples per step over GA 3 x replicas 2 x device iterations 2 = micro-batch 2.
    config = IPUConfig(gradient_accumulation_steps=3, replication_factor=2, device_iterations=2)
    folder = saved(tmp_path / "c", config, {"global_step": 4, "train_batch_size": 24})
    assert compare_setup(folder, config, 2).batch == {}
    assert compare_setup(folder, config, 3).batch == {"per_device_train_batch_size": (2, 3)}


def test_a_state_without_a_batch_size_is_taken_as_the_current_micro_batch(tmp_path):
    # No train_batch_size (an older transformers): the saved combined batch is the saved factor x this micro-batch.
    folder = saved(tmp_path / "c", IPUConfig(gradient_accumulation_steps=3), {"global_step": 4})
    change = compare_setup(folder, IPUConfig(gradient_accumulation_steps=3), 5)
    assert (change.batch, change.saved_combined_batch, change.saved_step) == ({}, 15, 4)
    change = compare_setup(folder, IPUConfig(gradient_accumulation_steps=6), 5)
    assert change.batch == {"gradient_accumulation_steps": (3, 6)}
    assert (change.saved_combined_batch, change.combined_batch, change.resumed_step) == (15, 30, 2)


def test_a_saved_combined_batch_below_the_factor_counts_as_micro_batch_1(tmp_path):
    folder = saved(
        tmp_path / "c", IPUConfig(gradient_accumulation_steps=4), {"global_step": 1, "train_batch_size": 2}
    )
    assert compare_setup(folder, IPUConfig(gradient_accumulation_steps=4), 1).batch == {}


def test_fields_missing_from_an_older_ipu_config_take_their_defaults(tmp_path):
    # ipus_per_replica missing (or null) is derived from layers_per_ipu as IPUConfig derives it on loading.
    folder = saved(tmp_path / "c", {"gradient_accumulation_steps": 2, "layers_per_ipu": [-1]},
                   {"global_step": 2, "train_batch_size": 4})  # fmt: skip
    loaded = IPUConfig.from_pretrained(str(folder))
    assert (loaded.ipus_per_replica, loaded.matmul_proportion) == (1, 0.2)
    change = compare_setup(folder, IPUConfig(gradient_accumulation_steps=2), 2)
    assert (change.batch, change.layout) == ({}, {})
    two = saved(tmp_path / "two", {"layers_per_ipu": [1, 1], "ipus_per_replica": None}, {"global_step": 2})
    assert compare_setup(two, IPUConfig(layers_per_ipu=[1, 1]), 2).layout == {}
    assert compare_setup(two, IPUConfig(layers_per_ipu=[2]), 2).layout == {"layers_per_ipu": ([1, 1], [2]),
                                                                           "ipus_per_replica": (2, 1)}  # fmt: skip
    change = compare_setup(folder, IPUConfig(gradient_accumulation_steps=2, replication_factor=2), 2)
    assert change.batch == {"replication_factor": (1, 2)}
    assert change.saved_step == 2


def test_a_state_without_a_step_is_step_0(tmp_path):
    folder = saved(tmp_path / "c", IPUConfig(), {"train_batch_size": 2})
    assert compare_setup(folder, IPUConfig(), 2).saved_step == 0


# -- check_same_model ---------------------------------------------------------------------------------------


def _weights_of(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def test_a_checkpoint_of_the_same_model_passes(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    check_same_model(_weights_of(tmp_path / "c", model.state_dict()), model)
    check_same_model(tmp_path / "no-weights", model)  # nothing to compare: transformers decides


def test_a_checkpoint_sharing_some_names_and_shapes_passes(tmp_path):
    # An adapter or a head added later: the shared tensors fit, the rest is transformers' business.
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    folder = _weights_of(tmp_path / "c", {"0.weight": torch.zeros(4, 3), "extra": torch.zeros(1)})
    check_same_model(folder, model)


def test_another_models_shapes_are_named_three_at_most(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    other = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Linear(6, 7))
    folder = _weights_of(tmp_path / "c", other.state_dict())
    with pytest.raises(ValueError) as error:
        check_same_model(folder, model)
    assert str(error.value) == (
        f"{folder} holds the weights of another model: 0.bias [6] in the checkpoint vs [4] in the model; "
        "0.weight [6, 5] in the checkpoint vs [4, 3] in the model; 1.bias [7] in the checkpoint vs [2] in the model. "
        "Resume from a checkpoint of this model (the same --model_name_or_path and config), or use another "
        "--output_dir."
    )


def test_one_mismatched_shape_among_matching_names_is_enough(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    tensors = dict(model.state_dict())
    tensors["1.bias"] = torch.zeros(3)
    with pytest.raises(
        ValueError, match=r"another model: 1.bias \[3\] in the checkpoint vs \[2\] in the model\. "
    ):
        check_same_model(_weights_of(tmp_path / "c", tensors), model)


def test_a_checkpoint_with_no_name_of_the_model_is_another_model(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))  # two of its four names shown
    folder = _weights_of(tmp_path / "c", {"encoder.w": torch.zeros(2), "decoder.w": torch.zeros(2),
                                          "head.w": torch.zeros(1)})  # fmt: skip
    with pytest.raises(ValueError) as error:
        check_same_model(str(folder), model)
    assert str(error.value).startswith(
        f"{folder} holds the weights of another model: none of its 3 tensor names is one of the model's "
        "(e.g. ['decoder.w', 'encoder.w'] vs ['0.bias', '0.weight']). Resume from a checkpoint of this model"
    )
