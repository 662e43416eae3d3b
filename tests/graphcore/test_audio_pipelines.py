"""`optimum.graphcore.pipeline` for audio: "automatic-speech-recognition" (CTC models, Whisper) and
"audio-classification" give plain transformers' `pipeline()` answers on the same tiny models and audio,
with the model calls made on the simulated IPU (optimum_ipu/compat/audio_pipelines.py)."""

import json

import numpy as np
import pytest
import torch
import transformers
from fixtures import seeded, tiny_speech_config, tiny_whisper_config
from transformers import (
    AutoModelForAudioClassification,
    Wav2Vec2CTCTokenizer,
    Wav2Vec2FeatureExtractor,
    Wav2Vec2ForCTC,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperTokenizer,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from optimum.graphcore import IPUConfig, pipeline
from optimum.graphcore.pipelines import IPUAutomaticSpeechRecognitionPipeline, list_tasks
from optimum_ipu.compat.pipelines import IPUInference

# Inference on 2 IPUs (an inference_layers_per_ipu of [-1] alone means 1 IPU, as in Optimum Graphcore).
TWO_IPUS = IPUConfig(
    layers_per_ipu=[-1], ipus_per_replica=2, inference_layers_per_ipu=[-1], inference_ipus_per_replica=2
)
LETTERS = "etaoinshrdl"


class CountedIPU(IPUInference):
    """The pipeline's IPU, counting its host calls and generations: the answers must come from the IPU."""

    calls = generations = 0

    def __call__(self, inputs):
        self.calls += 1
        return super().__call__(inputs)

    def generating(self, prompt):
        self.generations += 1
        return super().generating(prompt)


def _audio(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def ctc_tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ctc-tokenizer")
    vocab = {"<pad>": 0, "<unk>": 1, "|": 2, **{c: i + 3 for i, c in enumerate(LETTERS)}}  # 14 of the 16 ids
    (folder / "vocab.json").write_text(json.dumps(vocab))
    return Wav2Vec2CTCTokenizer(str(folder / "vocab.json"), word_delimiter_token="|")


def _extractor() -> Wav2Vec2FeatureExtractor:
    return Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True)


def _ctc_model():
    seeded(0)
    return Wav2Vec2ForCTC(tiny_speech_config(vocab_size=16)).eval()


def test_the_tasks_include_optimum_graphcores_audio_tasks():
    assert {"automatic-speech-recognition", "audio-classification"} <= set(list_tasks())


@pytest.mark.parametrize("chunked", [False, True])
def test_ctc_speech_recognition_gives_the_plain_pipelines_text(ctc_tokenizer, chunked):
    audio = _audio(2.0)
    options = {"chunk_length_s": 0.5, "stride_length_s": 0.1} if chunked else {}
    plain = transformers.pipeline(
        "automatic-speech-recognition", model=_ctc_model(), tokenizer=ctc_tokenizer,
        feature_extractor=_extractor(), device="cpu", **options,
    )  # fmt: skip
    ours = pipeline(
        "automatic-speech-recognition", model=_ctc_model(), tokenizer=ctc_tokenizer,
        feature_extractor=_extractor(), ipu_config=TWO_IPUS, fp16=False, **options,
    )  # fmt: skip
    assert isinstance(ours, IPUAutomaticSpeechRecognitionPipeline)
    ours.ipu.__class__ = CountedIPU
    forwards = []
    plain.model.register_forward_hook(lambda *_: forwards.append(1))
    expected = plain(audio.copy())["text"]
    assert expected  # random weights still emit letters: an empty text would compare nothing
    assert ours(audio.copy())["text"] == expected
    assert ours.ipu.calls == len(forwards) == (6 if chunked else 1)  # windows start every 0.3 s: 0 .. 1.5 s
    assert {b.ipu for b in ours.ipu.pipelined.plan.blocks} == {0, 1}


def test_ctc_speech_recognition_in_fp16_runs_on_the_ipu(ctc_tokenizer):
    ours = pipeline(
        "automatic-speech-recognition", model=_ctc_model(), tokenizer=ctc_tokenizer,
        feature_extractor=_extractor(), ipu_config=TWO_IPUS,
    )  # fmt: skip
    ours.ipu.__class__ = CountedIPU
    out = ours([_audio(1.0), _audio(1.0, seed=1)])
    assert [set(o) for o in out] == [{"text"}] * 2 and ours.ipu.calls == 2
    assert next(ours.model.parameters()).dtype == torch.float16


def test_audio_classification_gives_the_plain_pipelines_labels_and_scores():
    labels = {0: "yes", 1: "no", 2: "up"}

    def model():
        seeded(0)
        config = tiny_speech_config(
            model_type="hubert", id2label=labels, label2id={v: k for k, v in labels.items()}
        )
        return AutoModelForAudioClassification.from_config(config).eval()

    audio = _audio(1.0)
    plain = transformers.pipeline(
        "audio-classification", model=model(), feature_extractor=_extractor(), device="cpu"
    )
    ours = pipeline("audio-classification", model=model(), feature_extractor=_extractor(), ipu_config=TWO_IPUS,
                    fp16=False)  # fmt: skip
    ours.ipu.__class__ = CountedIPU
    expected, got = plain(audio.copy(), top_k=3), ours(audio.copy(), top_k=3)
    assert [r["label"] for r in got] == [r["label"] for r in expected]
    assert [r["score"] for r in got] == pytest.approx([r["score"] for r in expected], abs=1e-6)
    assert ours.ipu.calls == 1


def test_a_model_object_needs_its_processors():
    with pytest.raises(
        ValueError, match=r"needs its processors: pipeline\(\.\.\., feature_extractor= and tokenizer=\)"
    ):
        pipeline("automatic-speech-recognition", model=_ctc_model(), ipu_config=TWO_IPUS)


WHISPER_SPECIALS = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|transcribe|>",
    "<|translate|>",
    "<|notimestamps|>",
]


@pytest.fixture(scope="module")
def whisper_processors(tmp_path_factory):
    """A 64-token Whisper tokenizer (letters, the special tokens, then timestamps) and a feature extractor
    of 8 mel bins making 100 frames of a 1 s window."""
    folder = tmp_path_factory.mktemp("whisper-tokenizer")
    to_unicode = bytes_to_unicode()
    vocab = {to_unicode[ord(c)]: i for i, c in enumerate(" " + "etaoinshrdlucmfwypvbgkjqxz")}
    for token in WHISPER_SPECIALS:
        vocab[token] = len(vocab)
    while len(vocab) < 64:
        vocab[f"<|{(len(vocab) - vocab['<|notimestamps|>'] - 1) * 0.02:.2f}|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    end = "<|endoftext|>"
    tokenizer = WhisperTokenizer(
        str(folder / "vocab.json"), str(folder / "merges.txt"), unk_token=end, bos_token=end, eos_token=end,
        pad_token=end,
    )  # fmt: skip
    extractor = WhisperFeatureExtractor(feature_size=8, sampling_rate=16000, hop_length=160, chunk_length=1)
    return tokenizer, extractor, vocab


def _whisper(vocab):
    seeded(0)
    end, start = vocab["<|endoftext|>"], vocab["<|startoftranscript|>"]
    config = tiny_whisper_config(max_source_positions=50, eos_token_id=end, bos_token_id=end, pad_token_id=end,
                                 decoder_start_token_id=start)  # fmt: skip
    return WhisperForConditionalGeneration(config).eval()


@pytest.mark.parametrize("num_beams", [1, 2])
def test_whisper_speech_recognition_gives_the_plain_pipelines_text(whisper_processors, num_beams):
    tokenizer, extractor, vocab = whisper_processors
    generate = {"max_new_tokens": 8, "num_beams": num_beams}
    plain = transformers.pipeline("automatic-speech-recognition", model=_whisper(vocab), tokenizer=tokenizer,
                                  feature_extractor=extractor, device="cpu")  # fmt: skip
    ours = pipeline("automatic-speech-recognition", model=_whisper(vocab), tokenizer=tokenizer,
                    feature_extractor=extractor, ipu_config=TWO_IPUS, fp16=False)  # fmt: skip
    ours.ipu.__class__ = CountedIPU
    expected = plain(_audio(1.0), generate_kwargs=generate)["text"]
    assert expected
    assert ours(_audio(1.0), generate_kwargs=generate)["text"] == expected
    assert ours.ipu.generations == 1
    assert {b.ipu for b in ours.ipu.pipelined.plan.layer_blocks} == {
        0,
        1,
    }  # encoder and decoder on their IPUs


def test_whisper_speech_recognition_in_fp16(whisper_processors):
    tokenizer, extractor, vocab = whisper_processors
    ours = pipeline("automatic-speech-recognition", model=_whisper(vocab), tokenizer=tokenizer,
                    feature_extractor=extractor, ipu_config=TWO_IPUS)  # fmt: skip
    ours.ipu.__class__ = CountedIPU
    out = ours(_audio(1.0), generate_kwargs={"max_new_tokens": 4})
    assert set(out) == {"text"} and ours.ipu.generations == 1
