"""What a valid `IPUConfig` is: its fields and defaults, its modes, the derived defaults, and the rules.

Everything here works on plain values keyed by the JSON names (training values under the plain name,
inference values under the `inference_` name), so the rules can be read and tested without the mode
machinery of `IPUConfig`. Two levels of rules: `validate_value` checks one value on its own (its type
and range; run on every assignment), `validate_values` checks every value and the rules that tie
several attributes together (run on construction, `update()` and `validate()`).
"""

from __future__ import annotations

import copy
import difflib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from optimum_ipu._quoting import shown  # every quoted value is bounded (_quoting.py)

logger = logging.getLogger(__name__)

CONFIG_NAME = "ipu_config.json"


class IPUConfigError(ValueError):
    """An `IPUConfig` value, override or file that breaks a rule; the message names the attribute.

    Optimum Graphcore's `IncompatibleIPUConfigError` is this class, so `except` clauses written for
    either name, or for `ValueError`, catch it.
    """


class IPUConfigTypeError(IPUConfigError, TypeError):
    """An `IPUConfig` value of the wrong type (a string for a count, a dict for a list, ...).

    Also a `TypeError`, which Optimum Graphcore raised for a value of the wrong type, so code that
    catches either `TypeError` or `ValueError` keeps working.
    """


OUTPUT_MODES = ("all", "sum", "final", "default")


def _all_wildcards(layers: list) -> bool:
    return bool(layers) and all(n == -1 for n in layers)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fail(name: str, value: Any, rule: str, wrong_type: bool = False) -> IPUConfigError:
    error = IPUConfigTypeError if wrong_type else IPUConfigError
    return error(f"`IPUConfig` attribute `{name}` {rule}, got {shown(value)}.")


# ----- one value on its own ----------------------------------------------------------------------


def _check_count(name: str, value: Any) -> None:
    if not _is_int(value) or value < 1:
        raise _fail(name, value, "must be an integer >= 1", wrong_type=not _is_int(value))


def _check_layers_per_ipu(name: str, layers: Any) -> None:
    if not isinstance(layers, list) or not all(_is_int(n) for n in layers):
        raise _fail(name, layers, "must be a list of layer counts, one integer per IPU (-1: wildcard)", True)
    if not layers:
        raise _fail(name, layers, "must be a non-empty list of layer counts, one per IPU (-1: wildcard)")
    if not all(n >= -1 for n in layers):
        raise _fail(name, layers, "must hold integers >= -1 (-1 is the wildcard)")


def _check_proportion(name: str, proportion: Any) -> None:
    # The share of an IPU's memory its matmuls' temporaries may take (Poplar's availableMemoryProportion).
    rule = "must be a fraction of the IPU's memory in (0, 1] (e.g. 0.2), or a non-empty list with one per IPU"
    entries = proportion if isinstance(proportion, list) else [proportion]
    if not all(_is_number(p) for p in entries):
        raise _fail(name, proportion, rule, wrong_type=True)
    if not entries or not all(0 < p <= 1 for p in entries):  # NaN fails both comparisons
        raise _fail(name, proportion, rule)


def _check_splits(name: str, splits: Any) -> None:
    rule = "must be None or a list of integers >= 0, one per IPU"
    if not isinstance(splits, list) or not all(_is_int(n) for n in splits):
        raise _fail(name, splits, rule, wrong_type=True)
    if not all(n >= 0 for n in splits):
        raise _fail(name, splits, rule)
    used = [i for i, n in enumerate(splits) if n > 0]
    if not used:  # Optimum Graphcore's sentences first: code that matches on them keeps working
        raise IPUConfigError(
            f"`IPUConfig` attribute `{name}={shown(splits)}` must have atleast 1 split on 1 IPU: `{name}` must place "
            "at least one split (its sum must be >= 1)."
        )
    if used != list(range(used[0], used[-1] + 1)):
        raise IPUConfigError(
            f"`IPUConfig` attribute `{name}={shown(splits)}` must have its splits on consecutive IPUs: `{name}` "
            "must put its non-zero entries next to each other (e.g. [0, 2, 2, 0])."
        )


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _fail(name, value, "must be true or false", wrong_type=True)


def _check_output_mode(name: str, value: Any) -> None:
    if value not in OUTPUT_MODES:
        rule = f"must be one of {', '.join(OUTPUT_MODES)}"
        raise _fail(name, value, rule, wrong_type=not isinstance(value, str))


def _check_seed(name: str, value: Any) -> None:
    if not _is_int(value):
        raise _fail(name, value, "must be None or an integer", wrong_type=True)


def _check_cache_dir(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise _fail(name, value, 'must be a path ("" disables the cache)', wrong_type=True)


def _check_kwargs(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise _fail(name, value, "must be a dict of keyword arguments for parallelize()", wrong_type=True)


# ----- the fields --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One attribute of `ipu_config.json`, described once: `IPUConfig`'s constructor, attributes,
    assignment checks, `to_dict()` and the legacy reader all read these.

    Attributes:
        default: the value when none is given (`None` on a derivable field: derived).
        type: the type of a set value, as an annotation (`"int"`, `"list[int]"`).
        check: checks one set value's type and range: `check(name, value)` raises `IPUConfigError`.
        derivable: `None` means "derive it from the others" (see `derive_defaults`).
        nullable: `None` is a value of its own ("not set").
        none_is_default: `None` given is stored as the default (Optimum Graphcore 0.7 wrote `null`
            for "not set": `Graphcore/mt5-small-ipu` has `"embedding_serialization_factor": null`).
        placement: Optimum Graphcore's model code also reads it as `ipu_config._<name>`, following the
            mode (for a field with an `inference_` twin).
    """

    default: Any
    type: str
    check: Callable[[str, Any], None]
    derivable: bool = False
    nullable: bool = False
    none_is_default: bool = False
    placement: bool = False

    @property
    def accepts_none(self) -> bool:
        """Whether `None` is a valid value (derive it, or not set)."""
        return self.derivable or self.nullable

    @property
    def init_default(self) -> Any:
        """The default `IPUConfig(...)`'s signature shows: `None` for a list or dict (a fresh copy of
        the default is made per config), else the default."""
        return None if isinstance(self.default, (list, dict)) else self.default

    @property
    def annotation(self) -> str:
        """The type `IPUConfig(...)`'s signature shows for the field."""
        takes_none = self.accepts_none or self.none_is_default or self.init_default is None
        return f"{self.type} | None" if takes_none else self.type


_LAYERS, _PROPORTION, _SPLITS = "list[int]", "float | list[float]", "list[int]"
_KWARGS = "dict[str, Any]"

# Every attribute of `ipu_config.json`, in the order `to_dict()` writes them: the one list of fields.
# A training value is under its plain name, an inference value under its `inference_` twin.
FIELDS: dict[str, Field] = {
    "replication_factor": Field(1, "int", _check_count),
    "inference_replication_factor": Field(1, "int", _check_count),
    "gradient_accumulation_steps": Field(1, "int", _check_count),
    "layers_per_ipu": Field([-1], _LAYERS, _check_layers_per_ipu, placement=True),
    "inference_layers_per_ipu": Field(None, _LAYERS, _check_layers_per_ipu, derivable=True),
    "ipus_per_replica": Field(None, "int", _check_count, derivable=True, placement=True),
    "inference_ipus_per_replica": Field(None, "int", _check_count, derivable=True),
    "optimizer_state_offchip": Field(False, "bool", _check_flag),
    "replicated_tensor_sharding": Field(False, "bool", _check_flag),
    "matmul_proportion": Field(0.2, _PROPORTION, _check_proportion, placement=True),
    "inference_matmul_proportion": Field(None, _PROPORTION, _check_proportion, derivable=True),
    "enable_half_partials": Field(True, "bool", _check_flag),
    "embedding_serialization_factor": Field(1, "int", _check_count, none_is_default=True, placement=True),
    "inference_embedding_serialization_factor": Field(None, "int", _check_count, derivable=True),
    "serialized_embedding_splits_per_ipu": Field(None, _SPLITS, _check_splits, nullable=True, placement=True),
    "inference_serialized_embedding_splits_per_ipu": Field(None, _SPLITS, _check_splits, derivable=True),
    "projection_serialization_factor": Field(1, "int", _check_count, none_is_default=True, placement=True),
    "inference_projection_serialization_factor": Field(None, "int", _check_count, derivable=True),
    "serialized_projection_splits_per_ipu": Field(
        None, _SPLITS, _check_splits, nullable=True, placement=True
    ),
    "inference_serialized_projection_splits_per_ipu": Field(None, _SPLITS, _check_splits, derivable=True),
    "recompute_checkpoint_every_layer": Field(False, "bool", _check_flag),
    "device_iterations": Field(1, "int", _check_count),
    "inference_device_iterations": Field(1, "int", _check_count),
    "output_mode": Field("final", "str", _check_output_mode),
    "seed": Field(None, "int", _check_seed, nullable=True),
    "auto_loss_scaling": Field(False, "bool", _check_flag),
    "executable_cache_dir": Field("", "str", _check_cache_dir),
    "parallelize_kwargs": Field({}, _KWARGS, _check_kwargs, placement=True),
    "inference_parallelize_kwargs": Field({}, _KWARGS, _check_kwargs),
    "explicit_ir_inference": Field(False, "bool", _check_flag),
}

# Views of FIELDS, for the code that needs one property of every field.
FIELD_DEFAULTS: dict[str, Any] = {name: field.default for name, field in FIELDS.items()}
FIELD_NAMES: tuple[str, ...] = tuple(FIELDS)

# The modes of a config, in Optimum Graphcore's words: `train()` selects the first, `eval()` the second.
MODES: tuple[str, ...] = ("training", "inference")

# Attributes with an `inference_` twin: in inference mode, reading the plain name gives the twin.
MODE_MANAGED: tuple[str, ...] = tuple(
    name for name in FIELD_NAMES if not name.startswith("inference_") and f"inference_{name}" in FIELDS
)

# The mode-managed attributes that decide placement. Optimum Graphcore's model code reads them as
# `ipu_config._<name>` (e.g. `_layers_per_ipu`), which follows the mode; exactly these eight have the
# underscore spelling there (not `replication_factor` or `device_iterations`, read per mode explicitly).
PLACEMENT_MANAGED: tuple[str, ...] = tuple(name for name, field in FIELDS.items() if field.placement)

# Attributes whose value is derived from others unless the user gave one.
DERIVABLE: frozenset[str] = frozenset(name for name, field in FIELDS.items() if field.derivable)

# Serialization factors Optimum Graphcore 0.7 let be `None` ("not set": no serialization unless the
# splits per IPU say otherwise). `None` given for one of these is stored as 1, their default.
UNSET_MEANS_ONE: frozenset[str] = frozenset(name for name, field in FIELDS.items() if field.none_is_default)

# Attributes that may be `None`: the derivable ones ("derive it") and the nullable ones ("not set").
NULLABLE: frozenset[str] = frozenset(name for name, field in FIELDS.items() if field.accepts_none)

DEFAULT_MATMUL_PROPORTION = FIELDS["matmul_proportion"].default
_SERIALIZED = ("embedding", "projection")


def attribute_for_mode(name: str, mode: str) -> str:
    """The attribute `name` stands for in `mode`: its `inference_` twin in inference mode, else `name`."""
    return f"inference_{name}" if mode == "inference" and name in MODE_MANAGED else name


def close_matches(name: str, candidates: Iterable[str] = FIELD_NAMES) -> str:
    """ " (did you mean `x`?)" for a mistyped attribute name, or "" when nothing is close."""
    found = difflib.get_close_matches(name, list(candidates), n=2, cutoff=0.75)
    return f" (did you mean {' or '.join(f'`{m}`' for m in found)}?)" if found else ""


def derive_defaults(values: Mapping[str, Any], explicit: Iterable[str]) -> dict[str, Any]:
    """Return `values` with every derivable attribute the user did not set filled in.

    The rules follow Optimum Graphcore: `ipus_per_replica` is `len(layers_per_ipu)`; the inference
    layers copy the training ones; `inference_ipus_per_replica` is `len(inference_layers_per_ipu)` when
    that list was given or when `ipus_per_replica == len(layers_per_ipu)`, else `ipus_per_replica`;
    `inference_matmul_proportion` copies `matmul_proportion` unless that is a list of the wrong length
    for inference, then 0.2. Two additions of ours, in the same spirit: copied inference layers of the
    wrong length for an explicit `inference_ipus_per_replica` become `[-1]` (split evenly), and the
    inference serialization settings copy the training ones (a split list of the wrong length for
    inference is dropped, leaving factor 1).
    """
    explicit = set(explicit)
    v = copy.deepcopy(dict(values))
    layers = v["layers_per_ipu"]
    n_layers = len(layers) if isinstance(layers, list) else 1

    if "inference_layers_per_ipu" not in explicit:
        v["inference_layers_per_ipu"] = copy.deepcopy(layers)
    if "ipus_per_replica" not in explicit:
        v["ipus_per_replica"] = n_layers
    if "inference_ipus_per_replica" not in explicit:
        inference_layers = v["inference_layers_per_ipu"]
        if "inference_layers_per_ipu" in explicit or v["ipus_per_replica"] == n_layers:
            v["inference_ipus_per_replica"] = (
                len(inference_layers) if isinstance(inference_layers, list) else 1
            )
        else:
            v["inference_ipus_per_replica"] = v["ipus_per_replica"]
    elif "inference_layers_per_ipu" not in explicit:
        copied = v["inference_layers_per_ipu"]
        if (
            isinstance(copied, list)
            and not _all_wildcards(copied)
            and len(copied) != v["inference_ipus_per_replica"]
        ):
            v["inference_layers_per_ipu"] = [-1]

    if "inference_matmul_proportion" not in explicit:
        proportion = v["matmul_proportion"]
        wrong_length = isinstance(proportion, list) and len(proportion) != v["inference_ipus_per_replica"]
        v["inference_matmul_proportion"] = (
            DEFAULT_MATMUL_PROPORTION if wrong_length else copy.deepcopy(proportion)
        )

    for kind in _SERIALIZED:
        factor, splits = f"{kind}_serialization_factor", f"serialized_{kind}_splits_per_ipu"
        inf_factor, inf_splits = f"inference_{factor}", f"inference_{splits}"
        if inf_factor not in explicit and inf_splits not in explicit:
            train_splits = v[splits]
            if isinstance(train_splits, list) and len(train_splits) != v["inference_ipus_per_replica"]:
                train_splits = None
            v[inf_splits] = copy.deepcopy(train_splits)
            v[inf_factor] = v[factor]
        else:
            if inf_factor not in explicit:
                v[inf_factor] = 1
            if inf_splits not in explicit:
                v[inf_splits] = None
    return v


# ----- checking values --------------------------------------------------------------------------


def validate_value(name: str, value: Any) -> None:
    """Check one attribute's value on its own: its type and its range, not how it fits the others.

    `None` is accepted where it means "derive it" or "not set" (`NULLABLE`). This is what every
    assignment runs; the rules between attributes wait for `validate_values`, because related
    attributes are usually assigned one at a time.

    Raises:
        IPUConfigTypeError: for a value of the wrong type (also a `TypeError`).
        IPUConfigError: for a value out of range; both name the attribute and the value.
    """
    if value is None and name in NULLABLE:
        return
    FIELDS[name].check(name, value)


# ----- rules between attributes ------------------------------------------------------------------


def _check_layers(values: Mapping[str, Any], prefix: str) -> None:
    name, ipus_name = f"{prefix}layers_per_ipu", f"{prefix}ipus_per_replica"
    layers, ipus = values[name], values[ipus_name]
    if not _all_wildcards(layers) and len(layers) != ipus:
        raise IPUConfigError(  # Optimum Graphcore's sentence first, then ours
            f"{name}={shown(layers)} should use the same number of IPUs as {ipus_name}={ipus}: "
            f"`IPUConfig` attribute `{name}` has {len(layers)} entries but `{ipus_name}` is {ipus}: "
            f"give one entry per IPU, set `{ipus_name}={len(layers)}`, or use [-1] to split the layers evenly."
        )


def _check_matmul(values: Mapping[str, Any], prefix: str) -> None:
    name, ipus_name = f"{prefix}matmul_proportion", f"{prefix}ipus_per_replica"
    proportion, ipus = values[name], values[ipus_name]
    if isinstance(proportion, list) and len(proportion) != ipus:
        raise IPUConfigError(
            f"{name}={shown(proportion)} should use the same number of IPUs as {ipus_name}={ipus}: "
            f"`IPUConfig` attribute `{name}` has {len(proportion)} entries but `{ipus_name}` is {ipus}: "
            "give one value per IPU, or a single number for every IPU."
        )


def _check_serialization(values: Mapping[str, Any], prefix: str, kind: str) -> None:
    factor_name = f"{prefix}{kind}_serialization_factor"
    splits_name = f"{prefix}serialized_{kind}_splits_per_ipu"
    ipus_name = f"{prefix}ipus_per_replica"
    splits, ipus = values[splits_name], values[ipus_name]
    if splits is None:
        return
    if values[factor_name] > 1:  # first: dropping one of the two may settle the length too
        raise IPUConfigError(
            f"Only one of `{factor_name}` and `{splits_name}` should be used at once: `IPUConfig` attributes "
            f"`{factor_name}`={values[factor_name]} and `{splits_name}`={shown(splits)} are alternatives: set one "
            "of them (the factor to 1, or the splits to None)."
        )
    if len(splits) != ipus:
        raise IPUConfigError(
            f"{splits_name}={shown(splits)} should use the same number of IPUs as {ipus_name}={ipus}: "
            f"`IPUConfig` attribute `{splits_name}` has {len(splits)} entries but `{ipus_name}` is {ipus}: "
            "give the number of splits on every IPU of the pipeline (0 where there are none)."
        )


def validate_values(values: Mapping[str, Any]) -> None:
    """Check every value, then every rule between attributes, in both modes; raise on the first break.

    The mode is not involved: an error names the attribute of the mode it concerns (`layers_per_ipu`
    or `inference_layers_per_ipu`), whichever mode the config is in.

    Raises:
        IPUConfigTypeError, IPUConfigError: as `validate_value`, or for two attributes that disagree.
    """
    for name in FIELD_NAMES:
        validate_value(name, values[name])
    for prefix in ("", "inference_"):
        _check_layers(values, prefix)
        _check_matmul(values, prefix)
        for kind in _SERIALIZED:
            _check_serialization(values, prefix, kind)


def values_with_defaults(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every field's value for a new config: those given in `values`, each checked, the defaults for
    the others. `None` for a list or dict default, or Optimum Graphcore 0.7's "not set", is the default."""
    given = {}
    for name, field in FIELDS.items():
        value = values.get(name, field.init_default)
        if value is None and (field.none_is_default or field.init_default is None and not field.accepts_none):
            value = copy.deepcopy(field.default)
        validate_value(name, value)
        given[name] = value
    return given


def replicas_for_n_ipu(n_ipu: Any, ipus_per_replica: int, inference_ipus_per_replica: int) -> tuple[int, int]:
    """The (training, inference) replication factors that fill `n_ipu` IPUs (`IPUConfig.for_n_ipu`).

    Training must use every IPU, so `n_ipu` must be a multiple of `ipus_per_replica`. Inference takes
    as many whole replicas as fit (at least one) and says so when IPUs are left idle.

    Raises:
        IPUConfigError: naming `n_ipu` and the IPUs per replica when they do not divide or fit.
    """
    ipus, inference_ipus = ipus_per_replica, inference_ipus_per_replica
    if not isinstance(n_ipu, int) or n_ipu < 1 or n_ipu % ipus:
        raise IPUConfigError(
            f"n_ipu={n_ipu} is not a multiple of ipus_per_replica={ipus}: replication_factor = n_ipu // "
            f"ipus_per_replica must use every IPU. Use n_ipu a multiple of {ipus}, or change ipus_per_replica."
        )
    if n_ipu < inference_ipus:
        raise IPUConfigError(
            f"n_ipu={n_ipu} is smaller than inference_ipus_per_replica={inference_ipus}: one inference "
            "replica does not fit."
        )
    if n_ipu % inference_ipus:
        logger.warning(
            "n_ipu=%d is not a multiple of inference_ipus_per_replica=%d: inference uses %d replicas and "
            "leaves %d IPUs idle.", n_ipu, inference_ipus, n_ipu // inference_ipus, n_ipu % inference_ipus,
        )  # fmt: skip
    return n_ipu // ipus, n_ipu // inference_ipus
