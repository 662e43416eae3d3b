"""`IPUConfig`: how a model is laid out and batched on IPUs, saved beside it as `ipu_config.json`.

The attribute names, defaults and file format are Optimum Graphcore's, so its Hub configs and scripts
work unchanged. What is ours: legacy files load with one warning instead of an error, overrides
re-run the derived defaults and the cross-field checks, and a config remembers where it came from.

The rules of what is valid live in `schema.py`, old-file handling in `legacy.py`, the
`--ipu_config_overrides` syntax in `parsing.py`, where a name is looked up in `hub.py`, and the one
sequence every entry point loads a run's config with in `loading.py`.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import os
from pathlib import Path
from typing import Any, ClassVar

from optimum_ipu._quoting import clipped, shown
from optimum_ipu.call_layout import CallLayout
from optimum_ipu.configuration.legacy import n_ipu_from_pod_type
from optimum_ipu.configuration.parsing import parse_overrides
from optimum_ipu.configuration.reading import read_json, settings_from_raw, token_from_overrides
from optimum_ipu.configuration.schema import (
    CONFIG_NAME,
    DERIVABLE,
    FIELD_DEFAULTS,
    FIELD_NAMES,
    FIELDS,
    MODE_MANAGED,
    MODES,
    PLACEMENT_MANAGED,
    UNSET_MEANS_ONE,
    IPUConfigError,
    attribute_for_mode,
    close_matches,
    derive_defaults,
    replicas_for_n_ipu,
    validate_value,
    validate_values,
    values_with_defaults,
)

__all__ = ["CONFIG_NAME", "IPUConfig", "IPUConfigError", "n_ipu_from_pod_type"]

logger = logging.getLogger(__name__)

# Public attributes that are not part of the JSON.
_BOOKKEEPING = ("source", "source_path")


class _ModeManaged:
    """Reads the attribute `field` stands for in the config's mode: `inference_<field>` in inference mode.

    Installed under the plain name and, for the placement settings, under Optimum Graphcore's
    `_<field>` spelling too. A data descriptor, so it wins over the instance dict, where the training
    value is kept under the plain name (`vars(config)` and `to_dict()` show the raw values of both modes).
    """

    def __init__(self, field: str) -> None:
        self.field = field

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return obj.__dict__[attribute_for_mode(self.field, obj.__dict__.get("_mode"))]

    def __set__(self, obj: Any, value: Any) -> None:  # IPUConfig.__setattr__ handles assignment
        obj.__setattr__(self.field, value)


class _Modes:
    """A config's mode, "training" or "inference", and the names it reads in each: `IPUConfig`'s mode API
    (Optimum Graphcore's `train()`, `eval()`, `mode` and `_get_managed_attr_mode_name`)."""

    modes: ClassVar[tuple[str, ...]] = MODES

    @property
    def mode(self) -> str:
        """ "training" or "inference": which value the mode-managed attributes read and write.

        Setting it to anything else raises `IPUConfigError` (a `ValueError`); nothing is validated on
        a switch, since construction and `update()` check both modes.
        """
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in self.modes:
            raise IPUConfigError(  # Optimum Graphcore's sentence first, then ours
                f"`IPUConfig` mode can only take values in {self.modes}: got {shown(value)}. "
                "Switch with `ipu_config.train()` or `ipu_config.eval()`."
            )
        object.__setattr__(self, "_mode", value)

    def train(self):
        """Switch to training mode; returns self."""
        self.mode = "training"
        return self

    def eval(self):
        """Switch to inference mode (managed attributes read their `inference_` twin); returns self."""
        self.mode = "inference"
        return self

    def _get_managed_attr_mode_name(self, attr: str) -> str:
        """The attribute `attr` stands for in the current mode: `inference_<attr>` in inference mode.

        Unchanged for an attribute without an `inference_` twin, or in training mode. Optimum
        Graphcore's model code (and ours, in messages) uses it to name the attribute in use.
        """
        return attribute_for_mode(attr, self._mode)


class IPUConfig(_Modes):
    """An Optimum Graphcore IPU configuration: pipelining, replication, batching and memory settings.

    Attributes are those of `ipu_config.json`, declared once in `schema.FIELDS` (name, default, type,
    check), from which the constructor's signature, the attributes and `to_dict()` are made. A config
    has a mode, one of `IPUConfig.modes` ("training", "inference"; `train()` / `eval()` or
    `config.mode = ...`). The attributes with an `inference_` twin
    (`layers_per_ipu`, `ipus_per_replica`, `matmul_proportion`, `replication_factor`,
    `device_iterations`, the serialization settings, `parallelize_kwargs`) read as the twin in
    inference mode, under the plain name and, for the placement settings, under Optimum Graphcore's
    `_<name>` spelling (`config.eval()._layers_per_ipu` is `inference_layers_per_ipu`). Assigning a
    managed name in inference mode sets the twin, symmetrically. `gradient_accumulation_steps` is not
    managed: nothing reads it in inference (`batch_size_factor(for_inference=True)` leaves it out).

    Every assignment checks the value's type and range at once, naming the attribute written
    (`inference_layers_per_ipu` in inference mode). The rules between attributes (one
    `matmul_proportion` per IPU, ...) run on construction, `update(**values)` (which also re-derives
    the dependent defaults, atomically) and `validate()`. `source` / `source_path` say where a loaded
    config came from ("local", "hub", "hub-cache" or "bundled"); they are not written to the JSON.
    """

    def __init__(self, **values: Any) -> None:
        """Build a config from keyword values (the fields of `schema.FIELDS`, whose defaults apply to
        the others); `None` on a derivable attribute derives it. Raises `IPUConfigError` if invalid.

        The signature (`inspect.signature(IPUConfig)`, `help(IPUConfig)`) is made from `schema.FIELDS`
        below the class, so a field is declared in one place.
        """
        unknown = next((name for name in values if name not in FIELDS), None)
        if unknown is not None:  # the error Python gives for a keyword a signature lacks
            raise TypeError(
                f"{type(self).__name__}.__init__() got an unexpected keyword argument {shown(unknown)}"
                f"{close_matches(str(unknown))}"
            )
        given = values_with_defaults(values)
        object.__setattr__(self, "_mode", "training")
        object.__setattr__(self, "_explicit", {name for name in DERIVABLE if given[name] is not None})
        object.__setattr__(self, "source", None)
        object.__setattr__(self, "source_path", None)
        self.__dict__.update(copy.deepcopy(given))
        self._refresh()

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "mode":
            object.__setattr__(self, name, value)  # the property checks it
            return
        if name.startswith("_") and name[1:] in PLACEMENT_MANAGED:  # Optimum Graphcore's `_layers_per_ipu`
            name = name[1:]
        if name in FIELD_DEFAULTS:
            name = self._get_managed_attr_mode_name(name)
            if value is None and name in UNSET_MEANS_ONE:
                value = 1
            validate_value(name, value)
            self.__dict__[name] = value
            if name in DERIVABLE:  # set to None, it goes back to being derived, at once
                (self._explicit.add if value is not None else self._explicit.discard)(name)
                if value is None:
                    self.__dict__[name] = derive_defaults(self.to_dict(), self._explicit)[name]
        elif name in _BOOKKEEPING or name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            raise AttributeError(f"`IPUConfig` has no attribute `{clipped(name)}`{close_matches(name)}.")

    # ----- values --------------------------------------------------------------------------------

    def _refresh(self) -> None:
        values = derive_defaults(self.to_dict(), self._explicit)
        validate_values(values)
        self.__dict__.update(values)

    def validate(self) -> None:
        """Check every value and the rules between attributes, in both modes, whatever the current mode.

        Assignment checks one value at a time; call this after assigning related attributes directly
        (e.g. `layers_per_ipu` and then `ipus_per_replica`). The mode is left as it was, also on error.

        Raises:
            IPUConfigError: naming the attribute of the mode at fault (e.g. `inference_layers_per_ipu`).
        """
        validate_values(self.to_dict())

    def update(self, **values: Any) -> IPUConfig:
        """Set attributes, re-derive the dependent defaults and validate; all or nothing. Returns self.

        A mode-managed name sets the value of the current mode, as assignment does.

        Raises:
            IPUConfigError: for an unknown name or an invalid result (the config is left unchanged).
        """
        unknown = [name for name in values if name not in FIELD_DEFAULTS]
        if unknown:
            raise IPUConfigError(
                "Unknown `IPUConfig` attributes: "
                + ", ".join(f"`{clipped(n)}`{close_matches(n)}" for n in unknown)
                + "."
            )
        snapshot = copy.deepcopy(self.__dict__)
        try:
            for name, value in values.items():
                setattr(self, name, copy.deepcopy(value))
            self._refresh()
        except Exception:
            self.__dict__.clear()
            self.__dict__.update(snapshot)
            raise
        return self

    def update_from_string(self, update_str: str) -> IPUConfig:
        """Apply `--ipu_config_overrides`, e.g. `"embedding_serialization_factor=2,matmul_proportion=[0.1 0.2]"`.

        Each value is read by the type of the attribute's current value (in the current mode); a list
        may replace a number, `None` unsets, and an unset value takes the type its text shows.
        Returns self.

        Raises:
            IPUConfigError: naming the key and the value and showing the accepted forms.
        """
        return self.update(**parse_overrides(update_str, FIELD_NAMES, lambda name: getattr(self, name)))

    def batch_size_factor(self, for_inference: bool = False) -> int:
        """Samples per host call per micro-batch sample: the micro-batches of the call this config describes
        (`CallLayout.from_ipu_config`). Independent of the current mode."""
        return CallLayout.from_ipu_config(self, for_inference).micro_batches

    def describe_combined_batch(self, micro_batch: int = 1, for_inference: bool = False) -> str:
        """The combined-batch arithmetic as text, e.g. "micro-batch 2 × gradient accumulation 16 × ... = 128"."""
        return CallLayout.from_ipu_config(self, for_inference).describe(micro_batch, training=not for_inference)

    def num_ipus(self, for_inference: bool = False) -> int:
        """IPUs used in all: replicas × IPUs per replica, for training or inference."""
        prefix = "inference_" if for_inference else ""
        return self.__dict__[f"{prefix}replication_factor"] * self.__dict__[f"{prefix}ipus_per_replica"]

    def for_n_ipu(self, n_ipu: int) -> IPUConfig:
        """Fill `n_ipu` IPUs with replicas: `replication_factor = n_ipu // ipus_per_replica`. Returns self.

        Training must use every IPU, so `n_ipu` must be a multiple of `ipus_per_replica`. Inference
        takes as many whole replicas as fit (at least one) and says so when IPUs are left idle.

        Raises:
            IPUConfigError: naming `n_ipu` and `ipus_per_replica` when they do not divide.
        """
        v = self.__dict__
        training, inference = replicas_for_n_ipu(n_ipu, v["ipus_per_replica"], v["inference_ipus_per_replica"])
        return self.update(replication_factor=training, inference_replication_factor=inference)

    # ----- PopTorch ------------------------------------------------------------------------------

    def to_options(self, for_inference: bool = False, compile_only: bool = False):
        """The `poptorch.Options` for this config, built as Optimum Graphcore 0.7 built them.

        Training (default) or inference (`for_inference=True`: the `inference_*` values, sharded
        execution, every output returned); the mapping is listed in `optimum_ipu.poptorch.ipu_options`.
        The config's mode is left as it was.
        """
        # The one import from this layer up to the PopTorch front end (allowed in tests/test_layers.py's
        # BRIDGES): Optimum Graphcore's API returns a poptorch.Options from a config, so the config must
        # reach PopTorch; importing it here, at call time, keeps `import optimum_ipu.configuration` light.
        from optimum_ipu.poptorch.ipu_options import options_from_ipu_config

        return options_from_ipu_config(self, for_inference=for_inference, compile_only=compile_only)

    _to_options = to_options  # the original's private name, which its trainer called

    # ----- serialization -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """All attributes of both modes under their JSON names (raw values, whatever the mode)."""
        return {name: copy.deepcopy(self.__dict__[name]) for name in FIELD_NAMES}

    def to_json_string(self) -> str:
        """The `ipu_config.json` text: sorted keys, two-space indent, trailing newline."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def save_pretrained(self, save_directory: str | os.PathLike) -> Path:
        """Write `ipu_config.json` into `save_directory` (created if needed); return the file's path."""
        path = Path(save_directory) / CONFIG_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json_string())
        logger.info("IPU config saved in %s", path)
        return path

    @classmethod
    def from_dict(
        cls,
        config_dict: dict[str, Any],
        *,
        pod_type: str | None = None,
        n_ipu: int | None = None,
        strict: bool = False,
        **overrides: Any,
    ) -> IPUConfig:
        """Build a config from a (possibly legacy) dict, then apply keyword `overrides`.

        Pod-keyed values take the entry for `pod_type` (or `pod{n_ipu}`, else "default"); deprecated
        keys are dropped; serialization factor 0 reads as 1; unknown keys are dropped. All of that is
        reported in one warning. With `strict=True` unknown keys raise instead.
        """
        return cls._from_raw(config_dict, "(from a dict)", pod_type, n_ipu, strict, overrides)

    @classmethod
    def _from_raw(cls, raw, origin, pod_type, n_ipu, strict, overrides) -> IPUConfig:
        try:
            config = cls(**settings_from_raw(raw, origin, pod_type, n_ipu, strict))
        except IPUConfigError as error:  # the same class, so a wrong type is still a TypeError
            prefix = f"IPU config {origin}"
            message = str(error)  # named once: the reading's own errors start with it already
            raise type(error)(message if message.startswith(prefix) else f"{prefix}: {message}") from None
        return config.update(**overrides) if overrides else config

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool = False,
        pod_type: str | None = None,
        n_ipu: int | None = None,
        strict: bool = False,
        **overrides: Any,
    ) -> IPUConfig:
        """Load `ipu_config.json` from a local folder or file, the Hub (or its cache), or the bundled copy.

        Args:
            name_or_path: a folder holding `ipu_config.json`, a path to a JSON file, or a Hub repo id
                such as `Graphcore/bert-base-ipu`.
            revision, token, cache_dir, local_files_only: passed to `huggingface_hub.hf_hub_download`.
            pod_type, n_ipu: choose the entry of old pod-keyed values (they do not set replication;
                `for_n_ipu` and the training arguments do).
            strict: raise on unknown keys instead of warning.
            **overrides: attribute values applied after loading, with derived defaults and
                cross-field validation re-run. `use_auth_token` (Optimum Graphcore's and older
                transformers' spelling of `token`, which their example scripts pass) is read as
                `token`, with a warning.

        Raises:
            IPUConfigError: for an invalid file or override.
            FileNotFoundError: when no config is found (the message lists the bundled names).
        """
        from optimum_ipu.configuration.hub import resolve_config_file

        token = token_from_overrides(token, overrides)
        found = resolve_config_file(
            name_or_path,
            revision=revision,
            token=token,
            cache_dir=cache_dir,
            local_files_only=local_files_only,
        )
        origin = f"{found.path} ({found.source})"
        raw = read_json(Path(found.path), origin)
        config = cls._from_raw(raw, origin, pod_type, n_ipu, strict, overrides)
        config.source, config.source_path = found.source, str(found.path)
        return config

    # ----- object protocol -----------------------------------------------------------------------

    def copy(self) -> IPUConfig:
        """A deep copy, keeping the mode, the source and which values were given explicitly."""
        clone = type(self).__new__(type(self))
        clone.__dict__.update(copy.deepcopy(self.__dict__))
        return clone

    def __eq__(self, other: object) -> bool:
        """Equal when every attribute of both modes is equal (mode and source are not compared)."""
        if not isinstance(other, IPUConfig):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"{type(self).__name__} {self.to_json_string()}"


def _init_signature() -> inspect.Signature:
    """`IPUConfig.__init__`'s signature from `schema.FIELDS`: keyword-only, with their defaults and types."""
    fields = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=f.init_default, annotation=f.annotation
        )
        for name, f in FIELDS.items()
    ]
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return inspect.Signature([self, *fields], return_annotation="None")


IPUConfig.__init__.__signature__ = _init_signature()
for _name in MODE_MANAGED:
    setattr(IPUConfig, _name, _ModeManaged(_name))
for _name in PLACEMENT_MANAGED:
    setattr(IPUConfig, f"_{_name}", _ModeManaged(_name))
del _name
