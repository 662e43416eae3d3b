"""IPUConfig: defaults, derived defaults, modes, validation, overrides, files and legacy files."""

import copy
import json
import logging
import pickle

import pytest

from optimum_ipu.configuration import CONFIG_NAME, IPUConfig, IPUConfigError

# ----- helpers -----------------------------------------------------------------------------------


def _warnings(caplog):
    return [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("optimum_ipu")]


def _write(tmp_path, values, name=CONFIG_NAME):
    path = tmp_path / name
    path.write_text(json.dumps(values))
    return path


# ----- defaults ----------------------------------------------------------------------------------

SECTION_1_DEFAULTS = {
    "replication_factor": 1,
    "inference_replication_factor": 1,
    "gradient_accumulation_steps": 1,
    "layers_per_ipu": [-1],
    "inference_layers_per_ipu": [-1],
    "ipus_per_replica": 1,
    "inference_ipus_per_replica": 1,
    "optimizer_state_offchip": False,
    "replicated_tensor_sharding": False,
    "matmul_proportion": 0.2,
    "inference_matmul_proportion": 0.2,
    "enable_half_partials": True,
    "embedding_serialization_factor": 1,
    "inference_embedding_serialization_factor": 1,
    "serialized_embedding_splits_per_ipu": None,
    "inference_serialized_embedding_splits_per_ipu": None,
    "projection_serialization_factor": 1,
    "inference_projection_serialization_factor": 1,
    "serialized_projection_splits_per_ipu": None,
    "inference_serialized_projection_splits_per_ipu": None,
    "recompute_checkpoint_every_layer": False,
    "device_iterations": 1,
    "inference_device_iterations": 1,
    "output_mode": "final",
    "seed": None,
    "auto_loss_scaling": False,
    "executable_cache_dir": "",
    "parallelize_kwargs": {},
    "inference_parallelize_kwargs": {},
    "explicit_ir_inference": False,
}


def test_defaults_are_those_of_section_1():
    assert IPUConfig().to_dict() == SECTION_1_DEFAULTS


def test_a_new_config_is_in_training_mode():
    assert IPUConfig().mode == "training"


# ----- derived defaults --------------------------------------------------------------------------


def test_ipus_per_replica_is_the_length_of_layers_per_ipu():
    config = IPUConfig(layers_per_ipu=[0, 4, 4, 4])
    assert config.ipus_per_replica == 4
    assert config.inference_layers_per_ipu == [0, 4, 4, 4]
    assert config.inference_ipus_per_replica == 4


def test_inference_ipus_follow_given_inference_layers():
    config = IPUConfig(layers_per_ipu=[0, 4, 4, 4], inference_layers_per_ipu=[6, 6])
    assert config.inference_ipus_per_replica == 2


def test_inference_ipus_follow_ipus_per_replica_when_it_is_not_the_layer_count():
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=4)
    assert config.inference_layers_per_ipu == [-1]
    assert config.inference_ipus_per_replica == 4


def test_inference_ipus_given_explicitly_win():
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=4, inference_ipus_per_replica=2)
    assert config.inference_ipus_per_replica == 2


def test_copied_inference_layers_of_the_wrong_length_become_a_wildcard():
    config = IPUConfig(layers_per_ipu=[0, 4, 4, 4], inference_ipus_per_replica=2)
    assert config.inference_layers_per_ipu == [-1]


def test_inference_matmul_proportion_copies_the_training_value():
    assert IPUConfig(matmul_proportion=0.3).inference_matmul_proportion == 0.3
    listed = IPUConfig(layers_per_ipu=[1, 1], matmul_proportion=[0.1, 0.2])
    assert listed.inference_matmul_proportion == [0.1, 0.2]


def test_inference_matmul_proportion_falls_back_to_0_2_for_a_list_of_the_wrong_length():
    config = IPUConfig(
        layers_per_ipu=[0, 4, 4, 4], matmul_proportion=[0.1, 0.2, 0.3, 0.3], inference_layers_per_ipu=[6, 6]
    )
    assert config.inference_matmul_proportion == 0.2


def test_inference_serialization_copies_training_settings():
    config = IPUConfig(
        layers_per_ipu=[0, 8, 8, 0],
        serialized_embedding_splits_per_ipu=[4, 4, 0, 0],
        projection_serialization_factor=4,
    )
    assert config.inference_serialized_embedding_splits_per_ipu == [4, 4, 0, 0]
    assert config.inference_embedding_serialization_factor == 1
    assert config.inference_projection_serialization_factor == 4


def test_inference_splits_of_the_wrong_length_are_dropped():
    config = IPUConfig(
        layers_per_ipu=[0, 8, 8, 0],
        serialized_embedding_splits_per_ipu=[4, 4, 0, 0],
        inference_layers_per_ipu=[8, 8],
    )
    assert config.inference_serialized_embedding_splits_per_ipu is None
    assert config.inference_embedding_serialization_factor == 1


def test_overrides_rederive_defaults():
    config = IPUConfig.from_dict({"layers_per_ipu": [0, 4, 4, 4]}, layers_per_ipu=[6, 6])
    assert config.ipus_per_replica == 2
    assert config.inference_layers_per_ipu == [6, 6]
    assert config.inference_ipus_per_replica == 2


def test_setting_a_derived_value_to_none_derives_it_again():
    config = IPUConfig(matmul_proportion=0.3, inference_matmul_proportion=0.6)
    config.update(inference_matmul_proportion=None)
    assert config.inference_matmul_proportion == 0.3


# ----- modes -------------------------------------------------------------------------------------


def _two_mode_config():
    return IPUConfig(
        layers_per_ipu=[0, 4, 4, 4],
        inference_layers_per_ipu=[6, 6],
        matmul_proportion=[0.1, 0.2, 0.3, 0.3],
        inference_matmul_proportion=0.5,
        replication_factor=2,
        inference_replication_factor=4,
        device_iterations=3,
        inference_device_iterations=5,
        embedding_serialization_factor=2,
        inference_embedding_serialization_factor=4,
        serialized_projection_splits_per_ipu=[1, 1, 0, 0],
        inference_serialized_projection_splits_per_ipu=[0, 2],
        parallelize_kwargs={"a": 1},
        inference_parallelize_kwargs={"b": 2},
        gradient_accumulation_steps=8,
    )


def test_eval_reads_the_inference_values_and_train_switches_back():
    config = _two_mode_config()
    assert config.eval() is config and config.mode == "inference"
    assert config.layers_per_ipu == [6, 6]
    assert config.ipus_per_replica == 2
    assert config.matmul_proportion == 0.5
    assert config.replication_factor == 4
    assert config.device_iterations == 5
    assert config.embedding_serialization_factor == 4
    assert config.serialized_embedding_splits_per_ipu is None
    assert config.projection_serialization_factor == 1
    assert config.serialized_projection_splits_per_ipu == [0, 2]
    assert config.parallelize_kwargs == {"b": 2}
    assert config.gradient_accumulation_steps == 8  # not mode-managed
    assert config.train() is config and config.mode == "training"
    assert config.layers_per_ipu == [0, 4, 4, 4]
    assert config.replication_factor == 2
    assert config.parallelize_kwargs == {"a": 1}


def test_assigning_in_inference_mode_sets_the_inference_twin():
    config = IPUConfig().eval()
    config.device_iterations = 7
    assert config.inference_device_iterations == 7
    assert config.train().device_iterations == 1


def test_mode_does_not_change_the_dict():
    config = _two_mode_config()
    assert config.copy().eval().to_dict() == config.to_dict()


def test_unknown_attribute_assignment_is_an_error():
    with pytest.raises(
        AttributeError, match=r"gradient_accumulation_step.*did you mean `gradient_accumulation_steps`"
    ):
        IPUConfig().gradient_accumulation_step = 4


# ----- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "attribute"),
    [
        ({"replication_factor": 0}, "replication_factor"),
        ({"inference_replication_factor": 0}, "inference_replication_factor"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
        ({"gradient_accumulation_steps": 1.5}, "gradient_accumulation_steps"),
        ({"ipus_per_replica": 0}, "ipus_per_replica"),
        ({"inference_ipus_per_replica": -1}, "inference_ipus_per_replica"),
        ({"device_iterations": 0}, "device_iterations"),
        ({"inference_device_iterations": 0}, "inference_device_iterations"),
        ({"embedding_serialization_factor": 0}, "embedding_serialization_factor"),
        ({"inference_embedding_serialization_factor": 0}, "inference_embedding_serialization_factor"),
        ({"projection_serialization_factor": 0}, "projection_serialization_factor"),
        ({"layers_per_ipu": [-2, 4]}, "layers_per_ipu"),
        ({"layers_per_ipu": []}, "layers_per_ipu"),
        ({"layers_per_ipu": 4}, "layers_per_ipu"),
        ({"inference_layers_per_ipu": [1, -3]}, "inference_layers_per_ipu"),
        ({"matmul_proportion": -0.1}, "matmul_proportion"),
        ({"matmul_proportion": "high"}, "matmul_proportion"),
        ({"layers_per_ipu": [1, 1], "matmul_proportion": [0.1, -0.2]}, "matmul_proportion"),
        ({"inference_matmul_proportion": -1}, "inference_matmul_proportion"),
        ({"output_mode": "last"}, "output_mode"),
        ({"optimizer_state_offchip": "yes"}, "optimizer_state_offchip"),
        ({"seed": "42"}, "seed"),
        ({"executable_cache_dir": 3}, "executable_cache_dir"),
        ({"parallelize_kwargs": [1]}, "parallelize_kwargs"),
        ({"serialized_embedding_splits_per_ipu": [1, -1]}, "serialized_embedding_splits_per_ipu"),
    ],
)
def test_invalid_values_name_the_attribute_and_the_value(kwargs, attribute):
    with pytest.raises(IPUConfigError) as raised:
        IPUConfig(**kwargs)
    message = str(raised.value)
    assert f"`{attribute}`" in message
    assert repr(kwargs[attribute]) in message


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        # a matmul_proportion list has one value per IPU
        (
            {"layers_per_ipu": [0, 4, 4, 4], "matmul_proportion": [0.1, 0.2]},
            r"`matmul_proportion` has 2 entries .* `ipus_per_replica` is 4",
        ),
        (
            {"inference_layers_per_ipu": [6, 6], "inference_matmul_proportion": [0.1, 0.2, 0.3]},
            r"`inference_matmul_proportion` has 3 entries",
        ),
        # layers_per_ipu without wildcard has one entry per IPU; a mixed list too (placement needs it)
        (
            {"layers_per_ipu": [4, 4], "ipus_per_replica": 4},
            r"`layers_per_ipu` has 2 entries .* `ipus_per_replica` is 4",
        ),
        ({"layers_per_ipu": [-1, 4], "ipus_per_replica": 4}, r"`layers_per_ipu` has 2 entries"),
        (
            {"inference_layers_per_ipu": [4, 4], "inference_ipus_per_replica": 4},
            r"`inference_layers_per_ipu` has 2",
        ),
        # split lists: one entry per IPU, consecutive non-zero entries, sum >= 1, not with a factor > 1
        (
            {"layers_per_ipu": [0, 4, 4, 4], "serialized_embedding_splits_per_ipu": [2, 2]},
            r"`serialized_embedding_splits_per_ipu` has 2 entries",
        ),
        (
            {"layers_per_ipu": [0, 4, 4, 4], "serialized_embedding_splits_per_ipu": [2, 0, 2, 0]},
            r"consecutive IPUs",
        ),
        (
            {"layers_per_ipu": [0, 4, 4, 4], "serialized_projection_splits_per_ipu": [0, 0, 0, 0]},
            r"sum must be >= 1",
        ),
        (
            {
                "layers_per_ipu": [0, 4, 4, 4],
                "embedding_serialization_factor": 2,
                "serialized_embedding_splits_per_ipu": [1, 1, 0, 0],
            },
            r"`embedding_serialization_factor`=2 and `serialized_embedding_splits_per_ipu`=\[1, 1, 0, 0\] are alternatives",
        ),
        (
            {"inference_layers_per_ipu": [3, 3], "inference_serialized_projection_splits_per_ipu": [1]},
            r"`inference_serialized_projection_splits_per_ipu` has 1",
        ),
        # both alternatives given is the first thing said, even when the splits' length is wrong too
        (
            {"embedding_serialization_factor": 2, "serialized_embedding_splits_per_ipu": [1, 1]},
            r"are alternatives",
        ),
    ],
)
def test_cross_field_rules(kwargs, pattern):
    with pytest.raises(IPUConfigError, match=pattern):
        IPUConfig(**kwargs)


def test_an_all_wildcard_list_of_any_length_is_allowed():
    assert IPUConfig(layers_per_ipu=[-1, -1], ipus_per_replica=4).ipus_per_replica == 4
    assert IPUConfig(layers_per_ipu=[-1, -1, -1]).ipus_per_replica == 3
    assert IPUConfig(layers_per_ipu=[-1], ipus_per_replica=8).layers_per_ipu == [-1]


def test_errors_are_value_errors():
    assert issubclass(IPUConfigError, ValueError)


def test_validate_catches_direct_assignments_that_disagree():
    config = IPUConfig()
    config.layers_per_ipu = [2, 2]  # one value at a time is accepted: ipus_per_replica may come next
    with pytest.raises(IPUConfigError, match=r"`layers_per_ipu` has 2 entries .* `ipus_per_replica` is 1"):
        config.validate()
    config.ipus_per_replica = 2
    config.validate()


def test_update_is_all_or_nothing():
    config = IPUConfig(layers_per_ipu=[0, 4, 4, 4])
    before = config.to_dict()
    with pytest.raises(IPUConfigError, match="matmul_proportion"):
        config.update(gradient_accumulation_steps=8, matmul_proportion=[0.1, 0.2])
    assert config.to_dict() == before
    with pytest.raises(IPUConfigError, match=r"`gradient_acumulation_steps` \(did you mean"):
        config.update(gradient_acumulation_steps=8)


def test_overrides_rerun_the_cross_field_checks():
    with pytest.raises(IPUConfigError, match="matmul_proportion"):
        IPUConfig.from_dict(
            {"layers_per_ipu": [3, 7, 7, 7], "matmul_proportion": [0.1, 0.2, 0.3, 0.3]},
            layers_per_ipu=[12, 12],
        )


# ----- batch arithmetic --------------------------------------------------------------------------


def test_batch_size_factor_in_both_modes():
    config = _two_mode_config()
    assert config.batch_size_factor() == 2 * 8 * 3
    assert config.batch_size_factor(for_inference=True) == 4 * 5
    assert config.eval().batch_size_factor() == 2 * 8 * 3  # independent of the mode


def test_describe_combined_batch():
    config = _two_mode_config()
    assert config.describe_combined_batch(2) == (
        "micro-batch 2 × gradient accumulation 8 × replicas 2 × device iterations 3 = 96"
    )
    assert (
        config.describe_combined_batch(2, for_inference=True)
        == "micro-batch 2 × replicas 4 × device iterations 5 = 40"
    )
    assert config.num_ipus() == 8 and config.num_ipus(for_inference=True) == 8


def test_for_n_ipu_fills_the_pod_with_replicas(caplog):
    config = IPUConfig(layers_per_ipu=[0, 4, 4, 4], inference_layers_per_ipu=[4, 4, 4])
    assert config.for_n_ipu(16) is config
    assert config.replication_factor == 4
    assert config.inference_replication_factor == 5
    assert "leaves 1 IPUs idle" in caplog.text
    with pytest.raises(IPUConfigError, match=r"n_ipu=6 is not a multiple of ipus_per_replica=4"):
        config.for_n_ipu(6)


# ----- update_from_string ------------------------------------------------------------------------


def test_update_from_string_parses_by_the_current_type():
    config = IPUConfig(layers_per_ipu=[0, 4, 4, 4])
    config.update_from_string(
        "gradient_accumulation_steps=32, recompute_checkpoint_every_layer=yes,matmul_proportion=0.25,"
        'output_mode=all,executable_cache_dir=./exe_cache,parallelize_kwargs={"a": 1, "b": [1, 2]}'
    )
    assert config.gradient_accumulation_steps == 32
    assert config.recompute_checkpoint_every_layer is True
    assert config.matmul_proportion == 0.25
    assert config.output_mode == "all"
    assert config.executable_cache_dir == "./exe_cache"
    assert config.parallelize_kwargs == {"a": 1, "b": [1, 2]}


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("1", True), ("Yes", True), ("false", False), ("no", False), ("0", False)],
)
def test_update_from_string_booleans(text, expected):
    assert IPUConfig().update_from_string(f"auto_loss_scaling={text}").auto_loss_scaling is expected


def test_a_list_replaces_a_float_and_a_float_replaces_a_list():
    config = IPUConfig(layers_per_ipu=[0, 4, 4, 4])
    config.update_from_string("matmul_proportion=[0.1 0.2 0.3 0.3]")
    assert config.matmul_proportion == [0.1, 0.2, 0.3, 0.3]
    config.update_from_string("matmul_proportion=[0.1,0.2,0.3,0.4],layers_per_ipu=[1 3 4 4]")
    assert config.matmul_proportion == [0.1, 0.2, 0.3, 0.4]
    assert config.layers_per_ipu == [1, 3, 4, 4]
    config.update_from_string("matmul_proportion=0.3")
    assert config.matmul_proportion == 0.3


def test_none_sets_none_and_a_none_can_be_overridden():
    config = IPUConfig(layers_per_ipu=[0, 4, 4, 4], seed=3)
    config.update_from_string("seed=None")
    assert config.seed is None
    config.update_from_string("seed=7,serialized_embedding_splits_per_ipu=[2 2 0 0]")
    assert config.seed == 7
    assert config.serialized_embedding_splits_per_ipu == [2, 2, 0, 0]
    config.update_from_string("serialized_embedding_splits_per_ipu=none")
    assert config.serialized_embedding_splits_per_ipu is None


def test_update_from_string_follows_the_mode():
    config = IPUConfig(layers_per_ipu=[0, 4, 4, 4]).eval()
    config.update_from_string("device_iterations=9")
    assert config.inference_device_iterations == 9
    assert config.train().device_iterations == 1


def test_update_from_string_empty_is_a_no_op():
    assert IPUConfig().update_from_string("") == IPUConfig()


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        (
            "gradient_acumulation_steps=4",
            r"`gradient_acumulation_steps` is not an `IPUConfig` attribute \(did you mean `gradient_accumulation_steps`\?\)",
        ),
        ("gradient_accumulation_steps=four", r"`gradient_accumulation_steps=four`: expected an integer"),
        ("gradient_accumulation_steps=2.5", r"`gradient_accumulation_steps=2.5`: expected an integer"),
        ("auto_loss_scaling=maybe", r"`auto_loss_scaling=maybe`: expected a boolean"),
        ("matmul_proportion=[0.1 x]", r"`matmul_proportion=\[0.1 x\]`: expected a number"),
        ("matmul_proportion=lots", r"`matmul_proportion=lots`: expected a number"),
        ("parallelize_kwargs=[1]", r"`parallelize_kwargs=\[1\]`: expected a dict"),
        ("seed", r"'seed' is not `key=value`"),
        ("matmul_proportion=[0.1 0.2", r"a bracket is not closed"),
        ("seed=1]", r"unbalanced"),
    ],
)
def test_bad_overrides_name_the_key_the_value_and_the_forms(text, pattern):
    with pytest.raises(IPUConfigError, match=pattern) as raised:
        IPUConfig().update_from_string(text)
    assert "Overrides are `key=value` pairs" in str(raised.value)


def test_an_override_that_breaks_a_rule_names_the_attribute():
    with pytest.raises(IPUConfigError, match=r"`replication_factor` must be an integer >= 1, got 0"):
        IPUConfig().update_from_string("replication_factor=0")


# ----- files, copies, equality -------------------------------------------------------------------


def test_save_and_load_round_trip(tmp_path):
    config = _two_mode_config()
    path = config.save_pretrained(tmp_path / "out")
    assert path == tmp_path / "out" / CONFIG_NAME
    saved = json.loads(path.read_text())
    assert saved == config.to_dict()
    assert "source" not in saved and "mode" not in saved
    loaded = IPUConfig.from_pretrained(tmp_path / "out")
    assert loaded == config
    assert loaded.source == "local" and loaded.source_path == str(path)
    assert IPUConfig.from_pretrained(str(path)) == config


def test_json_string_and_repr():
    config = IPUConfig(gradient_accumulation_steps=4)
    assert json.loads(config.to_json_string()) == config.to_dict()
    assert repr(config).startswith("IPUConfig {")
    assert '"gradient_accumulation_steps": 4' in repr(config)


def test_copy_is_deep_and_keeps_mode_and_source(tmp_path):
    config = IPUConfig(layers_per_ipu=[0, 4, 4, 4]).eval()
    config.source = "hub"
    clone = config.copy()
    assert clone == config and clone.mode == "inference" and clone.source == "hub"
    clone.train().layers_per_ipu.append(1)
    assert config.inference_layers_per_ipu == [0, 4, 4, 4] and config.train().layers_per_ipu == [0, 4, 4, 4]
    assert copy.deepcopy(config) == config
    assert pickle.loads(pickle.dumps(config)) == config


def test_equality():
    assert IPUConfig() == IPUConfig()
    assert IPUConfig() != IPUConfig(seed=1)
    assert IPUConfig() != {"seed": None}


def test_from_dict_applies_overrides():
    config = IPUConfig.from_dict({"gradient_accumulation_steps": 4}, seed=9)
    assert config.gradient_accumulation_steps == 4 and config.seed == 9


def test_invalid_json_file_is_an_ipu_config_error(tmp_path):
    (tmp_path / CONFIG_NAME).write_text("{not json")
    with pytest.raises(IPUConfigError, match="not valid JSON"):
        IPUConfig.from_pretrained(tmp_path)


# ----- legacy files ------------------------------------------------------------------------------

POD_KEYED = {
    "replication_factor": {"pod4": 1, "pod16": 4, "pod64": 16, "default": 1},
    "gradient_accumulation_steps": {"pod16": 16, "default": 32},
    "layers_per_ipu": [0, 4, 4, 4],
    "parallelize_kwargs": {"default": "not pod-keyed"},
}


@pytest.mark.parametrize(
    ("kwargs", "replication", "accumulation"),
    [({"pod_type": "pod16"}, 4, 16), ({"n_ipu": 64}, 16, 32), ({}, 1, 32), ({"pod_type": "pod4"}, 1, 32)],
)
def test_pod_keyed_values_take_the_pod_entry_with_one_warning(
    tmp_path, caplog, kwargs, replication, accumulation
):
    _write(tmp_path, POD_KEYED)
    config = IPUConfig.from_pretrained(tmp_path, **kwargs)
    assert config.replication_factor == replication
    assert config.gradient_accumulation_steps == accumulation
    assert config.parallelize_kwargs == {"default": "not pod-keyed"}
    records = _warnings(caplog)
    assert len(records) == 1
    assert "pod-keyed values resolved" in records[0].getMessage()


def test_a_pod_keyed_value_without_the_pod_or_a_default_is_an_error(tmp_path):
    _write(tmp_path, {"replication_factor": {"pod16": 4}})
    with pytest.raises(IPUConfigError, match=r"`replication_factor` is keyed by pod type \(pod16\) and has no "
                                             r"'default' entry, and pod4 was asked for: give the pod size"):  # fmt: skip
        IPUConfig.from_pretrained(tmp_path, pod_type="pod4")
    with pytest.raises(IPUConfigError, match=r"and no pod size was given: give the pod size as one of those keys"):
        IPUConfig.from_pretrained(tmp_path)


def test_a_file_that_is_not_an_object_is_named_once(tmp_path):
    (tmp_path / CONFIG_NAME).write_text("[]")
    with pytest.raises(IPUConfigError) as error:
        IPUConfig.from_pretrained(tmp_path)
    assert str(error.value).count(str(tmp_path)) == 1 and str(error.value).endswith("is not a JSON object but a list.")


def test_deprecated_keys_are_dropped_with_one_warning(tmp_path, caplog):
    deprecated = {
        "enable_half_first_order_momentum": True,
        "sharded_execution_for_inference": True,
        "profile_dir": "./profiles",
        "use_popdist": False,
        "decompose_grad_sum": True,
    }
    _write(tmp_path, {"gradient_accumulation_steps": 8, **deprecated})
    config = IPUConfig.from_pretrained(tmp_path)
    assert config.gradient_accumulation_steps == 8
    records = _warnings(caplog)
    assert len(records) == 1
    assert all(key in records[0].getMessage() for key in deprecated)


def test_embedding_serialization_factor_0_means_1_with_one_warning(tmp_path, caplog):
    _write(tmp_path, {"embedding_serialization_factor": 0})
    assert IPUConfig.from_pretrained(tmp_path).embedding_serialization_factor == 1
    records = _warnings(caplog)
    assert len(records) == 1 and "embedding_serialization_factor 0 read as 1" in records[0].getMessage()


def test_an_old_file_with_everything_still_gives_one_warning(tmp_path, caplog):
    _write(tmp_path, {**POD_KEYED, "profile_dir": "x", "embedding_serialization_factor": 0, "bogus_key": 1})
    IPUConfig.from_pretrained(tmp_path, pod_type="pod16")
    assert len(_warnings(caplog)) == 1


def test_a_current_file_loads_without_warnings(tmp_path, caplog):
    IPUConfig(layers_per_ipu=[0, 4, 4, 4]).save_pretrained(tmp_path)
    IPUConfig.from_pretrained(tmp_path)
    assert _warnings(caplog) == []


def test_unknown_keys_warn_by_name_and_strict_raises(tmp_path, caplog):
    _write(tmp_path, {"gradient_accumulation_steps": 8, "gradient_acumulation_steps": 4, "my_setting": 1})
    config = IPUConfig.from_pretrained(tmp_path)
    assert config.gradient_accumulation_steps == 8
    records = _warnings(caplog)
    assert len(records) == 1
    message = records[0].getMessage()
    assert "`my_setting`" in message and "`gradient_acumulation_steps` (did you mean" in message
    with pytest.raises(
        IPUConfigError, match=r"unknown keys: `gradient_acumulation_steps`.*`my_setting`.*strict=True"
    ):
        IPUConfig.from_pretrained(tmp_path, strict=True)


def test_metadata_keys_are_ignored_quietly(caplog):
    IPUConfig.from_dict({"optimum_version": "1.0", "transformers_version": "4.29.2"})
    assert _warnings(caplog) == []


def test_a_file_that_is_not_an_object_is_an_error(tmp_path):
    _write(tmp_path, [1, 2])
    with pytest.raises(IPUConfigError, match="not a JSON object"):
        IPUConfig.from_pretrained(tmp_path)


def test_a_serialization_factor_of_none_means_not_set_as_in_optimum_graphcore(tmp_path, caplog):
    # Graphcore/mt5-small-ipu on the Hub holds `"embedding_serialization_factor": null` beside its splits, and
    # Optimum Graphcore's own tests pass `embedding_serialization_factor=None` with splits per IPU.
    _write(tmp_path, {"embedding_serialization_factor": None, "serialized_embedding_splits_per_ipu": [4, 4, 0, 0],
                      "projection_serialization_factor": None, "layers_per_ipu": [0, 8, 8, 0]})  # fmt: skip
    config = IPUConfig.from_pretrained(tmp_path, strict=True)
    assert (config.embedding_serialization_factor, config.projection_serialization_factor) == (1, 1)
    assert config.serialized_embedding_splits_per_ipu == [4, 4, 0, 0] and _warnings(caplog) == []
    assert IPUConfig(embedding_serialization_factor=None).embedding_serialization_factor == 1
    config.projection_serialization_factor = None
    assert config.projection_serialization_factor == 1


# ----- a model's config.json is not an IPU config ------------------------------------------------


def _saved_model_config(tmp_path):
    """A model folder as transformers writes it: `config.json` with `transformers_version` and `model_type`."""
    from transformers import BertConfig

    folder = tmp_path / "bert"
    BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2).save_pretrained(folder)
    assert "transformers_version" in json.loads((folder / "config.json").read_text())
    return folder


MODEL_CONFIG_REFUSAL = r"is a model's configuration \(model_type 'bert'\), not an IPU config.*Graphcore/bert-base-ipu"


@pytest.mark.parametrize("path", ["from_pretrained(file)", "from_dict", "--ipu_config_name file"])
def test_a_model_config_json_written_by_transformers_is_refused_on_every_path(tmp_path, path):
    """transformers writes `transformers_version` into every config.json: a key IPUConfig ignores quietly,
    which must not make a model's configuration pass for an IPU config holding only defaults."""
    from optimum_ipu.training_args import IPUTrainingArguments, resolve_ipu_config

    file = _saved_model_config(tmp_path) / "config.json"
    loads = {
        "from_pretrained(file)": lambda: IPUConfig.from_pretrained(file),
        "from_dict": lambda: IPUConfig.from_dict(json.loads(file.read_text())),
        "--ipu_config_name file": lambda: resolve_ipu_config(
            IPUTrainingArguments(output_dir=str(tmp_path / "out"), ipu_config_name=str(file), use_cpu=True,
                                 report_to="none")),  # fmt: skip
    }
    with pytest.raises(IPUConfigError, match=MODEL_CONFIG_REFUSAL):
        loads[path]()


def test_a_model_folder_without_ipu_config_json_is_refused_naming_its_config_json(tmp_path):
    folder = _saved_model_config(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"has no ipu_config.json.*config.json is a model's configuration"):
        IPUConfig.from_pretrained(folder)


def test_a_mistyped_keyword_is_pythons_type_error_with_the_close_name():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'gradient_accumulation_step' \(did you mean "
                                        r"`gradient_accumulation_steps`\?\)"):  # fmt: skip
        IPUConfig(gradient_accumulation_step=4)
