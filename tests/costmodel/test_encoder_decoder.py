"""The cost model prices encoder-decoder layouts where pipelining puts them: `optimum-ipu plan --task
summarization|translation|speech-recognition` on BART, T5, Graphcore/mt5-small-ipu and Whisper."""

from __future__ import annotations

import pytest
from fixtures import tiny_bart_config, tiny_t5_config, tiny_whisper_config

from optimum_ipu import cli
from optimum_ipu.costmodel.presets import build_meta_model, resolve_model
from optimum_ipu.costmodel.profiling import trace_source
from optimum_ipu.pipelining.placement import stage_of_each_block
from optimum_ipu.pipelining.spec import spec_for
from optimum_ipu.pipelining.stage_plan import build_stage_plan


@pytest.fixture(autouse=True)
def profile_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTIMUM_IPU_CACHE", str(tmp_path / "cache"))


CONFIGS = {
    "bart": (lambda: tiny_bart_config(layers=4), "summarization", [1, 3, 2, 2]),
    "t5": (lambda: tiny_t5_config(layers=4), "translation", [2, 2, 2, 2]),
    "mt5": (lambda: tiny_t5_config(layers=8, mt5=True), "translation", [0, 8, 8, 0]),
    # The output projection, tied to the decoder's embedding, on that embedding's IPU (not IPU 0).
    "whisper": (lambda: tiny_whisper_config(layers=2), "speech-recognition", [1, 1, 1, 1]),
}


@pytest.mark.parametrize("key", list(CONFIGS))
def test_the_cost_model_places_every_block_where_pipelining_does(tmp_path, key):
    """Encoder then decoder layers by layers_per_ipu, the stacks' final norms with their last layer, BART's
    decoder embedding and the tied LM head back on IPU 0: the profile's placement is the stage plan's."""
    make, task, layers = CONFIGS[key]
    make().save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path), task)
    profile = trace_source(source, micro_batch=1, seq_len=16, image_size=None, training=True, float_bytes=2)
    plan = build_stage_plan(build_meta_model(source), spec_for(build_meta_model(source)), layers, 4)
    placed = profile.placement(layers, 4)
    assert placed == {b.name: b.ipu for b in plan.blocks}
    stages = stage_of_each_block([placed[b.name] for b in profile.blocks], 4)
    assert max([3, *stages]) + 1 == plan.forward_stages  # the report prices the pipeline that compiles


def test_plan_prices_mt5_with_its_bundled_config(tmp_path, capsys):
    CONFIGS["mt5"][0]().save_pretrained(tmp_path)
    code = cli.main(["plan", str(tmp_path), "--task", "translation", "--ipu-config", "Graphcore/mt5-small-ipu",
                     "--seq-len", "32"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Layers per IPU: [0, 8, 8, 0]" in out and "AutoModelForSeq2SeqLM" in out
    assert "5 pipeline stages on 4 IPUs" in out  # the tied LM head's return to IPU 0, as pipelining counts


def test_encoder_decoder_models_plan_summarization_by_default(tmp_path):
    tiny_bart_config().save_pretrained(tmp_path)  # a config without `architectures`
    assert resolve_model(str(tmp_path)).builder == "AutoModelForSeq2SeqLM"


@pytest.mark.parametrize("key", ["t5", "whisper", "bart"])
@pytest.mark.parametrize("inference", [True, False])
def test_the_base_model_of_an_encoder_decoder_is_priced_with_decoder_inputs(tmp_path, capsys, key, inference):
    """`--task base` builds the model without a head (T5Model, WhisperModel, BartModel): its forward needs
    decoder inputs as well as the encoder's, which the traced micro-batch gives it (of `--seq-len` tokens),
    as a seq2seq task's labels do; without them transformers refused the trace."""
    make, _, layers = CONFIGS[key]
    make().save_pretrained(tmp_path)
    ipu_config = tmp_path / "ipu_config.json"
    ipu_config.write_text(f'{{"layers_per_ipu": {layers}, "ipus_per_replica": 4}}')
    args = ["plan", str(tmp_path), "--task", "base", "--ipu-config", str(ipu_config), "--seq-len", "16"]
    code = cli.main(args + (["--inference"] if inference else []))
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "samples/s" in out.out


def test_a_t5_encoder_alone_is_planned_from_its_configs_architectures(tmp_path, capsys):
    """Sentence-T5 checkpoints are T5's encoder alone (`"architectures": ["T5EncoderModel"]`), as Optimum
    Graphcore's text-embeddings notebook runs them: plan builds that class, with no decoder to price."""
    config = tiny_t5_config(layers=4)
    config.architectures = ["T5EncoderModel"]
    config.save_pretrained(tmp_path)
    assert resolve_model(str(tmp_path)).builder == "T5EncoderModel"
    ipu_config = tmp_path / "ipu_config.json"
    ipu_config.write_text('{"layers_per_ipu": [4], "ipus_per_replica": 1, "inference_device_iterations": 8}')
    code = cli.main(["plan", str(tmp_path), "--ipu-config", str(ipu_config), "--seq-len", "16", "--inference"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "T5EncoderModel" in out.out and "decoder" not in out.out.lower()


@pytest.mark.parametrize(
    ("key", "task", "given"),
    [("t5", "base", True), ("whisper", "base", True), ("bart", "base", False), ("t5", "question-answering", False),
     ("t5", "translation", False)],
)  # fmt: skip
def test_decoder_inputs_are_streamed_only_to_a_model_that_cannot_make_them(tmp_path, key, task, given):
    """BART's base model and the heads given labels or answer positions shift their decoder inputs out of
    what they have, on the device: the host streams them only to T5's and Whisper's base models."""
    from optimum_ipu.costmodel.trace import sample_inputs_for

    CONFIGS[key][0]().save_pretrained(tmp_path)
    model = build_meta_model(resolve_model(str(tmp_path), task))
    assert ("decoder_input_ids" in sample_inputs_for(model, 2, seq_len=16)) is given
