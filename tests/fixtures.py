"""Tiny builders shared by the test suite: models, a word-level tokenizer, seeds.

Every test that needs a model builds it here, so the whole suite runs in seconds on a CPU and a
change to "what a tiny BERT is" happens in one place.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (
    BartConfig,
    BertConfig,
    HubertConfig,
    MPNetConfig,
    MT5Config,
    T5Config,
    ViTConfig,
    Wav2Vec2Config,
    WhisperConfig,
)

from optimum_ipu.costmodel.memory import MiB
from optimum_ipu.costmodel.profile import HOST, BlockProfile, Matmul, ModelProfile, Transfer
from optimum_ipu.costmodel.workload import Workload

# Words the tiny tokenizer knows besides the special tokens; the synthetic QA templates use these.
TINY_WORDS = (
    "the a of is in was what who where when which born city capital country river name year "
    "alice bob carol dave erin frank paris rome berlin madrid lisbon oslo vienna athens "
    "france italy germany spain portugal norway austria greece seine tiber spree "
    "red green blue color favorite likes lives works at as and to . , ? 1 2 3 4 5 6 7 8 9 0"
).split()
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_bert_config(**overrides) -> BertConfig:
    """A 4-layer BERT with hidden size 32; dropout off so equivalence tests compare exactly."""
    values = dict(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
    )
    values.update(overrides)
    return BertConfig(**values)


def tiny_mpnet_config(**overrides) -> MPNetConfig:
    """A 4-layer MPNet with hidden size 32 (its word embedding pads with id 1); dropout off."""
    values = dict(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=80,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    values.update(overrides)
    return MPNetConfig(**values)


def tiny_speech_config(model_type: str = "wav2vec2", convolutions: int = 3, **overrides):
    """A Wav2Vec2 (or HuBERT) with hidden size 32, 2 layers and `convolutions` feature-encoder
    convolutions (the first of kernel 10 / stride 5, the rest 3 / 2); no dropout, no SpecAugment masking
    or layer drop, so equivalence tests compare exactly. 16 tokens for CTC, 3 labels to classify."""
    kernels, strides = (10,) + (3,) * (convolutions - 1), (5,) + (2,) * (convolutions - 1)
    values = dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        conv_dim=(16,) * convolutions, conv_kernel=kernels, conv_stride=strides,
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=16, pad_token_id=0,
        num_labels=3, classifier_proj_size=16, mask_time_prob=0.0, layerdrop=0.0, hidden_dropout=0.0,
        activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
        ctc_loss_reduction="mean", ctc_zero_infinity=True,
    )  # fmt: skip
    values.update(overrides)
    return (HubertConfig if model_type == "hubert" else Wav2Vec2Config)(**values)


def tiny_vit_config(**overrides) -> ViTConfig:
    """A 4-layer ViT on 32 px images with 8 px patches; dropout off."""
    values = dict(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    values.update(overrides)
    return ViTConfig(**values)


def tiny_bart_config(layers: int = 2, **overrides) -> BartConfig:
    """A BART with d_model 16 and `layers` encoder and `layers` decoder layers over 64 tokens (pad 1,
    bos 0, eos 2, decoder start 2, as facebook/bart-*); dropout off."""
    values = dict(
        vocab_size=64, d_model=16, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
    )  # fmt: skip
    values.update(overrides)
    return BartConfig(**values)


def tiny_t5_config(layers: int = 2, mt5: bool = False, **overrides) -> T5Config:
    """A T5 (or MT5: gated GELU; transformers 5 ties its LM head whatever `tie_word_embeddings` says) with d_model 16, `layers` encoder and `layers`
    decoder layers over 64 tokens (pad 0 = decoder start, eos 1); dropout off."""
    values = dict(
        vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=layers, num_heads=2,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )  # fmt: skip
    if mt5:
        values.update(tie_word_embeddings=False, feed_forward_proj="gated-gelu")
    values.update(overrides)
    return (MT5Config if mt5 else T5Config)(**values)


def tiny_whisper_config(layers: int = 2, **overrides) -> WhisperConfig:
    """A Whisper with d_model 16, `layers` encoder and `layers` decoder layers, 8 mel bins and 32 input
    frames (16 after its stride-2 convolution), over 64 tokens; no tokens suppressed; dropout off."""
    values = dict(
        vocab_size=64, d_model=16, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=8,
        max_source_positions=16, max_target_positions=32, pad_token_id=1, bos_token_id=2, eos_token_id=3,
        decoder_start_token_id=2, suppress_tokens=[], begin_suppress_tokens=[], dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0,
    )  # fmt: skip
    values.update(overrides)
    return WhisperConfig(**values)


def write_tiny_vocab(directory: str | os.PathLike) -> Path:
    """Write a WordPiece `vocab.txt` with the special tokens and `TINY_WORDS`; return its path."""
    path = Path(directory) / "vocab.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(SPECIAL_TOKENS + list(dict.fromkeys(TINY_WORDS))) + "\n")
    return path


def tiny_tokenizer(directory: str | os.PathLike):
    """A fast, uncased BERT tokenizer over the tiny vocabulary (offsets mapping works)."""
    from transformers import BertTokenizer

    vocab_path = write_tiny_vocab(directory)
    vocab = {token: i for i, token in enumerate(vocab_path.read_text().split())}
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True)
    tokenizer.save_pretrained(directory)  # so scripts can load it by path like a Hub tokenizer
    return tokenizer


def seeded(seed: int = 0) -> None:
    torch.manual_seed(seed)


# --- Example scripts (examples/question-answering, examples/image-classification) ---------------

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
QA_EXAMPLE_DIR = EXAMPLES_DIR / "question-answering"
IMAGE_EXAMPLE_DIR = EXAMPLES_DIR / "image-classification"


def use_example(folder: str | os.PathLike) -> Path:
    """Put an example folder on `sys.path` so its modules (run_qa, chestxray, ...) import by name.

    The example folders have hyphens in their names and are scripts, not packages; their module
    names are distinct across folders, so both can be on the path at once.
    """
    import sys

    folder = Path(folder)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return folder


def write_synthetic_squad(
    directory: str | os.PathLike,
    train_questions: int = 60,
    validation_questions: int = 20,
    layout: str = "squad",
    unanswerable_fraction: float = 0.0,
    seed: int = 0,
) -> dict:
    """Generate SQuAD-format train/validation files with the example's generator; return paths by split."""
    use_example(QA_EXAMPLE_DIR)
    from make_synthetic_squad import make_dataset

    return make_dataset(directory, train_questions, validation_questions, seed, layout, unanswerable_fraction)


def tiny_qa_model_dir(directory: str | os.PathLike, **config_overrides) -> Path:
    """Save a tiny BERT question-answering model and the tiny tokenizer to `directory`; return it.

    Pass `num_hidden_layers=12` for a model that `Graphcore/bert-base-ipu`'s layout ([0,4,4,4]) fits.
    """
    from transformers import BertForQuestionAnswering

    seeded(0)
    directory = Path(directory)
    tiny_tokenizer(directory)
    BertForQuestionAnswering(tiny_bert_config(**config_overrides)).save_pretrained(directory)
    return directory


def write_synthetic_chestxray(
    directory: str | os.PathLike,
    patients: int = 24,
    max_images_per_patient: int = 4,
    image_size: int = 32,
    test_fraction: float = 0.0,
    seed: int = 0,
) -> Path:
    """Generate a tiny ChestX-ray14-shaped folder (images/ + Data_Entry CSV); return the folder."""
    use_example(IMAGE_EXAMPLE_DIR)
    from make_synthetic_chestxray import make_chestxray

    make_chestxray(directory, patients, max_images_per_patient, image_size, 0.3, test_fraction, seed)
    return Path(directory)


def tiny_vit_model_dir(directory: str | os.PathLike, **config_overrides) -> Path:
    """Save a randomly initialised tiny ViT classifier (`tiny_vit_config`) to `directory`; return it."""
    from transformers import ViTForImageClassification

    seeded(0)
    directory = Path(directory)
    ViTForImageClassification(tiny_vit_config(**config_overrides)).save_pretrained(directory)
    return directory


# --- Cost model: a synthetic profile with round numbers, and a workload -------------------------

P_LAYER, P_TABLE, SAVED, OUT, IDS = 1_000_000, 500_000, 10 * MiB, MiB, 1000
MATMUL = Matmul(1, 512, 1024, 1024)


def synthetic(layers: int = 4) -> ModelProfile:
    """A cost-model profile: embedding + `layers` identical layers + a head, with round numbers."""
    blocks = [
        BlockProfile("Embedding", "embedding", ("emb",), True, P_TABLE, P_TABLE, P_TABLE, output_bytes=OUT)
    ]
    blocks += [
        BlockProfile(
            f"Layer {i}",
            "layer",
            (f"layers.{i}",),
            parameters=P_LAYER,
            trainable_parameters=P_LAYER,
            matmuls=[MATMUL],
            other_ops=10,
            output_bytes=OUT,
            saved_bytes=SAVED,
        )
        for i in range(layers)
    ]
    blocks.append(BlockProfile("Head", "head", ("head",), parameters=10, trainable_parameters=10))
    names = [b.name for b in blocks]
    transfers = [Transfer(1, IDS, HOST, "Embedding", floating=False)]
    transfers += [Transfer(10 + i, OUT, a, b) for i, (a, b) in enumerate(zip(names, names[1:]))]
    return ModelProfile(blocks, transfers, micro_batch_size=1, float_bytes=2, input_bytes=IDS, training=True)


def workload(**changes) -> Workload:
    values = dict(
        micro_batch_size=1, gradient_accumulation_steps=8, ipus_per_replica=2, matmul_proportion=(0.2,)
    )
    values.update(changes)
    return Workload(**values)


# --- Optimum Graphcore compatibility (tests/graphcore): processors for the tiny models ------------


def tiny_image_processor(image_size: int = 32):
    """A ViT image processor for `tiny_vit_config` images (resize to `image_size`, mean and std 0.5).

    The PIL-backed class when transformers has it, so no torchvision is needed (nor warned about).
    """
    import transformers

    processor_class = getattr(transformers, "ViTImageProcessorPil", None) or transformers.ViTImageProcessor
    return processor_class(
        size={"height": image_size, "width": image_size}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )


# --- Training data for trainer tests ---------------------------------------------------------------


class PatternQA:
    """Learnable synthetic QA (a map-style torch data set): the answer starts at token 7, ends two later."""

    def __init__(self, n: int, seed: int = 0, seq: int = 16):
        g = torch.Generator().manual_seed(seed)
        self.seq = seq
        self.ids = torch.randint(10, 100, (n, seq), generator=g)
        self.start = torch.randint(1, seq - 3, (n,), generator=g)
        self.ids[torch.arange(n), self.start] = 7

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones(self.seq, dtype=torch.long),
            "start_positions": self.start[i],
            "end_positions": self.start[i] + 2,
        }


class PatternClassification:
    """Learnable synthetic sequence classification: the label says whether token 7 is in the sequence."""

    def __init__(self, n: int, seed: int = 0, seq: int = 12):
        g = torch.Generator().manual_seed(seed)
        self.seq = seq
        self.ids = torch.randint(10, 100, (n, seq), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        at = torch.randint(1, seq - 1, (n,), generator=g)
        self.ids[torch.arange(n)[self.labels == 1], at[self.labels == 1]] = 7

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        mask = torch.ones(self.seq, dtype=torch.long)
        return {"input_ids": self.ids[i], "attention_mask": mask, "labels": self.labels[i]}


class SyntheticAudio:
    """Random waveforms (`samples` long, 16 kHz-like) with CTC transcripts of `label_length` tokens in
    1..`vocab`-1 (0 is CTC's blank), or with one class out of `num_labels` when `task="classification"`.
    Nothing to learn beyond the data set itself: enough to check the arithmetic of training."""

    def __init__(self, n: int, samples: int = 1600, task: str = "ctc", label_length: int = 3, vocab: int = 16,
                 num_labels: int = 3, seed: int = 0):  # fmt: skip
        g = torch.Generator().manual_seed(seed)
        self.values = torch.randn(n, samples, generator=g)
        if task == "ctc":
            self.labels = torch.randint(1, vocab, (n, label_length), generator=g)
        else:
            self.labels = torch.randint(0, num_labels, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> dict:
        return {"input_values": self.values[i], "labels": self.labels[i]}


class SyntheticSeq2Seq:
    """Learnable synthetic sequence-to-sequence pairs: the target is the source's first tokens reversed.

    Sources are `source_length` ids in 4..`vocab`-1 (0..3 are special); targets `target_length` ids
    ending in `eos`. With `features=(mel_bins, frames)` the source is a random log-mel spectrogram
    (`input_features`, Whisper's input) instead of token ids.
    """

    def __init__(self, n: int, source_length: int = 10, target_length: int = 5, vocab: int = 64, eos: int = 2,
                 seed: int = 0, features: tuple[int, int] | None = None):  # fmt: skip
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(4, vocab, (n, source_length), generator=g)
        self.labels = torch.cat([self.ids[:, : target_length - 1].flip(1), torch.full((n, 1), eos)], dim=1)
        self.features = None if features is None else torch.randn(n, *features, generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        if self.features is not None:
            return {"input_features": self.features[i], "labels": self.labels[i]}
        mask = torch.ones(self.ids.shape[1], dtype=torch.long)
        return {"input_ids": self.ids[i], "attention_mask": mask, "labels": self.labels[i]}


# --- Launcher (tests/launcher): local files an Optimum Graphcore script reads ----------------------


def write_ipu_config(directory: str | os.PathLike, **values) -> Path:
    """Write an `ipu_config.json` for a tiny 4-layer model on 2 IPUs (GA 4, inference DI 1); return the folder."""
    import json

    config = {"layers_per_ipu": [2, 2], "ipus_per_replica": 2, "gradient_accumulation_steps": 4,
              "device_iterations": 1, "inference_device_iterations": 1, "matmul_proportion": 0.2}  # fmt: skip
    config.update(values)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ipu_config.json").write_text(json.dumps(config))
    return directory


def write_sentence_pairs_csv(path: str | os.PathLike, rows: int = 8, seed: int = 0) -> Path:
    """A GLUE-shaped CSV (sentence1, sentence2, label) over the tiny vocabulary."""
    import csv
    import random

    rng = random.Random(seed)
    path = Path(path)
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["sentence1", "sentence2", "label"])
        for _ in range(rows):
            writer.writerow(
                [
                    " ".join(rng.choices(TINY_WORDS, k=5)),
                    " ".join(rng.choices(TINY_WORDS, k=4)),
                    rng.randrange(2),
                ]
            )
    return path


def write_tiny_imagefolder(
    directory: str | os.PathLike, classes=("cat", "dog"), per_class: int = 2, size: int = 40
) -> Path:
    """An `imagefolder` layout (one folder per class, RGB PNGs of `size` px); return the folder."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    directory = Path(directory)
    for name in classes:
        (directory / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (size, size + 6, 3), dtype=np.uint8)).save(
                directory / name / f"{i}.png"
            )
    return directory


def write_wav(path: str | os.PathLike, samples, sampling_rate: int = 16000) -> Path:
    """`samples` (floats in [-1, 1], mono) as a 16-bit PCM WAV file, with Python's `wave` module."""
    import wave

    import numpy as np

    pcm = np.clip(np.round(np.asarray(samples) * 32767), -32768, 32767).astype("<i2")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(sampling_rate)
        writer.writeframes(pcm.tobytes())
    return path


def _tone(rng, frequency: float, seconds: float, sampling_rate: int = 16000):
    import numpy as np

    t = np.arange(int(sampling_rate * seconds)) / sampling_rate
    return 0.5 * np.sin(2 * np.pi * frequency * t) + 0.05 * rng.standard_normal(t.size)


def write_tiny_audiofolder(directory: str | os.PathLike, classes=("high", "low"), per_class: int = 4) -> Path:
    """An `audiofolder` of generated 16 kHz tones (split/label/N.wav): train and validation, `per_class`
    clips of 0.1-0.2 s per class in each (a higher tone per class); return the folder."""
    import numpy as np

    rng = np.random.default_rng(0)
    directory = Path(directory)
    for split in ("train", "validation"):
        for index, name in enumerate(classes):
            for i in range(per_class):
                frequency = 220.0 * (index + 1) * (1 + 0.05 * rng.random())
                write_wav(
                    directory / split / name / f"{i}.wav", _tone(rng, frequency, 0.1 + 0.1 * rng.random())
                )
    return directory


def write_tiny_speech_corpus(directory: str | os.PathLike, clips: int = 8) -> Path:
    """An `audiofolder` of transcribed clips (split/N.wav + metadata.csv with file_name, text) for CTC: each
    letter of an upper-case two-word text with punctuation is a 30 ms tone of its own pitch; train and test."""
    import numpy as np

    rng = np.random.default_rng(0)
    words = ["yes", "no", "up", "down", "go", "stop"]
    directory = Path(directory)
    for split in ("train", "test"):
        rows = ["file_name,text"]
        for i in range(clips):
            text = " ".join(words[j] for j in rng.integers(0, len(words), 2))
            audio = np.concatenate([_tone(rng, 200 + 40 * (ord(c) - 96), 0.03) for c in text])
            write_wav(directory / split / f"{i}.wav", audio)
            rows.append(f'{i}.wav,"{text.upper()}."')
        (directory / split / "metadata.csv").write_text("\n".join(rows) + "\n")
    return directory


def tiny_speech_model_dir(directory: str | os.PathLike, task: str = "classification", **overrides) -> Path:
    """A tiny random Wav2Vec2 (or HuBERT with model_type="hubert") and its feature extractor saved in `directory`:
    for "classification" an audio classifier, for "ctc" the bare encoder (the CTC head is made by the script,
    sized to the vocabulary it builds, as from a pretrained checkpoint)."""
    from transformers import AutoModel, AutoModelForAudioClassification, Wav2Vec2FeatureExtractor

    seeded(0)
    config = tiny_speech_config(**overrides)
    model_class = AutoModelForAudioClassification if task == "classification" else AutoModel
    model_class.from_config(config).save_pretrained(directory)
    Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True, return_attention_mask=True
    ).save_pretrained(directory)
    return Path(directory)


def tiny_seq2seq_model_dir(
    directory: str | os.PathLike, model_type: str = "bart", max_length: int = 24
) -> Path:
    """A tiny random BART (or T5 with model_type="t5") for conditional generation and the tiny tokenizer,
    saved in `directory`: the model's special ids are the tokenizer's ([PAD] pads; [SEP] ends a text; BART's
    decoder starts with [CLS], T5's with [PAD]); the tokenizer pads to `max_length` tokens by default."""
    from transformers import BartForConditionalGeneration, T5ForConditionalGeneration

    tokenizer = tiny_tokenizer(directory)
    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(directory)
    ids = dict(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.sep_token_id
    )
    seeded(0)
    if model_type == "t5":
        model = T5ForConditionalGeneration(
            tiny_t5_config(**ids, decoder_start_token_id=tokenizer.pad_token_id)
        )
    else:
        start = tokenizer.cls_token_id
        model = BartForConditionalGeneration(
            tiny_bart_config(**ids, bos_token_id=start, decoder_start_token_id=start)
        )
    model.save_pretrained(directory)
    return Path(directory)


def write_tiny_seq2seq_json(directory: str | os.PathLike, train: int = 32, evaluation: int = 8) -> Path:
    """JSON-lines files over the tiny vocabulary for both tasks, in train / validation / test splits:
    `summarization_{split}.json` rows {"text", "summary"} (every other word of the text is one of four names;
    the summary is "the", that name and "."), and `translation_{split}.json` rows {"translation": {"en", "xx"}} ("xx" is the English text's first
    six words, each replaced by a fixed other word); return the folder."""
    import json
    import random

    rng = random.Random(0)
    words = [w for w in TINY_WORDS if w not in ".,?"]
    other = dict(zip(words, rng.sample(words, len(words))))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("validation", evaluation), ("test", evaluation)):
        summaries, translations = [], []
        for _ in range(rows):
            text = [rng.choice(words) for _ in range(rng.randint(6, 10))]
            name = rng.choice(("alice", "bob", "carol", "dave"))
            about = [name if i % 2 == 0 else word for i, word in enumerate(text)]
            summaries.append({"text": " ".join(about) + " .", "summary": f"the {name} ."})
            translations.append(
                {"translation": {"en": " ".join(text), "xx": " ".join(other[w] for w in text[:6])}}
            )
        for name, records in (("summarization", summaries), ("translation", translations)):
            lines = "\n".join(json.dumps(record) for record in records)
            (directory / f"{name}_{split}.json").write_text(lines + "\n")
    return directory


def assert_same_answers(got, expected):
    """A pipeline's answers equal another's: lists and dicts alike, scores (floats, numpy scalars and
    arrays) equal to float rounding."""
    if isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same_answers(g, e)
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys()
        for key in expected:
            assert_same_answers(got[key], expected[key])
    elif isinstance(expected, (float, np.floating, np.ndarray)):
        # numpy float32 scores too: differently shaped matmuls (the placed model's blocks vs one model)
        # may differ in the last bits on another CPU's kernels (AVX2 vs AVX-512).
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    else:
        assert got == expected


class LinearRegression(torch.nn.Module):
    """A PopTorch training model's smallest shape: `(x, y) -> (prediction, mean squared error)`, weights
    seeded; the loss is computed in float32 (a half prediction is upcast)."""

    def __init__(self, features: int = 4, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(features, 1)

    def forward(self, x, y):
        out = self.linear(x)
        return out, torch.nn.functional.mse_loss(out.float(), y.float())


def stochastically_rounded_by_hand(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The IPU's stochastic rounding written out on torch's generator, the reference the runtime's rounding
    (torch ops and the compiled kernel alike) is checked against: one 32-bit draw per two elements, 13 random
    low bits of each 16-bit half added to the fp32 bit pattern, then cut. Returns fp32 values that convert to
    fp16 exactly."""
    words = torch.empty((x.numel() + 1) // 2, dtype=torch.int32).random_(generator=generator)
    noise = words.view(torch.int16)[: x.numel()].view(x.shape).to(torch.int32) & 0x1FFF
    return ((x.contiguous().view(torch.int32) + noise) & ~0x1FFF).view(torch.float32)
