"""The IPUConfig rules on plain values: each bad value's exact error class and whole message, the
"did you mean" hint, and the defaults derived the way Optimum Graphcore derives them."""

from __future__ import annotations

import re

import pytest

from optimum_ipu import IPUConfig
from optimum_ipu._quoting import shown
from optimum_ipu.configuration import total_ipus
from optimum_ipu.configuration.schema import (
    FIELD_DEFAULTS,
    IPUConfigError,
    IPUConfigTypeError,
    close_matches,
    derive_defaults,
    validate_value,
)

TYPE, RANGE = IPUConfigTypeError, IPUConfigError
BAD_VALUES = [
    ("gradient_accumulation_steps", "4", TYPE, "must be an integer >= 1"),
    ("gradient_accumulation_steps", True, TYPE, "must be an integer >= 1"),
    ("inference_replication_factor", 0, RANGE, "must be an integer >= 1"),
    ("layers_per_ipu", "2,2", TYPE, "must be a list of layer counts, one integer per IPU (-1: wildcard)"),
    ("layers_per_ipu", [], RANGE, "must be a non-empty list of layer counts, one per IPU (-1: wildcard)"),
    ("inference_layers_per_ipu", [2, -2], RANGE, "must hold integers >= -1 (-1 is the wildcard)"),
    ("matmul_proportion", "0.2", TYPE, "must be a fraction of the IPU's memory in (0, 1] (e.g. 0.2), or a non-empty list with one per IPU"),
    ("matmul_proportion", [], RANGE, "must be a fraction of the IPU's memory in (0, 1] (e.g. 0.2), or a non-empty list with one per IPU"),
    ("matmul_proportion", [0.2, -0.1], RANGE, "must be a fraction of the IPU's memory in (0, 1] (e.g. 0.2), or a non-empty list with one per IPU"),
    ("matmul_proportion", 0.0, RANGE, "must be a fraction of the IPU's memory in (0, 1] (e.g. 0.2), or a non-empty list with one per IPU"),
    ("matmul_proportion", 1.5, RANGE, "must be a fraction of the IPU's memory in (0, 1] (e.g. 0.2), or a non-empty list with one per IPU"),
    ("matmul_proportion", float("nan"), RANGE, "must be a fraction of the IPU's memory in (0, 1] (e.g. 0.2), or a non-empty list with one per IPU"),
    ("serialized_embedding_splits_per_ipu", "1", TYPE, "must be None or a list of integers >= 0, one per IPU"),
    ("serialized_embedding_splits_per_ipu", [1.5], TYPE, "must be None or a list of integers >= 0, one per IPU"),
    ("serialized_projection_splits_per_ipu", [-1, 2], RANGE, "must be None or a list of integers >= 0, one per IPU"),
    ("enable_half_partials", "yes", TYPE, "must be true or false"),
    ("output_mode", "last", RANGE, "must be one of all, sum, final, default"),
    ("output_mode", 3, TYPE, "must be one of all, sum, final, default"),
    ("seed", "1", TYPE, "must be None or an integer"),
    ("executable_cache_dir", 3, TYPE, 'must be a path ("" disables the cache)'),
    ("parallelize_kwargs", [], TYPE, "must be a dict of keyword arguments for parallelize()"),
]  # fmt: skip


@pytest.mark.parametrize("name,value,error,rule", BAD_VALUES, ids=[f"{c[0]}={c[1]!r}" for c in BAD_VALUES])
def test_a_bad_value_names_the_attribute_the_rule_and_the_value(name, value, error, rule):
    with pytest.raises(IPUConfigError) as caught:
        validate_value(name, value)
    assert type(caught.value) is error  # wrong type: also a TypeError; out of range: a ValueError only
    assert str(caught.value) == f"`IPUConfig` attribute `{name}` {rule}, got {value!r}."


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("serialized_projection_splits_per_ipu", [0, 0], "`IPUConfig` attribute `serialized_projection_splits_per_ipu="
         "[0, 0]` must have atleast 1 split on 1 IPU: `serialized_projection_splits_per_ipu` must place at least "
         "one split (its sum must be >= 1)."),
        ("inference_serialized_embedding_splits_per_ipu", [1, 0, 1], "`IPUConfig` attribute "
         "`inference_serialized_embedding_splits_per_ipu=[1, 0, 1]` must have its splits on consecutive IPUs: "
         "`inference_serialized_embedding_splits_per_ipu` must put its non-zero entries next to each other (e.g. "
         "[0, 2, 2, 0])."),
    ],
)  # fmt: skip
def test_bad_splits_start_with_optimum_graphcores_sentence(name, value, message):
    """Optimum Graphcore's own tests match on its sentence ("must have atleast 1 split", sic): it comes first."""
    with pytest.raises(IPUConfigError) as caught:
        validate_value(name, value)
    assert type(caught.value) is IPUConfigError and str(caught.value) == message


@pytest.mark.parametrize(
    "name,value", [("matmul_proportion", 1), ("matmul_proportion", [1.0, 1e-3]), ("layers_per_ipu", [0, -1, 3]),
                   ("serialized_embedding_splits_per_ipu", [0, 2, 1, 0]), ("seed", None), ("output_mode", "sum")],
)  # fmt: skip
def test_values_at_the_edge_of_a_rule_are_accepted(name, value):
    validate_value(name, value)


def test_a_mistyped_name_gets_the_close_names():
    assert close_matches("layer_per_ipu") == " (did you mean `layers_per_ipu`?)"
    assert close_matches("serialized_embedding_split_per_ipu") == (
        " (did you mean `serialized_embedding_splits_per_ipu` or `inference_serialized_embedding_splits_per_ipu`?)"
    )  # at most two names
    assert close_matches("output") == ""  # `output_mode` is not close enough to suggest
    assert close_matches("zzz") == ""


def derive(**given):
    return derive_defaults({**FIELD_DEFAULTS, **given}, given)


def test_inference_ipus_are_the_length_of_explicit_inference_layers():
    derived = derive(layers_per_ipu=[-1], ipus_per_replica=4, inference_layers_per_ipu=[-1, -1])
    assert derived["inference_ipus_per_replica"] == 2


def test_copied_inference_layers_are_kept_when_they_fit_the_inference_ipus():
    assert derive(layers_per_ipu=[2, 2], inference_ipus_per_replica=2)["inference_layers_per_ipu"] == [2, 2]
    # wildcards fit any count
    assert derive(layers_per_ipu=[-1, -1], inference_ipus_per_replica=4)["inference_layers_per_ipu"] == [
        -1,
        -1,
    ]
    # a list of the wrong length is replaced by an even split
    assert derive(layers_per_ipu=[3, 1], inference_ipus_per_replica=1)["inference_layers_per_ipu"] == [-1]


def test_derived_values_share_no_list_with_the_given_ones():
    given = {**FIELD_DEFAULTS, "layers_per_ipu": [2, 2]}
    derived = derive_defaults(given, {"layers_per_ipu"})
    derived["layers_per_ipu"].append(9)
    derived["inference_layers_per_ipu"].append(7)
    assert given["layers_per_ipu"] == [2, 2] and derived["inference_layers_per_ipu"] == [2, 2, 7]


def test_a_malformed_layer_list_is_left_for_validation_to_name():
    # Deriving must not crash on a value validation will refuse with the attribute's name.
    assert derive(layers_per_ipu=4)["ipus_per_replica"] == 1
    assert derive(inference_layers_per_ipu=4)["inference_ipus_per_replica"] == 1


# -- one list of fields: schema.FIELDS ----------------------------------------------------------------


def test_every_schema_field_is_an_ipu_config_attribute_with_its_default_and_the_class_adds_none():
    """`schema.FIELDS` is the one list of `IPUConfig` fields: adding one there is the whole change.

    Each field is a keyword of `IPUConfig(...)` with the schema's default and type, an attribute of a
    new config holding that default (derivable ones: derived), a key of `to_dict()` and of the checks;
    and the class keeps no field of its own beside them (only the bookkeeping `source`/`source_path`).
    """
    import inspect

    from optimum_ipu import IPUConfig
    from optimum_ipu.configuration.schema import FIELDS, MODE_MANAGED

    parameters = inspect.signature(IPUConfig).parameters
    assert list(parameters) == list(FIELDS), "IPUConfig(...)'s keywords differ from schema.FIELDS"
    config = IPUConfig()
    for name, field in FIELDS.items():
        parameter = parameters[name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert (parameter.default, parameter.annotation) == (field.init_default, field.annotation), name
        if not field.derivable:
            assert getattr(config, name) == field.default, name
            assert IPUConfig(**{name: field.default}) == config, name
        validate_value(name, config.to_dict()[name])  # every field has its check
    stored = {name for name in vars(config) if not name.startswith("_")} - {"source", "source_path"}
    assert stored == set(FIELDS), (
        f"IPUConfig stores fields schema.FIELDS lacks: {sorted(stored - set(FIELDS))}"
    )
    assert list(config.to_dict()) == list(FIELDS)
    own = {
        name
        for name, value in vars(IPUConfig).items()
        if not name.startswith("_") and not callable(value) and not isinstance(value, (property, classmethod))
    }
    assert own - {"modes"} == set(MODE_MANAGED), "IPUConfig declares attributes schema.FIELDS lacks"


# A value of 300,000 characters: every error quoting it shows a bounded prefix and its size, not the whole.
HUGE = 300_000
LONG_VALUES = {
    "override-list-of-text": lambda: IPUConfig().update_from_string(
        "layers_per_ipu=[" + "x " * (HUGE // 2) + "]"
    ),
    "override-digits-for-a-list": lambda: IPUConfig().update_from_string("layers_per_ipu=" + "1" * HUGE),
    "override-text-for-an-integer": lambda: IPUConfig().update_from_string("device_iterations=" + "x" * HUGE),
    "override-unclosed-bracket": lambda: IPUConfig().update_from_string(
        "layers_per_ipu=[" + "1 " * (HUGE // 2)
    ),
    "override-unbalanced-bracket": lambda: IPUConfig().update_from_string("seed=" + "1" * HUGE + "]"),
    "override-without-equals": lambda: IPUConfig().update_from_string("x" * HUGE),
    "override-unknown-key": lambda: IPUConfig().update_from_string("x" * HUGE + "=1"),
    "override-bad-dict": lambda: IPUConfig().update_from_string("parallelize_kwargs={" + "x" * HUGE + "}"),
    "string-for-a-list": lambda: IPUConfig(layers_per_ipu="1" * HUGE),
    "string-for-a-mode": lambda: IPUConfig(output_mode="x" * HUGE),
    "unknown-keyword": lambda: IPUConfig(**{"x" * HUGE: 1}),
    "unknown-update": lambda: IPUConfig().update(**{"x" * HUGE: 1}),
    "unknown-attribute": lambda: setattr(IPUConfig(), "x" * HUGE, 1),
    "unknown-mode": lambda: setattr(IPUConfig(), "mode", "x" * HUGE),
    "pod-type": lambda: total_ipus(pod_type="pod" + "x" * HUGE, n_ipu=None),
}


@pytest.mark.parametrize("make", LONG_VALUES.values(), ids=LONG_VALUES.keys())
def test_an_error_quotes_a_bounded_prefix_of_a_long_value_with_its_size(make):
    with pytest.raises((IPUConfigError, TypeError, AttributeError)) as caught:
        make()
    message = str(caught.value)
    assert len(message) < 1_000, message[:2_000]
    assert re.search(r"xxxx|1111|x x x|1 1 1", message) and re.search(r"\(\d{3},\d{3} characters\)", message)


def test_a_value_python_cannot_repr_is_described_instead():
    assert shown(10**5000) == "an integer of 5,001 digits"  # repr() refuses more than 4,300 digits
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    assert shown(nested) == "a list nested too deeply to show"
    assert shown([1] * 100_000).endswith("... (100,000 entries)") and len(shown([1] * 100_000)) < 200
