"""IPUConfig's mode API, as Optimum Graphcore 0.7 code uses it: `modes`, `mode`, `train()` / `eval()`,
the `_<name>` attributes that follow the mode, `_get_managed_attr_mode_name`, and when and how values
are validated (messages name the attribute of the mode in use)."""

import pytest

from optimum.graphcore.ipu_configuration import IncompatibleIPUConfigError
from optimum_ipu.configuration import IPUConfig, IPUConfigError

# Optimum Graphcore 0.7's `_<name>` attributes: exactly these, written out by hand from its source.
UNDERSCORE_NAMES = (
    "layers_per_ipu",
    "ipus_per_replica",
    "matmul_proportion",
    "embedding_serialization_factor",
    "serialized_embedding_splits_per_ipu",
    "projection_serialization_factor",
    "serialized_projection_splits_per_ipu",
    "parallelize_kwargs",
)

# A config whose two modes differ in every placement setting: (training value, inference value).
TWO_MODES = {
    "layers_per_ipu": ([0, 4, 4, 4], [6, 6]),
    "ipus_per_replica": (4, 2),
    "matmul_proportion": ([0.1, 0.2, 0.3, 0.3], 0.5),
    "embedding_serialization_factor": (2, 1),
    "serialized_embedding_splits_per_ipu": (None, [1, 1]),
    "projection_serialization_factor": (1, 3),
    "serialized_projection_splits_per_ipu": ([1, 1, 0, 0], None),
    "parallelize_kwargs": ({"a": 1}, {"b": 2}),
}


def two_mode_config() -> IPUConfig:
    values = {}
    for name, (training, inference) in TWO_MODES.items():
        values[name], values[f"inference_{name}"] = training, inference
    return IPUConfig(**values)


def small_config() -> IPUConfig:
    """Two IPUs of two layers in training, one IPU of four in inference."""
    return IPUConfig(layers_per_ipu=[2, 2], inference_layers_per_ipu=[4])


# ----- modes -------------------------------------------------------------------------------------


def test_modes_are_training_then_inference():
    assert IPUConfig.modes == ("training", "inference")
    assert IPUConfig().modes == ("training", "inference")


def test_train_and_eval_switch_the_mode_and_return_the_config():
    config = IPUConfig()
    assert config.mode == "training"
    assert config.eval() is config and config.mode == "inference"
    assert config.train() is config and config.mode == "training"


@pytest.mark.parametrize("mode", ["training", "inference"])
def test_assigning_the_mode_is_the_same_as_train_or_eval(mode):
    config = small_config()
    config.mode = mode
    assert config.mode == mode
    assert config._layers_per_ipu == ([2, 2] if mode == "training" else [4])


@pytest.mark.parametrize("bad", ["foo", "eval", "Training", None, 1])
def test_an_unknown_mode_is_a_value_error_naming_the_modes(bad):
    config = IPUConfig().eval()
    with pytest.raises(ValueError) as raised:
        config.mode = bad
    assert isinstance(raised.value, IPUConfigError)
    message = str(raised.value)
    assert repr(bad) in message and "'training'" in message and "'inference'" in message
    assert "train()" in message and "eval()" in message
    assert config.mode == "inference"  # unchanged


def test_the_mode_is_not_saved():
    assert "mode" not in IPUConfig().eval().to_dict() and "_mode" not in IPUConfig().eval().to_dict()


# ----- attributes that follow the mode -----------------------------------------------------------


@pytest.mark.parametrize("name", UNDERSCORE_NAMES)
def test_underscore_names_read_the_value_of_the_current_mode(name):
    training, inference = TWO_MODES[name]
    config = two_mode_config()
    assert getattr(config, f"_{name}") == training
    assert getattr(config.eval(), f"_{name}") == inference
    assert getattr(config.train(), f"_{name}") == training


def test_eval_reads_the_inference_layers():
    assert small_config().eval()._layers_per_ipu == [4]
    assert small_config().eval()._ipus_per_replica == 1
    assert small_config()._ipus_per_replica == 2


@pytest.mark.parametrize(
    "name", ["replication_factor", "device_iterations", "gradient_accumulation_steps", "seed"]
)
def test_only_the_placement_settings_have_an_underscore_name(name):
    with pytest.raises(AttributeError):
        getattr(IPUConfig(), f"_{name}")


def test_assigning_an_underscore_name_in_inference_mode_sets_the_inference_attribute():
    config = small_config().eval()
    config._layers_per_ipu = [1, 3]
    assert config.inference_layers_per_ipu == [1, 3]
    assert config.layers_per_ipu == [1, 3]  # our plain names follow the mode too
    assert config.train().layers_per_ipu == [2, 2]


def test_assigning_an_underscore_name_in_training_mode_sets_the_training_attribute():
    config = small_config()
    config._matmul_proportion = [0.3, 0.4]
    assert config.matmul_proportion == [0.3, 0.4]
    assert config.inference_matmul_proportion == 0.2


@pytest.mark.parametrize(
    ("mode", "name", "expected"),
    [
        ("training", "layers_per_ipu", "layers_per_ipu"),
        ("inference", "layers_per_ipu", "inference_layers_per_ipu"),
        ("inference", "matmul_proportion", "inference_matmul_proportion"),
        # any attribute with an inference twin, not only the `_<name>` ones
        ("inference", "replication_factor", "inference_replication_factor"),
        ("inference", "device_iterations", "inference_device_iterations"),
        # unchanged: no twin, already an inference name, the underscore spelling, not an attribute
        ("inference", "gradient_accumulation_steps", "gradient_accumulation_steps"),
        ("inference", "inference_layers_per_ipu", "inference_layers_per_ipu"),
        ("inference", "_layers_per_ipu", "_layers_per_ipu"),
        ("inference", "no_such_attribute", "no_such_attribute"),
    ],
)
def test_get_managed_attr_mode_name(mode, name, expected):
    config = IPUConfig()
    config.mode = mode
    assert config._get_managed_attr_mode_name(name) == expected


def test_setting_a_derived_value_to_none_derives_it_again_at_once():
    config = IPUConfig(matmul_proportion=0.3, inference_matmul_proportion=0.6).eval()
    config._matmul_proportion = None
    assert config.inference_matmul_proportion == 0.3


# ----- when validation runs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("layers_per_ipu", [2, -2]),
        ("matmul_proportion", [0.2, -0.1]),
        ("ipus_per_replica", 0),
        ("embedding_serialization_factor", 0),
        ("serialized_projection_splits_per_ipu", [1, 0, 1]),
        ("replication_factor", 0),
        ("device_iterations", 0),
    ],
)
def test_assignment_in_inference_mode_checks_the_value_and_names_the_inference_attribute(name, bad):
    config = small_config().eval()
    before = config.to_dict()
    spellings = [name, f"_{name}"] if name in UNDERSCORE_NAMES else [name]
    for spelling in spellings:
        with pytest.raises(ValueError, match=rf"`inference_{name}`"):
            setattr(config, spelling, bad)
    assert config.to_dict() == before


def test_assignment_in_training_mode_names_the_training_attribute():
    with pytest.raises(IPUConfigError, match=r"`IPUConfig` attribute `layers_per_ipu` must .*>= -1"):
        small_config()._layers_per_ipu = [-2]


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("replication_factor", "2"),
        ("layers_per_ipu", "[2, 2]"),
        ("matmul_proportion", "0.2"),
        ("auto_loss_scaling", "yes"),
    ],
)
def test_a_value_of_the_wrong_type_is_both_a_type_error_and_a_value_error(name, bad):
    with pytest.raises(TypeError, match=rf"`{name}`") as raised:
        setattr(IPUConfig(), name, bad)
    assert isinstance(raised.value, ValueError)


def test_a_value_out_of_range_is_a_value_error_not_a_type_error():
    with pytest.raises(ValueError) as raised:
        IPUConfig().replication_factor = 0
    assert not isinstance(raised.value, TypeError)


def test_rules_between_attributes_wait_for_validate():
    config = small_config().eval()
    config._matmul_proportion = [0.1, 0.2]  # inference uses one IPU: breaks a rule, not a value
    with pytest.raises(
        IncompatibleIPUConfigError,
        match=r"`inference_matmul_proportion` has 2 entries .* `inference_ipus_per_replica` is 1",
    ):
        config.validate()
    config._ipus_per_replica = 2  # the rule holds again once both are assigned
    config._layers_per_ipu = [2, 2]
    config.validate()


@pytest.mark.parametrize("mode", ["training", "inference"])
def test_validate_leaves_the_mode_as_it_was_also_on_error(mode):
    config = small_config()
    config.inference_layers_per_ipu = [1, 1, 1]  # inference_ipus_per_replica is 1
    config.mode = mode
    with pytest.raises(IPUConfigError, match="`inference_layers_per_ipu`"):
        config.validate()
    assert config.mode == mode


def test_switching_the_mode_validates_nothing():
    config = small_config()
    config.layers_per_ipu = [1, 1, 1]  # breaks the training rule; assignment accepts it
    assert config.eval().train().mode == "training"


def test_construction_checks_both_modes_and_names_the_inference_attribute():
    with pytest.raises(
        IncompatibleIPUConfigError,
        match=r"`inference_layers_per_ipu` has 2 entries .* `inference_ipus_per_replica` is 3",
    ):
        IPUConfig(inference_layers_per_ipu=[2, 2], inference_ipus_per_replica=3)


@pytest.mark.parametrize("mode", ["training", "inference"])
def test_a_config_built_for_a_mode_with_its_attribute_names_reads_back_through_the_mode(mode):
    # The pattern of Optimum Graphcore's tests: name the attributes with `_get_managed_attr_mode_name`.
    helper = IPUConfig()
    helper.mode = mode
    names = {helper._get_managed_attr_mode_name(n): v for n, v in {"layers_per_ipu": [1, 2, 3, 4]}.items()}
    config = IPUConfig(**names)
    config.mode = mode
    assert config._layers_per_ipu == [1, 2, 3, 4]
    assert config._ipus_per_replica == 4


def test_update_in_inference_mode_checks_the_rules_and_keeps_the_mode():
    config = small_config().eval()
    before = config.to_dict()
    with pytest.raises(IncompatibleIPUConfigError, match="`inference_matmul_proportion` has 3 entries"):
        config.update(matmul_proportion=[0.1, 0.2, 0.3])
    assert config.to_dict() == before and config.mode == "inference"
    config.update(layers_per_ipu=[1, 3])  # re-derives inference_ipus_per_replica
    assert (config.inference_layers_per_ipu, config.inference_ipus_per_replica, config.mode) == (
        [1, 3],
        2,
        "inference",
    )


def test_incompatible_ipu_config_error_is_a_value_error():
    assert issubclass(IncompatibleIPUConfigError, ValueError)
    assert IncompatibleIPUConfigError is IPUConfigError
