"""Reading an IPU config's file or dict into the settings `IPUConfig` is built from.

What a file can get wrong is named here, before any attribute is checked: text that is not UTF-8,
text that is not JSON, JSON that is not an object, a model's `config.json` given in place of the IPU
config, unknown keys under `strict=True`. Old files (pod-keyed values, deprecated keys) are
normalized by `legacy.py` with one warning. `IPUConfig.from_pretrained` and `from_dict` call this;
the attribute rules are `schema.py`'s.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from optimum_ipu.configuration.legacy import METADATA_KEYS, normalize_config_dict
from optimum_ipu.configuration.schema import IPUConfigError, close_matches

logger = logging.getLogger(__name__)

__all__ = ["read_json", "settings_from_raw", "token_from_overrides"]


def read_json(path: Path, origin: str) -> Any:
    """The JSON value in the file at `path` (`origin` names it in errors)."""
    try:
        return json.loads(_read_text(path, origin))
    except json.JSONDecodeError as error:
        raise IPUConfigError(
            f"IPU config {origin} is not valid JSON: {error}. Fix the file there (keys and strings in double "
            'quotes, no trailing commas, e.g. {"layers_per_ipu": [0, 4, 4, 4]}), or give another config.'
        ) from None


def _read_text(path: Path, origin: str) -> str:
    """The file's text as UTF-8 (JSON's encoding); an `IPUConfigError` naming the file for UTF-16 or binary."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")  # a byte order mark (Windows editors write one) is skipped
    except UnicodeDecodeError as error:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise IPUConfigError(
                f"IPU config {origin} is UTF-16 text (a byte order mark starts it), not UTF-8: save it as UTF-8 "
                "(in PowerShell, Set-Content -Encoding utf8; in an editor, the encoding menu)."
            ) from None
        raise IPUConfigError(
            f"IPU config {origin} is not text in UTF-8 ({error.reason} at byte {error.start}): give the "
            'ipu_config.json of an IPU config (a JSON object such as {"layers_per_ipu": [0, 4, 4, 4]}).'
        ) from None


def settings_from_raw(
    raw: Any, origin: str, pod_type: str | None, n_ipu: int | None, strict: bool
) -> dict[str, Any]:
    """The `IPUConfig` keyword arguments a (possibly legacy) dict holds; what was dropped or read
    differently is said in one warning, and a dict that is no IPU config is refused by name."""
    if not isinstance(raw, dict):
        raise IPUConfigError(f"IPU config {origin} is not a JSON object but a {type(raw).__name__}.")
    normalized = normalize_config_dict(raw, pod_type=pod_type, n_ipu=n_ipu)
    # transformers writes `transformers_version` into every model config.json: a metadata key, quietly
    # ignored, so it must not count as a key that makes the file an IPU config.
    settings = [key for key in raw if key not in METADATA_KEYS]
    if settings and len(normalized.unknown) == len(settings) and ("model_type" in raw or "architectures" in raw):
        model_type = raw.get("model_type", "?")
        raise IPUConfigError(
            f"IPU config {origin} is a model's configuration (model_type {model_type!r}), not an IPU config: "
            "none of its keys is an `IPUConfig` attribute. Give the IPU config instead: a folder or file "
            "holding ipu_config.json, or a Hub id such as Graphcore/bert-base-ipu."
        )
    if strict and normalized.unknown:
        raise IPUConfigError(
            f"IPU config {origin} has unknown keys: "
            + ", ".join(f"`{k}`{close_matches(k)}" for k in normalized.unknown)
            + " (strict=True). Remove them, or load with strict=False to ignore them with a warning."
        )
    message = normalized.message(origin)
    if message:
        logger.warning(message)
    return normalized.values


def token_from_overrides(token: str | bool | None, overrides: dict[str, Any]) -> str | bool | None:
    """The Hub token, reading `use_auth_token` (Optimum Graphcore's and older transformers' spelling, which
    their example scripts pass) out of `overrides` as `token`, with a warning."""
    if "use_auth_token" not in overrides:
        return token
    old_token = overrides.pop("use_auth_token")
    if isinstance(old_token, str) and token is not None and old_token != token:
        raise ValueError("Pass either `token=` or its older spelling `use_auth_token=`, not both.")
    if old_token is not None:
        logger.warning("`use_auth_token` is deprecated in transformers v5; read as `token=`.")
    return token if token is not None else old_token
