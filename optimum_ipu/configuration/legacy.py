"""Reading `ipu_config.json` files written by older Optimum Graphcore releases.

Hub configs outlived several schema changes: values keyed by pod type (`{"pod4": 1, "pod16": 4,
"default": 1}`), keys that were later removed, `embedding_serialization_factor: 0` for "off". The last
original release rejected unknown keys outright, which broke many Hub configs until they were edited;
here every such file loads, and what was converted or ignored is reported once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optimum_ipu._quoting import shown
from optimum_ipu.configuration.schema import (
    FIELD_NAMES,
    FIELDS,
    UNSET_MEANS_ONE,
    IPUConfigError,
    close_matches,
)

# Keys older releases wrote that no longer mean anything; dropped with a note saying why.
DEPRECATED_KEYS: dict[str, str] = {
    "enable_half_first_order_momentum": "optimizer state precision follows the training precision",
    "sharded_execution_for_inference": "inference always runs sharded",
    "profile_dir": "there are no PopVision profiles on a simulated IPU",
    "use_popdist": "replicas scale out over torch.distributed",
    "decompose_grad_sum": "gradient reduction is exact on a simulated IPU",
    "compile_only": "it is the --compile_only training argument now",
    "execute_encoder_on_cpu_for_generation": "the simulator places the whole model",
}
# Bookkeeping some writers add; silently ignored.
METADATA_KEYS = frozenset({"optimum_version", "transformers_version", "optimum_ipu_version"})
# Dict-valued attributes that are never pod-keyed.
_DICT_FIELDS = frozenset(name for name, spec in FIELDS.items() if isinstance(spec.default, dict))
_POD_KEY = re.compile(r"^(pod\d+|default)$")
_POD_TYPE = re.compile(r"^pod(\d+)$")


def n_ipu_from_pod_type(pod_type: str) -> int:
    """Number of IPUs of a pod type: "pod16" -> 16.

    Raises:
        IPUConfigError: when `pod_type` is not `podN` with N a power of two.
    """
    match = _POD_TYPE.match(str(pod_type))
    n = int(match.group(1)) if match else 0
    if n < 1 or n & (n - 1):
        raise IPUConfigError(
            f"pod_type {shown(pod_type)} is not a pod: write podN with N a power of two (pod4, pod16, pod64), "
            "or give the number of IPUs with n_ipu."
        )
    return n


def is_pod_keyed(name: str, value: Any) -> bool:
    """Whether `value` is an old per-pod-type dict such as `{"pod16": 4, "default": 1}`."""
    return (
        name not in _DICT_FIELDS
        and isinstance(value, dict)
        and bool(value)
        and all(_POD_KEY.match(str(key)) for key in value)
    )


@dataclass
class NormalizedConfig:
    """A raw config dict made current.

    Attributes:
        values: the known attributes, ready for `IPUConfig(**values)`.
        notes: one phrase per legacy conversion that was applied.
        unknown: keys that are not `IPUConfig` attributes (dropped).
    """

    values: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def message(self, origin: str) -> str | None:
        """The single warning for this file, or None when it was current."""
        parts = []
        if self.notes:
            parts.append("converted legacy settings: " + "; ".join(self.notes))
        if self.unknown:
            named = ", ".join(f"`{key}`{close_matches(key)}" for key in self.unknown)
            parts.append(f"ignored unknown keys: {named}")
        if not parts:
            return None
        return (
            f"IPU config {origin}: " + ". ".join(parts) + ". Save it again with `IPUConfig.save_pretrained` "
            "to write the current format."
        )


def normalize_config_dict(
    raw: Mapping[str, Any], *, pod_type: str | None = None, n_ipu: int | None = None
) -> NormalizedConfig:
    """Resolve pod-keyed values, drop deprecated and unknown keys, read serialization factor 0 as 1.

    A pod-keyed value takes the entry for `pod_type`, else for `pod{n_ipu}`, else `"default"`.

    Raises:
        IPUConfigError: when a pod-keyed value has neither the requested pod nor a "default" entry.
    """
    if pod_type is not None:
        n_ipu_from_pod_type(pod_type)
        pod_key = pod_type
    else:
        pod_key = f"pod{n_ipu}" if n_ipu else "default"

    result = NormalizedConfig(values={})
    pod_resolved, deprecated = [], []
    for name, value in raw.items():
        if name in METADATA_KEYS:
            continue
        if name in DEPRECATED_KEYS:
            deprecated.append(f"{name} ({DEPRECATED_KEYS[name]})")
            continue
        if name not in FIELD_NAMES:
            result.unknown.append(name)
            continue
        if is_pod_keyed(name, value):
            key = pod_key if pod_key in value else "default"
            if key not in value:
                asked = "no pod size was given" if pod_key == "default" else f"{pod_key} was asked for"
                raise IPUConfigError(
                    f"`IPUConfig` attribute `{name}` is keyed by pod type ({', '.join(sorted(value))}) and has no "
                    f"'default' entry, and {asked}: give the pod size as one of those keys (--pod_type, or "
                    "pod_type= in Python; the IPU count, n_ipu, works too)."
                )
            value = value[key]
            pod_resolved.append(f"{name}={value!r}" + ("" if key == pod_key else f" (from {key!r})"))
        if name in UNSET_MEANS_ONE and value is None:
            continue  # Optimum Graphcore 0.7 wrote `null` for "not set": the default applies
        if name.endswith("_serialization_factor") and value == 0 and not isinstance(value, bool):
            result.notes.append(f"{name} 0 read as 1 (no serialization)")
            value = 1
        result.values[name] = value
    if pod_resolved:
        result.notes.insert(0, f"pod-keyed values resolved for {pod_key!r}: " + ", ".join(pod_resolved))
    if deprecated:
        result.notes.append("deprecated keys dropped: " + ", ".join(deprecated))
    return result
