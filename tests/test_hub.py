"""Finding ipu_config.json: local paths, the Hub through a local cache or a stand-in, the bundled copies."""

import json
import logging
import time
from pathlib import Path

import huggingface_hub.constants
import pytest

import optimum_ipu
from optimum_ipu.configuration import CONFIG_NAME, IPUConfig, hub

# The Hub's `main` revision of each bundled config (huggingface.co/Graphcore/<name>/blob/main/ipu_config.json,
# read from stored copies of the Hub's pages; configs/Graphcore/SOURCES.md has each commit and how it was read).
# Every key the file holds, as published. Two differ from section 8 of the semantics reference, which summarised
# older revisions: roberta-large-ipu's embedding_serialization_factor 5 and inference_device_iterations 5 (2 and 4
# there) and mpnet-base-ipu's matmul_proportion 0.2 (0.22 there); the reference also left out the recomputation,
# optimizer state and sharding keys of several. wav2vec2-ctc-large-ipu's main revision could not be read: its
# copy holds the values of section 8.
HUB_MAIN = {
    "Graphcore/bert-base-ipu": {
        "embedding_serialization_factor": 1,
        "recompute_checkpoint_every_layer": True,
        "optimizer_state_offchip": False,
        "replicated_tensor_sharding": True,
        "enable_half_partials": True,
        "device_iterations": 1,
        "inference_device_iterations": 5,
        "replication_factor": 1,
        "inference_replication_factor": 1,
        "gradient_accumulation_steps": 16,
        "executable_cache_dir": "./exe_cache",
        "ipus_per_replica": 4,
        "layers_per_ipu": [0, 4, 4, 4],
        "matmul_proportion": 0.25,
    },  # 0bbecd4
    "Graphcore/bert-large-ipu": {
        "embedding_serialization_factor": 2,
        "recompute_checkpoint_every_layer": True,
        "optimizer_state_offchip": True,
        "replicated_tensor_sharding": True,
        "enable_half_partials": True,
        "replication_factor": 1,
        "gradient_accumulation_steps": 16,
        "device_iterations": 1,
        "inference_device_iterations": 5,
        "inference_replication_factor": 1,
        "executable_cache_dir": "./exe_cache",
        "ipus_per_replica": 4,
        "layers_per_ipu": [3, 7, 7, 7],
        "matmul_proportion": [0.15, 0.18, 0.2, 0.25],
    },  # 6031c07
    "Graphcore/vit-base-ipu": {
        "recompute_checkpoint_every_layer": True,
        "optimizer_state_offchip": True,
        "replicated_tensor_sharding": True,
        "enable_half_partials": True,
        "replication_factor": 1,
        "gradient_accumulation_steps": 128,
        "device_iterations": 1,
        "executable_cache_dir": "./exe_cache",
        "inference_device_iterations": 4,
        "inference_replication_factor": 1,
        "ipus_per_replica": 4,
        "layers_per_ipu": [3, 3, 3, 3],
        "matmul_proportion": 0.3,
    },  # cabfad6
    "Graphcore/distilbert-base-ipu": {
        "embedding_serialization_factor": 1,
        "recompute_checkpoint_every_layer": True,
        "optimizer_state_offchip": False,
        "replicated_tensor_sharding": True,
        "enable_half_partials": True,
        "device_iterations": 1,
        "inference_device_iterations": 5,
        "replication_factor": 2,
        "inference_replication_factor": 2,
        "gradient_accumulation_steps": 16,
        "executable_cache_dir": "./exe_cache",
        "ipus_per_replica": 2,
        "layers_per_ipu": [2, 4],
        "matmul_proportion": 0.25,
    },  # 0ddd7f4
    "Graphcore/roberta-base-ipu": {
        "embedding_serialization_factor": 1,
        "recompute_checkpoint_every_layer": True,
        "optimizer_state_offchip": True,
        "replicated_tensor_sharding": True,
        "enable_half_partials": True,
        "device_iterations": 1,
        "inference_device_iterations": 5,
        "replication_factor": 1,
        "inference_replication_factor": 1,
        "gradient_accumulation_steps": 16,
        "executable_cache_dir": "./exe_cache",
        "ipus_per_replica": 4,
        "layers_per_ipu": [0, 4, 4, 4],
        "matmul_proportion": 0.25,
    },  # 5ca9917
    "Graphcore/roberta-large-ipu": {
        "embedding_serialization_factor": 5,
        "recompute_checkpoint_every_layer": True,
        "optimizer_state_offchip": True,
        "replicated_tensor_sharding": True,
        "enable_half_partials": True,
        "device_iterations": 1,
        "inference_device_iterations": 5,
        "replication_factor": 1,
        "inference_replication_factor": 1,
        "gradient_accumulation_steps": 16,
        "executable_cache_dir": "./exe_cache",
        "ipus_per_replica": 4,
        "layers_per_ipu": [3, 7, 7, 7],
        "matmul_proportion": [0.1, 0.2, 0.25, 0.25],
    },  # 08687f6
    "Graphcore/gpt2-small-ipu": {
        "embedding_serialization_factor": 4,
        "recompute_checkpoint_every_layer": True,
        "optimizer_state_offchip": True,
        "replicated_tensor_sharding": True,
        "enable_half_partials": True,
        "device_iterations": 2,
        "inference_device_iterations": 5,
        "replication_factor": 1,
        "inference_replication_factor": 1,
        "gradient_accumulation_steps": 16,
        "executable_cache_dir": "./exe_cache",
        "ipus_per_replica": 4,
        "layers_per_ipu": [0, 4, 4, 4],
        "matmul_proportion": 0.25,
    },  # 648a373
    "Graphcore/gpt2-medium-ipu": {
        "embedding_serialization_factor": 5,
        "recompute_checkpoint_every_layer": True,
        "optimizer_state_offchip": True,
        "replicated_tensor_sharding": True,
        "enable_half_partials": True,
        "device_iterations": 2,
        "inference_device_iterations": 9,
        "replication_factor": 1,
        "inference_replication_factor": 1,
        "gradient_accumulation_steps": 16,
        "executable_cache_dir": "./exe_cache",
        "ipus_per_replica": 8,
        "layers_per_ipu": [0, 3, 3, 3, 3, 4, 4, 4],
        "matmul_proportion": 0.25,
    },  # 76ae1ac
    "Graphcore/hubert-base-ipu": {
        "recompute_checkpoint_every_layer": True,
        "optimizer_state_offchip": True,
        "replicated_tensor_sharding": True,
        "enable_half_partials": True,
        "replication_factor": 1,
        "gradient_accumulation_steps": 512,
        "device_iterations": 1,
        "executable_cache_dir": "./exe_cache",
        "inference_device_iterations": 4,
        "inference_replication_factor": 1,
        "ipus_per_replica": 4,
        "layers_per_ipu": [0, 4, 4, 4],
        "matmul_proportion": [0.25, 0.25, 0.25, 0.25],
    },  # 834c277
    "Graphcore/wav2vec2-ctc-base-ipu": {
        "embedding_serialization_factor": 1,
        "recompute_checkpoint_every_layer": False,
        "optimizer_state_offchip": False,
        "replicated_tensor_sharding": True,
        "enable_half_partials": True,
        "device_iterations": 1,
        "inference_device_iterations": 4,
        "replication_factor": 1,
        "inference_replication_factor": 1,
        "gradient_accumulation_steps": 32,
        "executable_cache_dir": "./exe_cache",
        "ipus_per_replica": 4,
        "layers_per_ipu": [9, 4, 4, 4],
        "matmul_proportion": [0.1, 0.1, 0.1, 0.1],
    },  # 3216197
    "Graphcore/wav2vec2-ctc-large-ipu": {
        "device_iterations": 1,
        "enable_half_partials": True,
        "executable_cache_dir": "./exe_cache",
        "gradient_accumulation_steps": 32,
        "ipus_per_replica": 8,
        "layers_per_ipu": [4, 5, 3, 4, 4, 4, 4, 5],
        "matmul_proportion": [0.2, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 1.0],
        "optimizer_state_offchip": True,
        "replication_factor": 1,
    },  # unknown
    "Graphcore/mpnet-base-ipu": {
        "device_iterations": 1,
        "embedding_serialization_factor": 1,
        "enable_half_partials": True,
        "executable_cache_dir": "./exe_cache",
        "gradient_accumulation_steps": 512,
        "inference_device_iterations": 4,
        "inference_replication_factor": 4,
        "ipus_per_replica": 4,
        "layers_per_ipu": [0, 4, 4, 4],
        "matmul_proportion": 0.2,
        "optimizer_state_offchip": False,
        "optimum_version": "0.1.2",
        "output_mode": "final",
        "recompute_checkpoint_every_layer": True,
        "replicated_tensor_sharding": True,
        "replication_factor": 4,
        "seed": 42,
    },  # 7de2123
    "Graphcore/mt5-small-ipu": {
        "layers_per_ipu": [0, 8, 8, 0],
        "inference_layers_per_ipu": [0, 8, 8, 0],
        "embedding_serialization_factor": None,
        "serialized_embedding_splits_per_ipu": [4, 4, 0, 0],
        "projection_serialization_factor": 4,
        "matmul_proportion": 0.25,
        "inference_matmul_proportion": 0.6,
        "recompute_checkpoint_every_layer": True,
        "optimizer_state_offchip": True,
        "replicated_tensor_sharding": True,
        "device_iterations": 10,
        "gradient_accumulation_steps": 128,
        "executable_cache_dir": "./exe_cache",
    },  # 4c21729
    "Graphcore/whisper-tiny-ipu": {
        "optimizer_state_offchip": True,
        "replicated_tensor_sharding": True,
        "enable_half_partials": True,
        "gradient_accumulation_steps": 16,
        "executable_cache_dir": "./exe_cache",
        "layers_per_ipu": [4, 4],
        "matmul_proportion": 0.6,
        "projection_serialization_factor": 4,
    },  # 3761640
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
    assert hub.bundled_config_names() == sorted(HUB_MAIN)


@pytest.mark.parametrize("name", sorted(HUB_MAIN))
def test_bundled_config_has_the_published_values_and_validates_in_both_modes(offline, name):
    config = IPUConfig.from_pretrained(name)
    assert config.source == "bundled"
    for key, value in HUB_MAIN[name].items():
        if key in ("optimum_version",):
            continue  # metadata, not an attribute
        expected = 1 if value is None and key.endswith("_serialization_factor") else value  # None: not set
        assert getattr(config, key) == expected, key
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
    assert all(name in message for name in HUB_MAIN)


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
