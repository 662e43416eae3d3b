"""`optimum-ipu plan`: output, exit codes, files, presets, the profile cache, and one real subprocess run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures import tiny_bert_config

from optimum_ipu import cli
from optimum_ipu.commands import plan as plan_command
from optimum_ipu.costmodel import presets, profiling
from optimum_ipu.pipelining.spec import spec_for

LARGE_POD64 = ["plan", "bert-large-uncased", "--ipu-config", "Graphcore/bert-large-ipu", "--pod", "64"]


@pytest.fixture(autouse=True)
def profile_cache(tmp_path_factory, monkeypatch):
    """One cache folder for the whole module, so a profile traced once is reused by later tests."""
    folder = tmp_path_factory.getbasetemp() / "optimum-ipu-cache"
    monkeypatch.setenv("OPTIMUM_IPU_CACHE", str(folder))
    return folder


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_prints_the_compile_report(capsys):
    code, out, _ = _run(capsys, *LARGE_POD64)
    assert code == 0
    assert "IPU compile report" in out
    assert "4 IPUs per replica x 16 replicas = 64 IPUs" in out
    assert "Layers per IPU: [3, 7, 7, 7]" in out
    assert "IPU       layers        code     weights" in out
    assert "Estimated throughput:" in out and "<- bottleneck" in out


def test_the_console_script_runs_in_a_subprocess(profile_cache):
    script = Path(sys.executable).with_name("optimum-ipu")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "optimum_ipu.cli"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OPTIMUM_IPU_CACHE": str(profile_cache)}
    done = subprocess.run(command + LARGE_POD64, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Estimated throughput:" in done.stdout and "64 IPUs" in done.stdout


def test_auto_writes_json_and_png(capsys, tmp_path):
    json_path, png_path = tmp_path / "plan.json", tmp_path / "out" / "plan.png"
    code, out, _ = _run(capsys, *LARGE_POD64, "--micro-batch", "2", "--auto", "--json", str(json_path),
                        "--png", str(png_path))  # fmt: skip
    assert code == 0
    assert "Layout search:" in out and "--ipu_config_overrides" in out
    data = json.loads(json_path.read_text())
    assert {"layers_per_ipu", "matmul_proportion", "speedup", "given", "proposed"} <= set(data)
    assert data["proposed"]["estimated_samples_per_second"] >= data["given"]["estimated_samples_per_second"]
    assert png_path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_auto_with_no_layout_that_fits_says_so_and_offers_no_overrides(capsys):
    code, out, _ = _run(capsys, "plan", "bert-large-uncased", "--ipu-config", "Graphcore/bert-large-ipu",
                        "--micro-batch", "32", "--seq-len", "512", "--auto")  # fmt: skip
    assert code == 1
    assert "No layout of 4 IPUs per replica fits: the search's best still needs" in out
    assert "--ipu_config_overrides" not in out.split("Layout search:")[1]


def test_out_of_memory_layout_exits_1_with_advice(capsys):
    code, out, _ = _run(capsys, *LARGE_POD64, "--overrides", "layers_per_ipu=[0 0 0 24]")
    assert code == 1
    assert "OUT OF MEMORY" in out and "move layers off IPU 3" in out


def test_a_layout_within_the_models_error_may_not_fit_and_exits_0(capsys):
    # Optimum Graphcore's RoBERTa-base masked-LM command (micro-batch 4 x 512 tokens on IPU-POD16) ran on
    # IPUs; the estimate puts IPU 0 within the model's error of its limit: a warning, not a refusal.
    code, out, _ = _run(capsys, "plan", "roberta-base", "--task", "masked-lm", "--ipu-config",
                        "Graphcore/roberta-base-ipu", "--micro-batch", "4", "--seq-len", "512", "--pod", "16")  # fmt: skip
    assert code == 0
    assert "MAY NOT FIT" in out and "OUT OF MEMORY" not in out
    assert "Margin to the limit: IPU 0 +" in out and "error is ±20%" in out


def test_fp32_optimizer_state_prices_four_bytes_for_each_state(capsys, tmp_path):
    files = []
    for flags in ([], ["--fp32-optimizer-state"]):
        path = tmp_path / f"{len(flags)}.json"
        overrides = ["--overrides", "optimizer_state_offchip=false"]
        assert _run(capsys, *LARGE_POD64, *overrides, *flags, "--json", str(path))[0] == 0
        files.append(json.loads(path.read_text())["memory"]["ipus"][1])
    half, full = files
    assert full["optimizer"] * 6 == half["optimizer"] * 8 and full["gradients"] == 2 * half["gradients"]


def test_second_run_prices_the_cached_profile_without_tracing(capsys, monkeypatch, profile_cache):
    # seq-len 96 is not among the shipped shapes, so the first run traces and caches.
    args = [
        "plan",
        "distilbert-base-uncased",
        "--ipu-config",
        "Graphcore/distilbert-base-ipu",
        "--seq-len",
        "96",
    ]
    first = _run(capsys, *args)
    assert list((profile_cache / "profiles").glob("*.json"))
    monkeypatch.setattr(profiling, "trace_source", lambda *a, **k: pytest.fail("traced although cached"))
    assert _run(capsys, *args) == first
    with pytest.raises(pytest.fail.Exception):
        _run(capsys, *args, "--no-cache")


_COLD_PLAN = """
import json, sys
from optimum_ipu import cli
code = cli.main(sys.argv[1:])
heavy = sorted(m for m in ("torch", "transformers.modeling_utils", "optimum_ipu.costmodel.trace") if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy}))
"""


@pytest.mark.parametrize("extra", [[], ["--auto"], ["--inference", "--micro-batch", "8"]])
def test_a_cold_plan_of_a_preset_imports_neither_torch_nor_the_modelling_code(tmp_path, extra):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OPTIMUM_IPU_CACHE": str(tmp_path / "empty-cache")}
    done = subprocess.run([sys.executable, "-c", _COLD_PLAN, *LARGE_POD64, "--seq-len", "384", *extra],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "heavy": []}
    assert "Estimated throughput:" in done.stdout
    assert not (tmp_path / "empty-cache").exists()  # priced from the shipped profile, nothing traced


@pytest.mark.parametrize(
    "argv,message",
    [
        (["plan", "no-such-model", "--ipu-config", "Graphcore/bert-base-ipu"], "Presets: bert-base-uncased"),
        (["plan", "bert-base-uncased", "--ipu-config", "Graphcore/bert-base-ipu", "--seq-len", "600"], "512"),
        (["plan", "bert-base-uncased", "--ipu-config", "Graphcore/bert-base-ipu", "--n-ipu", "6"], "n_ipu=6"),
        (["plan", "bert-base-uncased", "--ipu-config", "Graphcore/bert-base-ipu", "--pod", "12"],
         "'12' is not a pod: give a power of two"),  # config show and from_pretrained(pod_type=) refuse it too
        (
            ["plan", "bert-base-uncased", "--ipu-config", "Graphcore/bert-base-ipu", "--micro-batch", "0"],
            "micro-batch",
        ),
        (  # argparse kept the last silently: gradient_accumulation_steps=4 was lost
            ["plan", "bert-base-uncased", "--ipu-config", "Graphcore/bert-base-ipu", "--overrides",
             "gradient_accumulation_steps=4", "--overrides", "device_iterations=2"],
            "--overrides was given twice; only the last would be kept. Give it once (several overrides go in one",
        ),
        (["plan", "bert-base-uncased", "--ipu-config", "Graphcore/bert-base-ipu", "--pod", "16", "--pod=64"],
         "--pod was given twice"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize("name", sorted(plan_command.PRESETS))
def test_every_preset_builds_on_meta_with_a_cut_spec(name):
    model = presets.build_meta_model(presets.resolve_model(name))
    assert all(p.device.type == "meta" for p in model.parameters())
    assert spec_for(model) is not None


def test_local_config_folder_uses_its_architecture_unless_a_task_is_given(tmp_path, capsys):
    config = tiny_bert_config()
    config.architectures = ["BertForSequenceClassification"]
    config.save_pretrained(tmp_path)
    source = presets.resolve_model(str(tmp_path))
    assert source.builder == "BertForSequenceClassification"
    assert presets.resolve_model(str(tmp_path / "config.json"), "masked-lm").builder == "AutoModelForMaskedLM"
    model = presets.build_meta_model(source)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.bert.embeddings.word_embeddings.weight.device == torch.device("meta")
    argv = ["plan", str(tmp_path), "--ipu-config", "Graphcore/distilbert-base-ipu", "--seq-len", "32"]
    code, _, err = _run(capsys, *argv)
    assert code == 2 and "places 6 layers but the model has 4" in err
    code, out, _ = _run(
        capsys, *argv, "--overrides", "layers_per_ipu=[2 2]", "--hardware", "bow", "--inference"
    )
    assert code == 0 and "Bow IPU" in out and "Sharded inference" in out


@pytest.mark.parametrize("ipus", [["--n-ipu", "16"], ["--pod", "pod16"]])
def test_the_ipu_count_picks_the_pod_keyed_values_of_an_old_config(capsys, tmp_path, ipus):
    # The same loader as IPUTrainingArguments: a 0.x config's {"pod16": ..., "default": ...} entries
    # are resolved for the IPUs asked for, not for the default.
    (tmp_path / "ipu_config.json").write_text(
        '{"layers_per_ipu": [0, 4, 4, 4], "ipus_per_replica": 4,'
        ' "gradient_accumulation_steps": {"pod16": 64, "default": 8}}'
    )
    code, out, _ = _run(capsys, "plan", "bert-base-uncased", "--ipu-config", str(tmp_path), *ipus)
    assert code in (0, 1) and "micro-batch 1 x GA 64 x replicas 4" in out


@pytest.mark.parametrize(
    "model,ipu_config,task,layers",
    [
        ("facebook/wav2vec2-base", "Graphcore/wav2vec2-ctc-base-ipu", "ctc", "[9, 4, 4, 4]"),
        ("facebook/hubert-base-ls960", "Graphcore/hubert-base-ipu", "audio-classification", "[0, 4, 4, 4]"),
        ("microsoft/mpnet-base", "Graphcore/mpnet-base-ipu", "masked-lm", "[0, 4, 4, 4]"),
    ],
)
def test_plan_prices_the_bundled_speech_and_mpnet_configs(capsys, model, ipu_config, task, layers):
    code, out, err = _run(
        capsys, "plan", model, "--ipu-config", ipu_config, "--task", task, "--seq-len", "128"
    )
    assert code == 0, err
    assert f"Layers per IPU: {layers}" in out and "Estimated throughput:" in out


def _call_ms(out: str) -> float:
    """Device time of one host call from the summary: '... per 32.6 ms call; host 8.6 ms)'."""
    import re

    call, host = re.search(r"per ([\d.]+) ms call; host ([\d.]+) ms", out).groups()
    return float(call) - float(host)


def test_pipelined_inference_overlaps_the_stages_across_device_iterations(capsys):
    # Hand-worked reference: S equal stages, DI micro-batches. Sharded: DI x S stage times per call;
    # pipelined: DI + S - 1 cycles of one stage time each (copies between IPUs add to both).
    overrides = (
        "inference_layers_per_ipu=[3 3 3 3],inference_ipus_per_replica=4,inference_device_iterations=8"
    )
    argv = [
        "plan",
        "bert-base-uncased",
        "--ipu-config",
        "Graphcore/bert-base-ipu",
        "--inference",
        "--overrides",
        overrides,
    ]
    code, sharded_out, _ = _run(capsys, *argv)
    assert code == 0 and "Sharded inference" in sharded_out
    code, pipelined_out, _ = _run(capsys, *argv, "--pipelined")
    assert code == 0 and "Pipelined inference: 11 cycles per call (DI 8 + 4 - 1)" in pipelined_out
    ratio = _call_ms(pipelined_out) / _call_ms(sharded_out)
    assert ratio == pytest.approx((8 + 4 - 1) / (8 * 4), rel=0.2)


def test_pipelined_is_refused_for_training_with_the_reason(capsys):
    code, _, err = _run(
        capsys, "plan", "bert-base-uncased", "--ipu-config", "Graphcore/bert-base-ipu", "--pipelined"
    )
    assert code == 2 and "--pipelined is for --inference" in err


# -- one spelling per flag ---------------------------------------------------------------------------

# Every hyphenated flag of `plan` with a value (the two IPU-count flags exclude each other).
_HYPHENATED = [
    ["model", "--ipu-config", "Graphcore/bert-base-ipu", "--n-ipu", "8", "--micro-batch", "2", "--seq-len", "128",
     "--image-size", "224", "--fp32-optimizer-state", "--inference", "--generation-max-length", "16",
     "--num-beams", "2", "--use-cross-cache", "--on-device-generation-steps", "4", "--no-cache"],
    ["model", "--ipu-config", "Graphcore/bert-base-ipu", "--pod-type", "pod16", "--num-beams", "3"],
]  # fmt: skip


def _underscored(argv: list[str]) -> list[str]:
    return [arg[:2] + arg[2:].replace("-", "_") if arg.startswith("--") else arg for arg in argv]


def test_every_plan_flag_parses_the_same_with_hyphens_or_underscores(capsys):
    """`--micro-batch` is the documented spelling and `--micro_batch` (Optimum Graphcore's style) an alias:
    both give the same arguments, for every flag; --help shows the hyphens only."""
    parser = cli.build_parser()
    for argv in _HYPHENATED:
        assert _underscored(argv) != argv
        assert parser.parse_args(["plan", *_underscored(argv)]) == parser.parse_args(["plan", *argv])
    with pytest.raises(SystemExit):
        parser.parse_args(["plan", "--help"])
    help_text = capsys.readouterr().out
    flags = set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9_-]*", help_text))
    assert not {flag for flag in flags if "_" in flag} - {"--ipu_config_overrides"}, (
        "help shows an underscore flag"
    )
    old = parser.parse_args(["plan", "model", "--ipu-config", "x", "--generation_num_beams", "3"])
    assert old.num_beams == 3  # the training argument's name, accepted since 0.x
    exercised = {arg for argv in _HYPHENATED for arg in argv if arg.startswith("--")}
    assert {flag for flag in flags if "-" in flag[2:]} <= exercised | {"--ipu-config"}, (
        "a flag not checked here"
    )


def test_an_abbreviated_flag_still_parses_next_to_its_underscore_spelling():
    args = cli.build_parser().parse_args(
        ["plan", "model", "--ipu-config", "x", "--seq", "128", "--micro", "2"]
    )
    assert (args.seq_len, args.micro_batch) == (128, 2)


def test_inference_plan_prints_latency_throughput_and_the_regime(capsys):
    # Optimum Graphcore's BERT-Base config at its 1 sample x 5 device iterations per call: the 8.6 ms the host
    # spends per call outweighs the IPUs' work. 16 x 32 per call keeps the pipeline full: IPU-bound.
    argv = [
        "plan",
        "bert-base-uncased",
        "--ipu-config",
        "Graphcore/bert-base-ipu",
        "--inference",
        "--pipelined",
    ]
    code, small, _ = _run(capsys, *argv)
    assert code == 0 and "Estimated throughput:" in small
    pattern = r"Estimated latency: ([\d.]+) ms per call of (\d+) samples: IPUs ([\d.]+) ms, host ([\d.]+) ms"
    latency = re.search(pattern, small)
    assert latency, small
    ms, samples, ipus, host = float(latency[1]), int(latency[2]), float(latency[3]), float(latency[4])
    assert (
        samples == 5 and ms == pytest.approx(ipus + host, abs=0.11) and ipus < host and "host-bound" in small
    )
    code, busy, _ = _run(
        capsys, *argv, "--micro-batch", "16", "--overrides", "inference_device_iterations=32"
    )
    assert code == 0 and "IPU-bound: a faster layout speeds it up" in busy
    assert "taking turns (synchronous data loading)" in busy


BERT = ["plan", "bert-base-uncased", "--ipu-config", "Graphcore/bert-base-ipu"]
VIT = ["plan", "google/vit-base-patch16-224", "--ipu-config", "Graphcore/vit-base-ipu"]


@pytest.mark.parametrize(
    "given,plain,note",
    [
        (VIT + ["--seq-len", "128"], VIT, "--seq-len 128 has no effect on google/vit-base-patch16-224, an image model"),
        (BERT + ["--image-size", "224"], BERT, "--image-size 224 has no effect on bert-base-uncased"),
        (BERT + ["--inference", "--optimizer", "lamb", "--fp32-optimizer-state", "--overrides",
                 "gradient_accumulation_steps=64,device_iterations=2"],
         BERT + ["--inference", "--overrides", "device_iterations=2"],
         "--optimizer, --fp32-optimizer-state, --overrides gradient_accumulation_steps: no effect with --inference"),
    ],
)
def test_a_flag_the_plan_does_not_read_is_named_and_changes_no_figure(capsys, given, plain, note):
    code, out, err = _run(capsys, *given)
    assert code in (0, 1) and note in err
    _, same, _ = _run(capsys, *plain)
    throughput = re.compile(r"Estimated throughput: [\d,.]+")
    assert throughput.search(out).group() == throughput.search(same).group()


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"model_type": "bert"', "is not valid JSON"),
        ("[]", "is not a JSON object, so it is not a model's config"),
        ('{"layers_per_ipu": [0, 4, 4, 4], "ipus_per_replica": 4}', "it looks like an IPU config: give it to --ipu-config"),
        ('{"model_type": "bert", "architectures": ["FooBarModel"], "num_hidden_layers": 4}', "has no FooBarModel"),
        ('{"model_type": "nosuchmodel"}', "model_type 'nosuchmodel' is not one transformers"),
    ],
    ids=["bad-json", "a-list", "an-ipu-config", "unknown-architecture", "unknown-model-type"],
)
def test_a_model_config_that_is_not_one_is_a_one_line_error_with_the_fix(capsys, tmp_path, content, message):
    (tmp_path / "config.json").write_text(content)
    code, _, err = _run(capsys, "plan", str(tmp_path / "config.json"), "--ipu-config", "Graphcore/bert-base-ipu")
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_task_the_model_has_no_head_for_names_it(capsys):
    code, _, err = _run(capsys, *BERT, "--task", "image-classification")
    assert code == 2 and "AutoModelForImageClassification has no head for model_type 'bert'" in err
    assert len(err) < 400  # not transformers' list of every class


def test_an_output_that_cannot_be_written_is_refused_before_any_work(capsys, tmp_path, monkeypatch):
    code, out, err = _run(capsys, *BERT, "--json", str(tmp_path))
    assert code == 2 and f"--json {tmp_path} is a folder: give a file name" in err and not out
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "matplotlib" else _find(name, *a))
    code, out, err = _run(capsys, *BERT, "--png", str(tmp_path / "plan.png"))
    assert code == 2 and "needs matplotlib: pip install 'optimum-ipu[plots]'" in err and not out


_find = __import__("importlib.util").util.find_spec
