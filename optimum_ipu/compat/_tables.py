"""What each `optimum.graphcore` module of Optimum Graphcore 0.7 exported, and what it is here.

An entry is ``"module:attr"`` (the name is that object) or `Missing(why, instead)` (the name imports
but raises `NoEquivalentError` on use). The public names come from Optimum Graphcore 0.7.1's
package and the modules its notebooks and example scripts import from.
"""

from __future__ import annotations

from optimum_ipu.compat._names import Missing

_GENERATION = Missing(
    "they are the original's PopTorch decoding internals (an on-device loop, attention classes with a KV cache "
    "in IPU memory)",
    "transformers' `model.generate()` on the placed model (`IPUSeq2SeqTrainer` with `predict_with_generate`), "
    "inside `optimum_ipu.generation.static_generation(model)` for the IPU's fixed-size KV cache",
)
_DIFFUSERS = {
    **{
        name: f"optimum_ipu.compat.diffusion:{name}"
        for name in ("IPUStableDiffusionPipeline", "IPUStableDiffusionImg2ImgPipeline", "IPUStableDiffusionInpaintPipeline")
    },
    **{
        name: f"optimum_ipu.compat.diffusion_placement:{name}"
        for name in ("get_default_ipu_configs", "INFERENCE_ENGINES_TO_MODEL_NAMES")
    },
}
_CUSTOM_OPS = Missing(
    "it is an IPU custom operation (Poplar codelet)",
    "keep the layer as it is (fp16 by default) or quantize with a torch tool on CPU/GPU",
)
_POPTORCH_LAYER = Missing(
    "it is a PopTorch-specific layer of the original's hand-written pipelined models",
    "the plain transformers layers; `embedding_serialization_factor` / `projection_serialization_factor` in "
    "the IPU config make `parallelize()` serialize the embedding and a tied head",
)


def _pipelined_missing(transformers_class: str) -> Missing:
    return Missing(
        "optimum-ipu has no cut spec for this architecture (it places BERT, RoBERTa, DistilBERT, GPT-2, ViT, "
        "MPNet, DeBERTa, Wav2Vec2, HuBERT, BART, T5, MT5 and Whisper)",
        f"load `transformers.{transformers_class}` and call `to_pipelined(model, ipu_config, force=True)` "
        "(the generic cut: the largest list of layers spread over the IPUs), or add a `CutSpec` to "
        "`optimum_ipu.pipelining.CUT_SPECS`",
    )


# Pipelined classes of 0.7 whose architecture has a cut spec here: adapters in compat.modeling.
PIPELINED_SUPPORTED = (
    "PipelinedBertModel", "PipelinedBertForMaskedLM", "PipelinedBertForMultipleChoice",
    "PipelinedBertForPreTraining", "PipelinedBertForQuestionAnswering",
    "PipelinedBertForSequenceClassification", "PipelinedBertForTokenClassification",
    "PipelinedDistilBertForMaskedLM", "PipelinedDistilBertForMultipleChoice",
    "PipelinedDistilBertForQuestionAnswering", "PipelinedDistilBertForSequenceClassification",
    "PipelinedDistilBertForTokenClassification",
    "PipelinedGPT2ForSequenceClassification", "PipelinedGPT2ForTokenClassification", "PipelinedGPT2LMHeadModel",
    "PipelinedRobertaForMaskedLM", "PipelinedRobertaForMultipleChoice", "PipelinedRobertaForQuestionAnswering",
    "PipelinedRobertaForSequenceClassification", "PipelinedRobertaForTokenClassification",
    "PipelinedViTForImageClassification",
    "PipelinedHubertForSequenceClassification", "PipelinedWav2Vec2ForPreTraining",
    "PipelinedMPNetModel", "PipelinedMPNetForMaskedLM",
    "PipelinedBartForConditionalGeneration", "PipelinedBartForSequenceClassification",
    "PipelinedMT5ForConditionalGeneration", "PipelinedT5ForConditionalGeneration", "PipelinedT5EncoderModel",
)  # fmt: skip
PIPELINED_UNSUPPORTED = ("PipelinedConvNextForImageClassification", "PipelinedLxmertForQuestionAnswering")

_CONFIG = {
    "IPUConfig": "optimum_ipu.configuration:IPUConfig",
    "IPU_CONFIG_NAME": "optimum_ipu.configuration:CONFIG_NAME",
    # The original raised it for a config that is inconsistent or does not fit the model.
    "IncompatibleIPUConfigError": "optimum_ipu.configuration:IPUConfigError",
}
_TRAINER = {
    "IPUTrainer": "optimum_ipu.trainer:IPUTrainer",
    "IPUTrainerState": "transformers:TrainerState",  # the original's was TrainerState unchanged
    "IPUTrainingArguments": "optimum_ipu.training_args:IPUTrainingArguments",
}
_PIPELINES = {
    "pipeline": "optimum_ipu.compat.pipelines:pipeline",
    "SUPPORTED_TASKS": "optimum_ipu.compat.pipelines:SUPPORTED_TASKS",
    "list_tasks": "optimum_ipu.compat.pipelines:list_tasks",
    "get_poplar_executor": "optimum_ipu.compat.poptorch_helpers:get_poplar_executor",
    "TASK_ALIASES": "optimum_ipu.compat.pipelines:TASK_ALIASES",
    **{
        name: f"optimum_ipu.compat.pipelines:{name}"
        for name in (
            "IPUFillMaskPipeline",
            "IPUTokenClassificationPipeline",
            "IPUZeroShotClassificationPipeline",
            "IPUSummarizationPipeline",
            "IPUText2TextGenerationPipeline",
            "IPUTranslationPipeline",
        )  # fmt: skip
    },
    "IPUAutomaticSpeechRecognitionPipeline": "optimum_ipu.compat.pipelines:IPUAutomaticSpeechRecognitionPipeline",
}
_DATA = {
    "pad_on_batch_axis": "optimum_ipu.compat.data:pad_on_batch_axis",
    "DataCollatorForLanguageModelingWithMaxTokensMasked": (
        "optimum_ipu.compat.data:DataCollatorForLanguageModelingWithMaxTokensMasked"
    ),
}
_SEQ2SEQ_TRAINER = {
    "IPUSeq2SeqTrainer": "optimum_ipu.trainer_seq2seq:IPUSeq2SeqTrainer",
    "IPUSeq2SeqTrainingArguments": "optimum_ipu.trainer_seq2seq:IPUSeq2SeqTrainingArguments",
}
_VERSION = {"__version__": "optimum_ipu.compat.versions:OPTIMUM_GRAPHCORE_API_VERSION"}

G = "optimum.graphcore"
# The original's torch versions of Whisper's feature extractor and processor computed the log-Mel features
# with torch instead of NumPy; transformers' own compute them with torch when it is installed.
_WHISPER = {
    "WhisperProcessorTorch": "transformers:WhisperProcessor",
    "WhisperFeatureExtractorTorch": "transformers:WhisperFeatureExtractor",
}
_BERT = {"BertPipelineMixin": "optimum_ipu.compat.poptorch_helpers:BertPipelineMixin"}

TABLES: dict[str, dict[str, str | Missing]] = {
    G: {
        **_CONFIG,
        **_TRAINER,
        **_VERSION,
        **_SEQ2SEQ_TRAINER,
        "pipeline": _PIPELINES["pipeline"],
        "IPUFillMaskPipeline": _PIPELINES["IPUFillMaskPipeline"],
        "IPUTokenClassificationPipeline": _PIPELINES["IPUTokenClassificationPipeline"],
        **{name: f"optimum_ipu.compat.modeling:{name}" for name in PIPELINED_SUPPORTED},
        **{name: _pipelined_missing(name.removeprefix("Pipelined")) for name in PIPELINED_UNSUPPORTED},
    },
    f"{G}.ipu_configuration": _CONFIG,
    f"{G}.modeling_utils": {
        **_CONFIG,
        "to_pipelined": "optimum_ipu.compat.modeling:to_pipelined",
        "get_layer_ipu": "optimum_ipu.compat.modeling:get_layer_ipu",
        "SerializedEmbedding": "optimum_ipu.pipelining.serialized:SerializedEmbedding",
        "SerializedLinear": Missing(
            "its constructor built a new layer from sizes; optimum-ipu serializes an existing one",
            "`optimum_ipu.pipelining.SerializedLinear(linear, factor)`, or `projection_serialization_factor` "
            "in the IPU config",
        ),
        "shift_tokens_right": "transformers.models.bart.modeling_bart:shift_tokens_right",
        "PipelineMixin": "optimum_ipu.compat.poptorch_helpers:PipelineMixin",
        "register": "optimum_ipu.compat.poptorch_helpers:register",
        "recomputation_checkpoint": "optimum_ipu.compat.poptorch_helpers:recomputation_checkpoint",
        "outline_attribute": Missing("it annotated the PopTorch graph for outlining", "remove the call"),
        "split_encoder_decoder_ipu_config": "optimum_ipu.pipelining.encoder_decoder:split_encoder_decoder_ipu_config",
        "SplitProjection": _POPTORCH_LAYER,
        "SharedEmbedding": _POPTORCH_LAYER,
        "OnehotGather": _POPTORCH_LAYER,
    },
    f"{G}.trainer": _TRAINER,
    f"{G}.training_args": {"IPUTrainingArguments": _TRAINER["IPUTrainingArguments"]},
    f"{G}.trainer_seq2seq": _SEQ2SEQ_TRAINER,
    f"{G}.training_args_seq2seq": {
        "IPUSeq2SeqTrainingArguments": _SEQ2SEQ_TRAINER["IPUSeq2SeqTrainingArguments"]
    },
    f"{G}.trainer_utils": {
        "to_poptorch_dataloader": "optimum_ipu.compat.poptorch_helpers:to_poptorch_dataloader",
    },
    f"{G}.pipelines": _PIPELINES,
    f"{G}.data": _DATA,
    f"{G}.data.data_collator": _DATA,
    f"{G}.utils": {
        "check_min_version": "optimum_ipu.compat.versions:check_min_version",
        # 0.7.1's examples/language-modeling/run_pretraining.py imports this name, which 0.7.1 itself lacked
        # (it stopped on its own import there); the check it means is check_min_version.
        "gc_check_min_version": "optimum_ipu.compat.versions:check_min_version",
        **_VERSION,
    },
    f"{G}.version": _VERSION,
    f"{G}.generation": {
        name: _GENERATION
        for name in (
            "IPUGenerationMixin",
            "IPUAttentionMixin",
            "MODELS_SUPPORTING_KV_CACHE",
            "supports_kv_cache",
            "assert_poptorch_supports_cond",
        )
    },  # fmt: skip
    f"{G}.diffusers": _DIFFUSERS,
    f"{G}.models": {},
    f"{G}.models.whisper": _WHISPER,
    f"{G}.models.bert": _BERT,
    f"{G}.models.bert.modeling_bert": _BERT,
    f"{G}.models.wav2vec2": {},
    f"{G}.models.wav2vec2.modeling_wav2vec2": {
        "_sample_negative_indices": Missing(
            "the original's speech pre-training model took negatives without per-utterance offsets, with "
            "`reduce_selector` and `mask_reduced` inputs that transformers' Wav2Vec2ForPreTraining does not take",
            "`transformers.models.wav2vec2.modeling_wav2vec2._sample_negative_indices` with transformers' "
            "Wav2Vec2ForPreTraining (its negatives carry the offsets that model expects)",
        ),
    },
    f"{G}.quantization": {
        name: _CUSTOM_OPS
        for name in ("GroupQuantLinear", "group_quantize_compress", "group_quantize_decompress")
    },
}
