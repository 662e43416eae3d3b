"""Finding ipu_config.json: local paths, the Hub through a local cache or a stand-in, the bundled copies."""

import json
import logging
import time
from pathlib import Path

import huggingface_hub.constants
import pytest

import optimum_ipu
from optimum_ipu.configuration import CONFIG_NAME, IPUConfig, hub

# Section 8 of the semantics reference: (ipus_per_replica, layers_per_ipu, matmul_proportion, GA, other values)
SECTION_8 = {
    "Graphcore/bert-base-ipu": (
        4,
        [0, 4, 4, 4],
        0.25,
        16,
        {
            "inference_device_iterations": 5,
            "recompute_checkpoint_every_layer": True,
            "optimizer_state_offchip": False,
            "replicated_tensor_sharding": True,
            "embedding_serialization_factor": 1,
        },
    ),
    "Graphcore/bert-large-ipu": (
        4,
        [3, 7, 7, 7],
        [0.15, 0.18, 0.20, 0.25],
        16,
        {
            "embedding_serialization_factor": 2,
            "inference_device_iterations": 5,
            "recompute_checkpoint_every_layer": True,
            "optimizer_state_offchip": True,
            "replicated_tensor_sharding": True,
        },
    ),
    "Graphcore/vit-base-ipu": (
        4,
        [3, 3, 3, 3],
        0.3,
        128,
        {
            "inference_device_iterations": 4,
            "recompute_checkpoint_every_layer": True,
            "optimizer_state_offchip": True,
            "replicated_tensor_sharding": True,
        },
    ),
    "Graphcore/distilbert-base-ipu": (
        2,
        [2, 4],
        0.25,
        16,
        {"replication_factor": 2, "inference_replication_factor": 2, "inference_device_iterations": 5},
    ),
    "Graphcore/roberta-base-ipu": (4, [0, 4, 4, 4], 0.25, 16, {"inference_device_iterations": 5}),
    "Graphcore/roberta-large-ipu": (
        4,
        [3, 7, 7, 7],
        [0.1, 0.2, 0.25, 0.25],
        16,
        {"embedding_serialization_factor": 2, "inference_device_iterations": 4},
    ),
    "Graphcore/gpt2-small-ipu": (
        4,
        [0, 4, 4, 4],
        0.25,
        16,
        {"embedding_serialization_factor": 4, "device_iterations": 2, "inference_device_iterations": 5},
    ),
    "Graphcore/gpt2-medium-ipu": (
        8,
        [0, 3, 3, 3, 3, 4, 4, 4],
        0.25,
        16,
        {"embedding_serialization_factor": 5, "device_iterations": 2, "inference_device_iterations": 9},
    ),
    "Graphcore/hubert-base-ipu": (4, [0, 4, 4, 4], [0.25] * 4, 512, {"inference_device_iterations": 4}),
    "Graphcore/wav2vec2-ctc-base-ipu": (4, [9, 4, 4, 4], [0.1] * 4, 32, {"inference_device_iterations": 4}),
    "Graphcore/wav2vec2-ctc-large-ipu": (
        8,
        [4, 5, 3, 4, 4, 4, 4, 5],
        [0.2, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 1.0],
        32,
        {"optimizer_state_offchip": True},
    ),
    "Graphcore/mpnet-base-ipu": (
        4,
        [0, 4, 4, 4],
        0.22,
        512,
        {"replication_factor": 4, "inference_replication_factor": 4, "inference_device_iterations": 4},
    ),
    "Graphcore/mt5-small-ipu": (
        4,
        [0, 8, 8, 0],
        0.25,
        128,
        {
            "inference_matmul_proportion": 0.6,
            "serialized_embedding_splits_per_ipu": [4, 4, 0, 0],
            "projection_serialization_factor": 4,
            "device_iterations": 10,
        },
    ),
    "Graphcore/whisper-tiny-ipu": (2, [4, 4], 0.6, 16, {"projection_serialization_factor": 4}),
}


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """Offline mode with an empty Hugging Face cache."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))


def _fill_cache(
    cache: Path, repo_id: str, values: dict, sha: str = "0123456789abcdef0123456789abcdef01234567"
) -> Path:
    """Lay a config out as huggingface_hub caches it: snapshots/<sha>/ipu_config.json and refs/main."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / sha
    snapshot.mkdir(parents=True)
    (snapshot / CONFIG_NAME).write_text(json.dumps(values))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    return snapshot / CONFIG_NAME


# ----- the bundled configs -----------------------------------------------------------------------


def test_all_14_hub_configs_are_bundled():
    assert hub.bundled_config_names() == sorted(SECTION_8)


@pytest.mark.parametrize("name", sorted(SECTION_8))
def test_bundled_config_has_the_published_values_and_validates_in_both_modes(offline, name):
    ipus, layers, proportion, accumulation, other = SECTION_8[name]
    config = IPUConfig.from_pretrained(name)
    assert config.source == "bundled"
    assert config.ipus_per_replica == ipus
    assert config.layers_per_ipu == layers
    assert config.matmul_proportion == proportion
    assert config.gradient_accumulation_steps == accumulation
    assert config.executable_cache_dir == "./exe_cache"
    assert config.enable_half_partials is True
    expected = {"device_iterations": 1, "replication_factor": 1, **other}
    assert {key: getattr(config, key) for key in expected} == expected
    config.validate()
    config.eval()
    assert config.ipus_per_replica >= 1 and config.layers_per_ipu
    config.validate()


def test_bundled_files_hold_only_current_keys():
    for name in hub.bundled_config_names():
        raw = json.loads(hub.bundled_config_path(name).read_text())
        IPUConfig.from_dict(raw, strict=True)


def test_bundled_lookup_prefers_the_package_then_the_repository():
    package = Path(optimum_ipu.__file__).resolve().parent
    dirs = [d for d in (package / "configs", package.parent / "configs") if d.is_dir()]
    assert hub.bundled_config_dirs() == dirs and dirs
    assert hub.bundled_config_path("graphcore/BERT-base-ipu") == hub.bundled_config_path(
        "Graphcore/bert-base-ipu"
    )
    assert hub.bundled_config_path("Graphcore/../etc") is None
    assert hub.bundled_config_path("Graphcore/nothing-ipu") is None


# ----- offline -----------------------------------------------------------------------------------


def test_offline_with_an_empty_cache_returns_the_bundled_copy_fast(offline, caplog):
    caplog.set_level(logging.INFO, logger="optimum_ipu")
    start = time.perf_counter()
    config = IPUConfig.from_pretrained("Graphcore/bert-base-ipu")
    assert time.perf_counter() - start < 1.0
    assert config.source == "bundled"
    assert config.source_path == str(hub.bundled_config_path("Graphcore/bert-base-ipu"))
    assert "using the copy bundled with optimum-ipu" in caplog.text


def test_an_unknown_name_fails_fast_listing_the_bundled_names(offline):
    start = time.perf_counter()
    with pytest.raises(hub.IPUConfigNotFoundError) as raised:
        IPUConfig.from_pretrained("Graphcore/no-such-ipu")
    assert time.perf_counter() - start < 1.0
    message = str(raised.value)
    assert "'Graphcore/no-such-ipu'" in message
    assert all(name in message for name in SECTION_8)


def test_a_cached_hub_file_wins_over_the_bundled_copy(offline, tmp_path):
    cache = tmp_path / "hf-cache"
    path = _fill_cache(
        cache, "Graphcore/bert-base-ipu", {"layers_per_ipu": [0, 4, 4, 4], "gradient_accumulation_steps": 99}
    )
    config = IPUConfig.from_pretrained("Graphcore/bert-base-ipu", cache_dir=cache)
    assert config.gradient_accumulation_steps == 99
    assert config.source == "hub-cache" and Path(config.source_path) == path


def test_the_default_hf_cache_is_honoured(offline, monkeypatch, tmp_path):
    cache = tmp_path / "hf-cache"
    _fill_cache(cache, "Graphcore/vit-base-ipu", {"layers_per_ipu": [-1], "ipus_per_replica": 2})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    config = IPUConfig.from_pretrained("Graphcore/vit-base-ipu")
    assert config.source == "hub-cache" and config.ipus_per_replica == 2


def test_local_files_only_reads_the_cache_even_online(monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    cache = tmp_path / "hf-cache"
    _fill_cache(cache, "someone/custom-ipu", {"gradient_accumulation_steps": 3})
    config = IPUConfig.from_pretrained("someone/custom-ipu", cache_dir=cache, local_files_only=True)
    assert config.source == "hub-cache" and config.gradient_accumulation_steps == 3


def test_a_revision_that_is_not_cached_does_not_fall_back(offline):
    with pytest.raises(hub.IPUConfigNotFoundError, match="revision='v1'"):
        IPUConfig.from_pretrained("Graphcore/bert-base-ipu", revision="v1")


# ----- online, with a stand-in for the Hub -------------------------------------------------------


def test_when_the_hub_answers_its_file_wins(monkeypatch, tmp_path):
    served = tmp_path / "served.json"
    served.write_text(json.dumps({"layers_per_ipu": [0, 4, 4, 4], "gradient_accumulation_steps": 64}))
    calls = []

    def fake_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(served)

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_download", fake_download)
    config = IPUConfig.from_pretrained("Graphcore/bert-base-ipu", revision="main", token="t", cache_dir="c")
    assert config.gradient_accumulation_steps == 64 and config.source == "hub"
    assert calls == [
        (
            "Graphcore/bert-base-ipu",
            {"revision": "main", "token": "t", "cache_dir": "c", "local_files_only": False},
        )
    ]


def test_when_the_hub_fails_the_bundled_copy_is_used_with_a_warning(monkeypatch, caplog):
    def unreachable(repo_id, **kwargs):
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_download", unreachable)
    config = IPUConfig.from_pretrained("Graphcore/roberta-base-ipu")
    assert config.source == "bundled"
    records = [
        r
        for r in caplog.records
        if r.name == "optimum_ipu.configuration.hub" and r.levelno == logging.WARNING
    ]
    assert len(records) == 1 and "ConnectionError: no route" in records[0].getMessage()


def test_the_download_seam_asks_huggingface_hub_for_the_config_file(monkeypatch):
    seen = {}

    def fake_hf_hub_download(repo_id, filename, **kwargs):
        seen.update(repo_id=repo_id, filename=filename, **kwargs)
        return "x"

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hf_hub_download)
    assert hub._download("a/b", revision="r") == "x"
    assert seen == {"repo_id": "a/b", "filename": CONFIG_NAME, "revision": "r"}


# ----- local paths -------------------------------------------------------------------------------


def test_local_folder_and_json_file(tmp_path):
    IPUConfig(gradient_accumulation_steps=5).save_pretrained(tmp_path / "model")
    assert hub.resolve_config_file(tmp_path / "model").source == "local"
    other = tmp_path / "custom.json"
    other.write_text(json.dumps({"gradient_accumulation_steps": 6}))
    config = IPUConfig.from_pretrained(str(other))
    assert config.gradient_accumulation_steps == 6 and config.source == "local"


def test_a_folder_without_the_config_is_an_error(tmp_path):
    with pytest.raises(hub.IPUConfigNotFoundError, match="has no ipu_config.json"):
        IPUConfig.from_pretrained(tmp_path)


def test_a_missing_path_is_not_looked_up_on_the_hub(monkeypatch, tmp_path):
    monkeypatch.setattr(hub, "_download", lambda *a, **k: pytest.fail("asked the Hub for a path"))
    with pytest.raises(hub.IPUConfigNotFoundError, match="no such file or folder"):
        IPUConfig.from_pretrained(str(tmp_path / "missing" / "ipu_config.json"))
    with pytest.raises(FileNotFoundError):
        IPUConfig.from_pretrained("./missing-folder")
