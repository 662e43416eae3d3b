"""The cost model prices a generation as the IPU runs it: the encoder once per batch, the decoder once per
token over a KV cache of `generation_max_length` positions, on batch x beams rows; `optimum-ipu plan
--inference --generation_max_length N --num_beams K` prints it. Checked against hand-worked numbers."""

from __future__ import annotations

import json

import pytest
from fixtures import tiny_bart_config, tiny_t5_config, tiny_whisper_config

from optimum_ipu import IPUConfig, cli
from optimum_ipu.costmodel.decoding import GenerationSettings, estimate_generation, program
from optimum_ipu.costmodel.hardware import HARDWARE
from optimum_ipu.costmodel.performance import estimate_performance
from optimum_ipu.costmodel.presets import ModelSource
from optimum_ipu.costmodel.profiling import generation_profiles
from optimum_ipu.costmodel.shipped import canonical
from optimum_ipu.costmodel.workload import Workload

MK2 = HARDWARE["mk2"]
BATCH, SOURCE, LENGTH = 2, 16, 8  # sources per batch, source tokens, generation_max_length


@pytest.fixture(autouse=True)
def profile_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OPTIMUM_IPU_CACHE", str(tmp_path_factory.getbasetemp() / "generation-cache"))


def _source(config) -> ModelSource:
    builder = "AutoModelForSpeechSeq2Seq" if config.model_type == "whisper" else "AutoModelForSeq2SeqLM"
    return ModelSource(config.model_type, config.to_dict(), builder)


def _profiles(config, beams=1, cross_cache=False, length=LENGTH):
    return generation_profiles(
        _source(config), BATCH, SOURCE, GenerationSettings(length, beams, cross_cache), 2
    )


def _estimate(config, beams=1, cross_cache=False, length=LENGTH, layers_per_ipu=(2, 2)):
    settings = GenerationSettings(length, beams, cross_cache)
    ipu_config = IPUConfig(layers_per_ipu=list(layers_per_ipu), ipus_per_replica=len(layers_per_ipu)).eval()
    profiles = generation_profiles(_source(config), BATCH, SOURCE, settings, 2)
    return estimate_generation(profiles, ipu_config, settings, batch_size=BATCH, hardware=MK2)


def _matmul_flops(profile) -> int:
    return sum(m.flops for b in profile.blocks for m in b.matmuls)


def test_the_kv_cache_is_two_tensors_per_layer_of_rows_by_max_length_by_attention_width():
    """2 x layers x beams x batch x max_length x (heads x head size) x 2 bytes, on the decoder's IPUs only.
    Heads x head size is d_model for BART and Whisper; T5's d_kv may make it narrower."""
    whisper = tiny_whisper_config(layers=2)  # d_model 16
    per_layer = 2 * 3 * BATCH * LENGTH * 16 * 2  # 3,072 bytes
    assert _profiles(whisper, beams=3).kv_cache_bytes == [per_layer, per_layer]
    report = _estimate(whisper, beams=3)
    assert [m.kv_cache for m in report.memory.ipus] == [0, 2 * per_layer]  # both decoder layers on IPU 1
    assert "kv cache" in report.summary()
    t5 = tiny_t5_config(layers=2, d_kv=4)  # 2 heads x 4 = 8, half of d_model 16
    assert _profiles(t5).kv_cache_bytes == [2 * BATCH * LENGTH * 8 * 2] * 2
    # With use_cross_cache the cross-attention's keys and values over the source are kept as well.
    assert _profiles(whisper, cross_cache=True).kv_cache_bytes == [2 * BATCH * (LENGTH + 16) * 16 * 2] * 2


@pytest.mark.parametrize("cross_cache", [True, False])
def test_a_decoder_call_does_two_flops_per_weight_per_row_plus_attention_over_max_length(cross_cache):
    """Per row and token, by hand for BART (d 16, FFN 32, vocab 64, 2 decoder layers, source 16, cache 8):
    the projections read each weight once (2 FLOPs per weight: self q/k/v/o, cross q/o, FFN, LM head),
    attention reads the whole cache (q.K and P.V over max_length: 4 L d) and the source (4 S d), and the
    IPU writes the new key and value into the cache as a one-hot product over max_length (4 L d). Without
    the cross cache, each step projects the source's keys and values again (2 x 2 S d^2)."""
    d, ffn, vocab, layers, rows = 16, 32, 64, 2, BATCH
    weights_per_token = layers * (4 * d * d + 2 * d * d + 2 * d * ffn) + d * vocab
    attention = layers * (4 * LENGTH * d + 4 * SOURCE * d + 4 * LENGTH * d)
    cross_projections = 0 if cross_cache else layers * 2 * 2 * SOURCE * d * d
    expected = rows * (2 * weights_per_token + attention + cross_projections)
    step = _profiles(tiny_bart_config(layers=2), cross_cache=cross_cache).step
    assert _matmul_flops(program(step)) == expected


def test_beams_multiply_the_decoders_rows_and_leave_the_encoder_alone():
    config = tiny_bart_config(layers=2)
    one, three = _profiles(config), _profiles(config, beams=3)
    assert _matmul_flops(three.step) == 3 * _matmul_flops(one.step)
    assert three.kv_cache_bytes == [3 * b for b in one.kv_cache_bytes]
    assert three.step.output_bytes == 3 * one.step.output_bytes  # each row's next-token logits
    # The encoder runs on the batch; its output is then repeated for each beam.
    assert canonical(three.encoder) == canonical(one.encoder)
    assert _estimate(config, beams=3).encoder_time == _estimate(config).encoder_time


@pytest.mark.parametrize("make", [tiny_bart_config, tiny_t5_config, tiny_whisper_config])
def test_a_batch_costs_the_encoder_once_and_the_decoder_once_per_generated_token(make):
    """encoder + (max_length - 1) x step. Fails if the encoder were counted per token, or run on the rows."""
    for length in (4, LENGTH):
        report = _estimate(make(layers=2), length=length)
        assert report.batch_time == pytest.approx(
            report.encoder_time + (length - 1) * report.step_time, rel=1e-12
        )
        assert report.samples_per_second == pytest.approx(BATCH / report.batch_time)
        assert report.tokens_per_second == pytest.approx(BATCH * (length - 1) / report.batch_time)
    # The encoder's call is its program priced alone: its blocks on its own IPU, one batch of sources.
    encoder = program(_profiles(make(layers=2)).encoder)
    workload = Workload(micro_batch_size=BATCH, ipus_per_replica=1, training=False)
    alone = estimate_performance(encoder, encoder.placement([2], 1), workload, MK2)
    assert report.encoder_time == pytest.approx(alone.call_time, rel=1e-12)
    assert {b.name for b in encoder.blocks}.isdisjoint(b.name for b in program(_profiles(make(layers=2)).step).blocks
                                                       if b.kind == "layer")  # fmt: skip


def test_a_longer_cache_makes_every_step_slower_and_the_encoder_no_slower():
    config = tiny_whisper_config(layers=2)
    short, long = _estimate(config, length=4), _estimate(config, length=LENGTH * 4)
    assert long.step_time > short.step_time and long.encoder_time == short.encoder_time


def _on_device(config, steps, beams=1, length=LENGTH):
    settings = GenerationSettings(length, beams, on_device_steps=steps)
    ipu_config = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2).eval()
    profiles = generation_profiles(_source(config), BATCH, SOURCE, settings, 2)
    return profiles, estimate_generation(profiles, ipu_config, settings, batch_size=BATCH, hardware=MK2)


def test_on_device_steps_loop_the_decoder_on_the_ipus_and_call_the_host_once_per_k_tokens():
    """on_device_generation_steps k: one call runs k decoder steps (k times the device time of one),
    streams k steps' inputs and returns the chosen tokens, not logits; a batch makes (max_length - 1) // k
    calls, stopping short of max_length when k does not divide it."""
    config = tiny_whisper_config(layers=2)
    _, one = _on_device(config, 1)
    profiles, three = _on_device(config, 3)
    device = [r.call_time - r.decoder.performance.host_time for r in (one, three)]
    assert device[1] == pytest.approx(3 * device[0], rel=1e-12)
    assert three.settings.calls == 2 and three.settings.tokens == 6  # 7 steps to max_length 8: one left out
    assert three.batch_time == pytest.approx(three.encoder_time + 2 * three.call_time, rel=1e-12)
    assert three.step_time == pytest.approx(three.call_time / 3)
    assert (
        program(profiles.step, profiles.returned_bytes).output_bytes == 4 * BATCH
    )  # one int32 token per row
    beams, _ = _on_device(config, 1, beams=2)
    assert beams.returned_bytes == 4 * BATCH * 2 * 2  # the best 2 x beams candidates of each source
    host_per_token = [r.decoder.performance.host_time / r.settings.tokens_per_call for r in (one, three)]
    assert host_per_token[1] < host_per_token[0]  # the host's fixed cost is paid once per 3 tokens


def test_each_program_runs_on_the_ipus_its_layers_fill():
    """[1, 1, 1, 1] over 2 + 2 layers: the encoder takes IPUs 0-1, the decoder 2-3, as
    split_encoder_decoder_ipu_config cuts them; the tied LM head goes with the decoder."""
    report = _estimate(tiny_bart_config(layers=2), layers_per_ipu=(1, 1, 1, 1))
    assert report.encoder_ipus == 2 and [m.ipu for m in report.memory.ipus] == [0, 1, 2, 3]
    assert report.encoder.layers_per_ipu == [1, 1] and report.decoder.layers_per_ipu == [1, 1]
    assert dict(report.decoder.allocation)["LM Head"] == 0  # the decoder's own IPU 0: IPU 2 of the replica
    assert "Encoder 0" not in dict(report.decoder.allocation)


# -- the command --------------------------------------------------------------------------------------


def _plan(capsys, *argv):
    code = cli.main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_prices_whisper_generation_with_its_bundled_config(tmp_path, capsys):
    tiny_whisper_config(layers=4).save_pretrained(tmp_path)  # [4, 4], as Graphcore/whisper-tiny-ipu places
    json_path = tmp_path / "generation.json"
    code, out, err = _plan(capsys, str(tmp_path), "--task", "speech-recognition", "--ipu-config",
                           "Graphcore/whisper-tiny-ipu", "--inference", "--generation_max_length", "16",
                           "--num_beams", "2", "--json", str(json_path))  # fmt: skip
    assert code == 0, err
    assert "IPU generation estimate" in out and "once per token" in out and "kv cache" in out
    assert "Batch of 1 x 2 beams = 2 rows; generation_max_length 16" in out
    data = json.loads(json_path.read_text())
    assert data["generation"] == {"max_length": 16, "num_beams": 2, "cross_cache": False, "on_device_steps": 0,
                                  "steps": 15, "calls": 15, "tokens": 15}  # fmt: skip
    assert data["batch_seconds"] == pytest.approx(data["encoder_seconds"] + 15 * data["call_seconds"])
    assert (
        data["memory"]["ipus"][1]["kv_cache"] == 2 * 4 * 2 * 16 * 16 * 2
    )  # 2 x layers x rows x L x d x bytes


def test_plan_trains_whisper_for_speech_recognition(tmp_path, capsys):
    tiny_whisper_config(layers=4).save_pretrained(tmp_path)
    code, out, err = _plan(capsys, str(tmp_path), "--task", "speech-recognition", "--ipu-config",
                           "Graphcore/whisper-tiny-ipu", "--seq-len", "16")  # fmt: skip
    assert code == 0, err
    assert "AutoModelForSpeechSeq2Seq" in out and "Layers per IPU: [4, 4]" in out and "training" in out


def _bart_plan(tmp_path, *argv):
    tiny_bart_config(layers=2).save_pretrained(tmp_path)
    return [str(tmp_path), "--task", "summarization", "--ipu-config", "Graphcore/whisper-tiny-ipu", "--overrides",
            "layers_per_ipu=[2 2]", "--seq-len", "16", *argv]  # fmt: skip


@pytest.mark.parametrize(
    "argv,expected",
    [
        (
            ["--inference", "--generation_max_length", "1"],
            "--generation_max_length 1: a generation needs at least 2",
        ),
        (
            ["--generation_max_length", "8"],
            "--generation_max_length 8: a generation is inference; add --inference",
        ),
        (
            ["--inference", "--generation_max_length", "99"],
            "--generation_max_length 99 is longer than the 64",
        ),
        (
            ["--inference", "--pipelined", "--num_beams", "2"],
            "--num_beams 2 with --pipelined: Optimum Graphcore",
        ),
        (["--inference", "--auto", "--use_cross_cache"], "--use_cross_cache with --auto"),
        (
            ["--inference", "--generation_max_length", "8", "--on_device_generation_steps", "9"],
            "--on_device_generation_steps 9: a generation to --generation_max_length 8 has 7 decoder steps",
        ),
    ],
)
def test_bad_generation_flags_name_the_flag_the_value_and_the_fix(tmp_path, capsys, argv, expected):
    code, _, err = _plan(capsys, *_bart_plan(tmp_path, *argv))
    assert code == 2
    assert expected in err


def test_zero_beams_is_refused_when_parsed(tmp_path, capsys):
    assert cli.main(["plan", *_bart_plan(tmp_path, "--inference", "--num_beams", "0")]) == 2
    assert (
        "--num_beams/--num-beams/--generation_num_beams: must be an integer >= 1, got 0"
        in capsys.readouterr().err
    )


def test_generation_flags_on_a_model_that_does_not_generate_are_refused(capsys):
    code, _, err = _plan(capsys, "bert-base-uncased", "--ipu-config", "Graphcore/bert-base-ipu", "--inference",
                         "--generation_max_length", "64")  # fmt: skip
    assert code == 2
    assert (
        "--generation_max_length 64: bert-base-uncased plans AutoModelForQuestionAnswering, which does not generate"
        in err
    )
    assert "drop --generation_max_length" in err
