"""Model presets for offline planning: public architectures by name, and the meta-device model builder.

`optimum-ipu plan` and `bench/calibration.py` price models by name without the Hub: a preset is the
architecture hyper-parameters of a public checkpoint (its `config.json`), a folder or `config.json`
path works as well. `build_meta_model` builds the model on the meta device, so nothing is allocated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Architecture hyper-parameters of public checkpoints (their config.json), for offline planning.
_BERT_BASE = dict(model_type="bert", vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2)  # fmt: skip
_BERT_LARGE = dict(
    _BERT_BASE, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
)
_ROBERTA_BASE = dict(_BERT_BASE, model_type="roberta", vocab_size=50265, max_position_embeddings=514,
                     type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)  # fmt: skip
_ROBERTA_LARGE = dict(_ROBERTA_BASE, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                      intermediate_size=4096)  # fmt: skip
_DISTILBERT = dict(model_type="distilbert", vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
                   max_position_embeddings=512)  # fmt: skip
_GPT2 = dict(model_type="gpt2", vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
_GPT2_MEDIUM = dict(_GPT2, n_embd=1024, n_layer=24, n_head=16)
_VIT_BASE = dict(model_type="vit", hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, image_size=224, patch_size=16, num_channels=3, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)  # fmt: skip
_MPNET_BASE = dict(model_type="mpnet", vocab_size=30527, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                   intermediate_size=3072, max_position_embeddings=514, layer_norm_eps=1e-5)  # fmt: skip
# Wav2Vec2Config's and HubertConfig's defaults are the base checkpoints' (7 convolutions of 512 channels,
# group norm, 12 post-norm layers); the CTC fine-tunes add a 32-character vocabulary.
_WAV2VEC2_BASE = dict(model_type="wav2vec2", vocab_size=32)
_WAV2VEC2_LARGE = dict(_WAV2VEC2_BASE, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                       intermediate_size=4096, feat_extract_norm="layer", do_stable_layer_norm=True,
                       conv_bias=True)  # fmt: skip
_HUBERT_BASE = dict(model_type="hubert", vocab_size=32)
# Encoder-decoder checkpoints (their config.json): BART, T5 / MT5 (MT5's LM head is untied), and Whisper,
# whose encoder reads one 30 s window of 80 log-mel bins (3000 frames, 1500 after its convolutions).
_BART_BASE = dict(model_type="bart", vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6,
                  encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                  max_position_embeddings=1024)  # fmt: skip
_BART_LARGE = dict(_BART_BASE, d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
                   decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096)  # fmt: skip
_T5_SMALL = dict(model_type="t5", vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                 feed_forward_proj="relu", decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)  # fmt: skip
_MT5_SMALL = dict(model_type="mt5", vocab_size=250112, d_model=512, d_kv=64, d_ff=1024, num_layers=8, num_heads=6,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False)  # fmt: skip
_WHISPER_TINY = dict(model_type="whisper", vocab_size=51865, d_model=384, encoder_layers=4, decoder_layers=4,
                     encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536,
                     num_mel_bins=80, max_source_positions=1500, max_target_positions=448)  # fmt: skip

PRESETS: dict[str, dict[str, Any]] = {
    "bert-base-uncased": _BERT_BASE,
    "bert-large-uncased": _BERT_LARGE,
    "bert-base-cased": dict(_BERT_BASE, vocab_size=28996),
    "bert-large-cased": dict(_BERT_LARGE, vocab_size=28996),
    "roberta-base": _ROBERTA_BASE,
    "roberta-large": _ROBERTA_LARGE,
    "distilbert-base-uncased": _DISTILBERT,
    "gpt2": _GPT2,
    "gpt2-medium": _GPT2_MEDIUM,
    "google/vit-base-patch16-224-in21k": _VIT_BASE,
    "google/vit-base-patch16-224": dict(_VIT_BASE, num_labels=1000),
    "microsoft/mpnet-base": _MPNET_BASE,
    "facebook/wav2vec2-base": _WAV2VEC2_BASE,
    "facebook/wav2vec2-large-lv60": _WAV2VEC2_LARGE,
    "facebook/hubert-base-ls960": _HUBERT_BASE,
    "facebook/bart-base": _BART_BASE,
    "facebook/bart-large": _BART_LARGE,
    "t5-small": _T5_SMALL,
    "google/mt5-small": _MT5_SMALL,
    "openai/whisper-tiny": _WHISPER_TINY,
}
# Hub ids that name the same checkpoints (the Hub's renamed repos, Graphcore's copies).
ALIASES = {
    "google-bert/bert-base-uncased": "bert-base-uncased",
    "google-bert/bert-large-uncased": "bert-large-uncased",
    "Graphcore/bert-base-uncased": "bert-base-uncased",
    "FacebookAI/roberta-base": "roberta-base",
    "FacebookAI/roberta-large": "roberta-large",
    "distilbert/distilbert-base-uncased": "distilbert-base-uncased",
    "openai-community/gpt2": "gpt2",
    "openai-community/gpt2-medium": "gpt2-medium",
    "facebook/wav2vec2-base-960h": "facebook/wav2vec2-base",
    "facebook/wav2vec2-large-960h-lv60-self": "facebook/wav2vec2-large-lv60",
    "sentence-transformers/all-mpnet-base-v2": "microsoft/mpnet-base",
    "google-t5/t5-small": "t5-small",
}
# --task -> transformers Auto class building that head.
TASKS = {
    "question-answering": "AutoModelForQuestionAnswering",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "masked-lm": "AutoModelForMaskedLM",
    "pretraining": "AutoModelForPreTraining",
    "causal-lm": "AutoModelForCausalLM",
    "image-classification": "AutoModelForImageClassification",
    "ctc": "AutoModelForCTC",
    "audio-classification": "AutoModelForAudioClassification",
    # Encoder-decoder models: the LM head, trained on (source, target) pairs of --seq-len tokens each.
    "summarization": "AutoModelForSeq2SeqLM",
    "translation": "AutoModelForSeq2SeqLM",
    # Whisper: log-mel features in, a transcript of --seq-len tokens out.
    "speech-recognition": "AutoModelForSpeechSeq2Seq",
    "base": "AutoModel",
}
# The tasks whose inference is a generation (`optimum-ipu plan --inference --generation_max_length`).
SEQ2SEQ_TASKS = ("summarization", "translation", "speech-recognition")
# Others: question-answering. The speech defaults are the heads of the bundled configs
# (Graphcore/wav2vec2-ctc-*-ipu, Graphcore/hubert-base-ipu).
_DEFAULT_TASK = {
    "vit": "image-classification",
    "gpt2": "causal-lm",
    "wav2vec2": "ctc",
    "hubert": "audio-classification",
    "bart": "summarization",
    "t5": "summarization",
    "mt5": "summarization",
    "whisper": "speech-recognition",
}


AUDIO_MODEL_TYPES = ("wav2vec2", "hubert")
_GENERATING_BUILDERS = {TASKS[task] for task in SEQ2SEQ_TASKS}


@dataclass(frozen=True)
class ModelSource:
    """A model to plan: its config as a dict and the class (or Auto class) that builds its head."""

    name: str
    config: dict[str, Any]
    builder: str

    @property
    def is_vision(self) -> bool:
        return "image_size" in self.config and "num_channels" in self.config

    @property
    def generates(self) -> bool:
        """An encoder-decoder model with an LM head, whose inference is a generation (BART, T5, MT5, Whisper)."""
        return self.builder in _GENERATING_BUILDERS or self.builder.endswith("ForConditionalGeneration")

    @property
    def is_audio(self) -> bool:
        """A speech model: its `--seq-len` counts feature frames (20 ms each for Wav2Vec2 and HuBERT)."""
        return self.config.get("model_type") in AUDIO_MODEL_TYPES


def resolve_model(name_or_path: str, task: str | None = None) -> ModelSource:
    """Find the config of `name_or_path` (folder, config.json or preset) and the class to build.

    Without `task` a config.json's `architectures` decides; else ViT plans image classification,
    GPT-2 causal LM, Wav2Vec2 CTC, HuBERT audio classification, and the BERT family (MPNet too)
    question answering.

    Raises:
        ValueError: unknown name (the message lists the presets) or unknown task.
    """
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    architectures: list[str] = []
    if path.is_file():
        config = _model_config(path)
        architectures = list(config.get("architectures") or [])
    else:
        preset = PRESETS.get(ALIASES.get(name_or_path, name_or_path))
        if preset is None:
            raise ValueError(
                f"{name_or_path!r} is neither a folder with config.json, a config.json, nor a preset. Presets: "
                f"{', '.join(PRESETS)} (and the Hub aliases {', '.join(ALIASES)})."
            )
        config = dict(preset)
    if task is not None and task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}.")
    if task is None and architectures:
        builder = architectures[0]
    else:
        builder = TASKS[task or _DEFAULT_TASK.get(config.get("model_type"), "question-answering")]
    return ModelSource(str(name_or_path), config, builder)


def _model_config(path: Path) -> dict[str, Any]:
    """A model's config.json, or a ValueError naming the file, what is wrong and the fix."""
    fix = "give a transformers model's folder or config.json (with its model_type), or a preset name"
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}): {fix}.") from None
    if not isinstance(config, dict) or "model_type" not in config:
        what = "is not a JSON object" if not isinstance(config, dict) else "has no model_type"
        looks = " (it looks like an IPU config: give it to --ipu-config)" if isinstance(config, dict) and (
            "layers_per_ipu" in config or "ipus_per_replica" in config) else ""  # fmt: skip
        raise ValueError(f"{path} {what}, so it is not a model's config{looks}: {fix}.")
    return config


def _untie_as_published(model, config: dict[str, Any]) -> None:
    """Give the LM head a weight of its own when the checkpoint's config says it is untied.

    MT5's checkpoints hold an LM head apart from the word embedding (`"tie_word_embeddings": false`),
    and Optimum Graphcore ran them so, on transformers 4.29: 128M more parameters on the IPU of the
    head, with their gradients and optimizer state. transformers 5 ties MT5's head whatever the config
    says, so the model it builds would price a layout Graphcore ran with a quarter of its memory missing.
    """
    import torch

    if config.get("tie_word_embeddings") is not False:
        return
    try:
        head, table = model.get_output_embeddings(), model.get_input_embeddings()
    except (AttributeError, NotImplementedError):  # a model without word embeddings (speech, vision)
        return
    if head is not None and table is not None:
        if head.weight is table.weight:
            head.weight = torch.nn.Parameter(torch.empty_like(table.weight))


def build_meta_model(source: ModelSource):
    """Build the model on the meta device: shapes only, nothing allocated (imports transformers)."""
    import torch
    import transformers

    values = {k: v for k, v in source.config.items() if k not in ("model_type", "architectures")}
    try:
        config = transformers.AutoConfig.for_model(source.config["model_type"], **values)
    except ValueError:
        raise ValueError(
            f"{source.name}: model_type {source.config['model_type']!r} is not one transformers "
            f"{transformers.__version__} knows; give a model of this transformers, or a preset ({', '.join(PRESETS)})."
        ) from None
    config._name_or_path = source.name
    cls = getattr(transformers, source.builder, None)
    if cls is None:
        raise ValueError(
            f"{source.name}: transformers {transformers.__version__} has no {source.builder} (its config's "
            f"architectures); pass --task ({', '.join(TASKS)}) to plan one of those heads instead."
        )
    with torch.device("meta"):
        try:
            model = cls.from_config(config) if source.builder.startswith("AutoModel") else cls(config)
        except ValueError as error:
            if "Unrecognized configuration class" not in str(error):
                raise
            raise ValueError(
                f"{source.name}: {source.builder} has no head for model_type {source.config['model_type']!r}; "
                f"pass the --task of a head this model has (or leave --task out: its config decides)."
            ) from None
        _untie_as_published(model, source.config)
    # A parameter made with the legacy `torch.Tensor(n)` constructor ignores the device context
    # (Wav2Vec2's and HuBERT's `masked_spec_embed`, one vector): move it too.
    return model.to("meta")
