"""Trace the profiles shipped inside the package again (`optimum_ipu/costmodel/profiles/`).

Run after an edit of the tracer (`costmodel/trace.py`, `costmodel/profile.py`): the shipped set
records the tracer's hash, and `tests/costmodel/test_shipped.py` fails until the set is current.

    python tools/trace_shipped_profiles.py

A developer's tool, not part of the installed package: it imports torch and transformers and
traces every preset at every shipped shape (a few minutes).
"""

from __future__ import annotations

import gzip
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from optimum_ipu.costmodel.profiling import trace_source
from optimum_ipu.costmodel.shipped import (
    MICRO_BATCHES,
    SHIPPED_DIR,
    _model_key,
    _shape_key,
    canonical,
    shipped_settings,
    tracer_hash,
)


def generate(folder: Path = SHIPPED_DIR) -> list[Path]:
    """Trace every shipped setting and write `folder/<model key>.json.gz` (imports torch)."""
    by_model: dict[str, dict[str, Any]] = {}
    for source, seq_len, image_size in shipped_settings():
        key = _model_key(source.config, source.builder)
        shipped = by_model.setdefault(key, {
            "model": source.name, "builder": source.builder, "tracer": tracer_hash(),
            "versions": {p: metadata.version(p) for p in ("torch", "transformers")}, "profiles": {},
        })  # fmt: skip
        for training in (True, False):
            for float_bytes in (2, 4):
                entry = shipped["profiles"].setdefault(
                    _shape_key(seq_len, image_size, training, float_bytes), {}
                )
                for micro_batch in MICRO_BATCHES:
                    profile = trace_source(source, micro_batch, seq_len, image_size, training, float_bytes)
                    entry[str(micro_batch)] = canonical(profile).to_dict()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for old in folder.glob("*.json.gz"):
        old.unlink()
    for key, shipped in by_model.items():
        path = folder / f"{key}.json.gz"
        text = json.dumps(shipped, separators=(",", ":"), sort_keys=True).encode()
        path.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))  # same bytes for the same profiles
        written.append(path)
    return written


if __name__ == "__main__":
    paths = generate()
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} files, {total / 1024:.0f} KiB, under {SHIPPED_DIR}")
