"""Finding an `ipu_config.json`: a local path, the Hugging Face Hub (or its cache), or a bundled copy.

The Graphcore Hub configs that Optimum Graphcore scripts name (`Graphcore/bert-base-ipu`, ...) ship
with the package, so those scripts run offline. The order is: a local folder holding
`ipu_config.json` or a path to a JSON file; else the Hub through `huggingface_hub.hf_hub_download`
(its cache, revision, token and offline mode honoured; when the Hub answers its file wins); else the
bundled copy. An unknown name fails with the list of bundled names.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from optimum_ipu._quoting import shown
from optimum_ipu.configuration.schema import CONFIG_NAME

__all__ = [
    "ConfigFile",
    "IPUConfigNotFoundError",
    "bundled_config_names",
    "bundled_config_path",
    "resolve_config_file",
]

logger = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class IPUConfigNotFoundError(FileNotFoundError):
    """No `ipu_config.json` for a name: not a local path, not on the Hub or in its cache, not bundled."""


@dataclass(frozen=True)
class ConfigFile:
    """A resolved `ipu_config.json`.

    Attributes:
        path: the file on disk.
        source: "local" (a path the user gave), "hub" (downloaded, or confirmed current, from the Hub),
            "hub-cache" (the Hugging Face cache, offline) or "bundled" (shipped with optimum-ipu).
        name: the name or path that was asked for.
    """

    path: Path
    source: str
    name: str


def bundled_config_dirs() -> list[Path]:
    """Folders of bundled configs: inside the installed package first, then the repository's `configs/`."""
    package = Path(__file__).resolve().parents[1]  # optimum_ipu/, found without importing the package
    return [d for d in (package / "configs", package.parent / "configs") if d.is_dir()]


def bundled_config_names() -> list[str]:
    """Hub ids with a bundled copy, e.g. `["Graphcore/bert-base-ipu", ...]`, sorted."""
    names = set()
    for root in bundled_config_dirs():
        for path in root.glob(f"*/*/{CONFIG_NAME}"):
            names.add(f"{path.parent.parent.name}/{path.parent.name}")
    return sorted(names)


def bundled_config_path(name: str) -> Path | None:
    """The bundled `ipu_config.json` for Hub id `name` (case-insensitive), or None."""
    if not _REPO_ID.match(name) or ".." in name:
        return None
    wanted = name.lower()
    for root in bundled_config_dirs():
        for path in root.glob(f"*/*/{CONFIG_NAME}"):
            if f"{path.parent.parent.name}/{path.parent.name}".lower() == wanted:
                return path
    return None


def _looks_like_path(text: str) -> bool:
    return (
        text.startswith((".", "~", "/", os.sep))
        or text.endswith(".json")
        or os.path.isabs(text)
        or text.count("/") > 1
    )


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _download(repo_id: str, **kwargs) -> str:
    """`hf_hub_download` of the config file (one seam, so tests can stand in for the Hub)."""
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo_id, CONFIG_NAME, **kwargs)


def _not_found(name: str, reason: str) -> IPUConfigNotFoundError:
    names = "\n  ".join(bundled_config_names()) or "(none)"
    return IPUConfigNotFoundError(
        f"No {CONFIG_NAME} for {shown(name)}: {reason}. Give a folder holding {CONFIG_NAME}, a path to a JSON "
        f"file, a Hub repo id, or one of the bundled configs:\n  {names}"
    )


def resolve_config_file(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
) -> ConfigFile:
    """Find the `ipu_config.json` for a folder, a JSON file path or a Hub repo id.

    The bundled copy is used only when the Hub cannot answer (offline mode or `local_files_only` with
    nothing cached, no network, or the repo gone) and no particular `revision` was asked for.

    Raises:
        IPUConfigNotFoundError: when nothing is found; the message lists the bundled names.
    """
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / CONFIG_NAME).is_file():
            return ConfigFile(path / CONFIG_NAME, "local", text)
        reason = f"the folder {path} has no {CONFIG_NAME}"
        if (path / "config.json").is_file():  # a model folder: its config.json is not the IPU config
            reason += " (its config.json is a model's configuration, not an IPU config)"
        raise _not_found(text, reason)
    if path.is_file():
        return ConfigFile(path, "local", text)
    if _looks_like_path(text):
        raise _not_found(text, "no such file or folder")

    offline = local_files_only or _hub_offline()
    try:
        downloaded = _download(
            text, revision=revision, token=token, cache_dir=cache_dir, local_files_only=offline
        )
        return ConfigFile(Path(downloaded), "hub-cache" if offline else "hub", text)
    except Exception as error:  # noqa: BLE001 - any Hub failure falls back to the bundled copy
        hub_error = error

    bundled = bundled_config_path(text)
    reason = (
        "not in the Hugging Face cache and the Hub is off (HF_HUB_OFFLINE or local_files_only)"
        if offline
        else f"the Hub did not serve it ({type(hub_error).__name__}: {str(hub_error).splitlines()[0] if str(hub_error) else ''})"
    )
    if bundled is None or revision not in (None, "main"):
        if bundled is not None:
            reason += f"; the bundled copy is not used because revision={revision!r} was asked for"
        raise _not_found(text, reason) from hub_error
    log = logger.info if offline else logger.warning
    log("IPU config %s: %s; using the copy bundled with optimum-ipu (%s).", text, reason, bundled)
    return ConfigFile(bundled, "bundled", text)
