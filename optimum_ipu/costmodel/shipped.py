"""Profiles of the presets, traced ahead of time and shipped inside the package.

A first `optimum-ipu plan` of a preset would otherwise spend seconds importing torch and the
transformers modelling code just to trace one micro-batch on the meta device. For every preset with
its default head (and the BERT pretraining heads), training and inference, fp16 and fp32, and the
usual sequence lengths (`SEQ_LENS`; a vision model's own image size), the package ships the traced
profiles at micro-batches 1, 2 and 4 (`profiles/*.json.gz`, about 1 KB each once compressed).

Other micro-batches are derived, not traced: every quantity a profile holds is either independent of
the micro-batch (parameters, operation counts) or proportional to it (FLOPs, bytes, one dimension of
each matrix product), so it is an affine function of the micro-batch size and the profiles at 2 and 4
determine it for any size >= 2. `derive_micro_batch` refuses (returns None) when a value does not
follow that rule exactly, and the caller then traces. Size 1 is shipped as traced because a tensor of
one element is not counted as moved data, a kink at 1.

The shipped set records the hash of the tracer's source (`trace.py`, `profile.py`, `presets.py`): a profile traced
by another tracer is never used, and `python tools/trace_shipped_profiles.py` traces them again. The
torch and transformers versions they were traced with are recorded, and a shipped profile is used only
where it is proven: with a transformers release from `LOWEST_PROVEN_TRANSFORMERS` (the lowest that
`pyproject.toml` admits) up to the release they were traced with. CI compares shipped profiles with
fresh traces on both ends (`tests/costmodel/test_shipped.py`); outside that range the model is traced
(once, then cached), because the modelling code of another release may give other shapes.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optimum_ipu.costmodel.profile import ModelProfile

SHIPPED_DIR = Path(__file__).parent / "profiles"
SEQ_LENS = (128, 384, 512)
MICRO_BATCHES = (1, 2, 4)
_TRACER_SOURCES = ("trace.py", "profile.py", "presets.py")  # presets.py builds the traced models
# Heads shipped besides each preset's default: what the calibration's published BERT runs train.
_EXTRA_TASKS = {"bert-base-uncased": ("pretraining",), "bert-large-uncased": ("pretraining",)}


# The lowest transformers release the shipped profiles are checked against (CI's second leg).
LOWEST_PROVEN_TRANSFORMERS = "5.18"


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string: "5.24.0" -> (5, 24), "5.25.0.dev0" -> (5, 25)."""
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in version.split(".")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def proven_for(installed: str, traced: str) -> bool:
    """Whether profiles traced with transformers `traced` are proven for the `installed` release."""
    return _release(LOWEST_PROVEN_TRANSFORMERS) <= _release(installed) <= _release(traced)


def tracer_hash() -> str:
    here = Path(__file__).parent
    return hashlib.sha256(b"".join((here / name).read_bytes() for name in _TRACER_SOURCES)).hexdigest()


def _model_key(config: Mapping[str, Any], builder: str) -> str:
    text = json.dumps({"config": config, "builder": builder}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _shape_key(seq_len: int | None, image_size: int | None, training: bool, float_bytes: int) -> str:
    return f"seq={seq_len},image={image_size},training={int(training)},float={float_bytes}"


def canonical(profile: ModelProfile) -> ModelProfile:
    """`profile` with its transfers' tensor ids renumbered 0, 1, ... in order of first appearance.

    The tracer names tensors by storage address, which changes from run to run; only which transfers
    share a tensor matters, so canonical ids make profiles of two runs compare equal.
    """
    data = profile.to_dict()
    ids: dict[int, int] = {}
    for transfer in data["transfers"]:
        transfer["tensor"] = ids.setdefault(transfer["tensor"], len(ids))
    return ModelProfile.from_dict(data)


def _affine(at2: Any, at4: Any, size: int) -> Any:
    """The value at micro-batch `size` of a quantity worth `at2` at 2 and `at4` at 4, or raise ValueError."""
    if isinstance(at2, bool) or isinstance(at2, str) or at2 is None:
        if at2 != at4:
            raise ValueError("a non-numeric field depends on the micro-batch")
        return at2
    if isinstance(at2, (int, float)):
        step = (at4 - at2) * (size - 2)
        if step % 2:
            raise ValueError("not an integer at this micro-batch")
        value = at2 + step // 2
        if value < 0:
            raise ValueError("negative")
        return value
    if isinstance(at2, dict):
        if at2.keys() != at4.keys():
            raise ValueError("different fields")
        return {k: _affine(at2[k], at4[k], size) for k in at2}
    if isinstance(at2, (list, tuple)):
        if len(at2) != len(at4):
            raise ValueError("different lengths")
        return [_affine(a, b, size) for a, b in zip(at2, at4)]
    raise ValueError(f"unexpected {type(at2).__name__}")


def derive_micro_batch(at2: ModelProfile, at4: ModelProfile, size: int) -> ModelProfile | None:
    """The profile at micro-batch `size` (>= 2) from the profiles at 2 and 4, or None when the two
    are not an affine family (then trace instead)."""
    if size < 2 or at2.micro_batch_size != 2 or at4.micro_batch_size != 4:
        return None
    try:
        data = _affine(canonical(at2).to_dict(), canonical(at4).to_dict(), size)
    except ValueError:
        return None
    return ModelProfile.from_dict(data)


def _installed_transformers() -> str:
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return "0"


def _read(model_key: str) -> dict[str, Any] | None:
    try:
        with gzip.open(SHIPPED_DIR / f"{model_key}.json.gz", "rt") as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


def load_shipped(
    config: Mapping[str, Any], builder: str, *, micro_batch: int, seq_len: int | None,
    image_size: int | None, training: bool, float_bytes: int,
) -> ModelProfile | None:  # fmt: skip
    """The shipped profile for these settings, or None (not shipped, or traced by another tracer)."""
    shipped = _read(_model_key(config, builder))
    if shipped is None or shipped.get("tracer") != tracer_hash():
        return None
    if not proven_for(_installed_transformers(), shipped.get("versions", {}).get("transformers", "0")):
        return None
    entry = shipped["profiles"].get(_shape_key(seq_len, image_size, training, float_bytes))
    if entry is None:
        return None
    if str(micro_batch) in entry:
        return ModelProfile.from_dict(entry[str(micro_batch)])
    if "2" in entry and "4" in entry:
        return derive_micro_batch(
            ModelProfile.from_dict(entry["2"]), ModelProfile.from_dict(entry["4"]), micro_batch
        )
    return None


def shipped_settings():
    """(preset name, builder, seq_len, image_size) of every shipped model and shape."""
    from optimum_ipu.costmodel.presets import PRESETS, resolve_model

    for name in PRESETS:
        for task in (None, *_EXTRA_TASKS.get(name, ())):
            source = resolve_model(name, task)
            if source.generates:
                continue  # encoder-decoder presets are traced on first use (then cached)
            if source.is_vision:
                yield source, None, source.config.get("image_size")
            else:
                # Speech models count frames and have no position table to limit them.
                limit = source.config.get("max_position_embeddings") or source.config.get("n_positions")
                for seq_len in SEQ_LENS:
                    if limit is None or seq_len <= limit:
                        yield source, seq_len, None
