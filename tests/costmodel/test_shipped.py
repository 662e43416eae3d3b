"""Profiles shipped in the package: current with the tracer, equal to fresh traces, other micro-batches derived exactly."""

from __future__ import annotations

import pytest

from optimum_ipu.costmodel import shipped
from optimum_ipu.costmodel.presets import resolve_model
from optimum_ipu.costmodel.profiling import trace_source


def _load(source, micro_batch, seq_len, image_size=None, training=True, float_bytes=2):
    return shipped.load_shipped(source.config, source.builder, micro_batch=micro_batch, seq_len=seq_len,
                                image_size=image_size, training=training, float_bytes=float_bytes)  # fmt: skip


def test_every_shipped_setting_is_present_and_traced_by_the_current_tracer():
    # Fails after an edit of trace.py or profile.py: run `python tools/trace_shipped_profiles.py`.
    missing = [
        (source.name, source.builder, seq_len)
        for source, seq_len, image_size in shipped.shipped_settings()
        if _load(source, 1, seq_len, image_size) is None or _load(source, 3, seq_len, image_size) is None
    ]
    assert missing == []


@pytest.mark.parametrize(
    "name,task,seq_len,micro_batch,training,float_bytes",
    [
        ("bert-large-uncased", None, 384, 1, True, 2),
        ("bert-large-uncased", "pretraining", 128, 8, True, 2),  # derived from 2 and 4
        ("google/vit-base-patch16-224-in21k", None, None, 5, False, 2),
        ("gpt2", None, 512, 3, True, 4),
    ],
)
def test_a_shipped_or_derived_profile_equals_a_fresh_trace(
    name, task, seq_len, micro_batch, training, float_bytes
):
    source = resolve_model(name, task)
    image_size = source.config.get("image_size") if source.is_vision else None
    got = _load(source, micro_batch, seq_len, image_size, training, float_bytes)
    traced = trace_source(source, micro_batch, seq_len, image_size, training, float_bytes)
    assert got == shipped.canonical(traced)


def test_profiles_that_do_not_extend_to_other_micro_batches_are_not_derived():
    source = resolve_model("bert-base-uncased")
    at2, at4 = _load(source, 2, 128), _load(source, 4, 128)
    assert shipped.derive_micro_batch(at2, at4, 6).micro_batch_size == 6
    at4.blocks[0].other_bytes += 1  # would be a fractional byte count at an odd micro-batch
    assert shipped.derive_micro_batch(at2, at4, 5) is None
    at4.blocks[0].other_bytes -= 1
    at4.blocks[1].matmuls.pop()  # a different set of operations
    assert shipped.derive_micro_batch(at2, at4, 6) is None
    assert shipped.derive_micro_batch(at2, at2, 6) is None  # not the profiles at 2 and 4


def test_an_unshipped_shape_or_model_is_not_invented():
    source = resolve_model("bert-base-uncased")
    assert _load(source, 1, 96) is None
    other = dict(source.config, num_hidden_layers=3)
    assert shipped.load_shipped(other, source.builder, micro_batch=1, seq_len=128, image_size=None,
                                training=True, float_bytes=2) is None  # fmt: skip


@pytest.mark.parametrize(
    "installed,traced,proven",
    [
        ("5.18.0", "5.24.0", True),  # the lowest release pyproject.toml admits
        ("5.24.1", "5.24.0", True),  # a patch release of the one traced with
        ("5.21.0", "5.24.0", True),
        ("5.17.0", "5.24.0", False),  # below the lowest checked
        ("5.25.0", "5.24.0", False),  # newer than the one traced with: not proven, traced instead
        ("6.0.0", "5.24.0", False),
    ],
)
def test_shipped_profiles_are_used_only_for_the_transformers_releases_they_are_proven_for(
    installed, traced, proven
):
    assert shipped.proven_for(installed, traced) is proven


def test_a_newer_transformers_traces_instead_of_using_a_shipped_profile(monkeypatch):
    source = resolve_model("bert-base-uncased")
    assert _load(source, 1, 128) is not None
    monkeypatch.setattr(shipped, "_installed_transformers", lambda: "99.0.0")
    assert _load(source, 1, 128) is None


def test_the_lowest_proven_release_is_the_lowest_pyproject_admits():
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"transformers>={shipped.LOWEST_PROVEN_TRANSFORMERS}"' in pyproject
