"""`optimum.graphcore.pipeline`: transformers pipelines whose forward runs on the simulated IPU.

What the original did, here: the model is laid out on the IPUs of the config's inference layout
(`to_pipelined(model, ipu_config)` with the config in `eval()` mode, then `parallelize()`), cast to
fp16 unless `fp16=False`, and each forward is one host call of an `InferenceExecutable` (sharded
inference: one batch through the stages, no gradients). The first call "compiles": PopTorch's
checks, the per-IPU memory check and the throughput estimate, as `IPUTrainer.evaluate` does.
Pre- and post-processing are the pipeline's own, so the answers are those of the plain model up to
fp16 rounding.

The tasks are Optimum Graphcore's for the architectures optimum-ipu places: "image-classification"
(transformers' `ImageClassificationPipeline` with the IPU underneath), "question-answering"
(transformers v5 removed its extractive pipeline, so `IPUQuestionAnsweringPipeline` provides one, see
`question_answering.py`), and "text-classification" ("sentiment-analysis"), "token-classification"
("ner"), "fill-mask", "zero-shot-classification" and "text-generation" (transformers' pipelines with
the model call on the IPU, see `text_pipelines.py`), and "summarization", "translation" and
"text2text-generation" (which transformers v5 removed; see `seq2seq_pipelines.py`), and
"audio-classification" and "automatic-speech-recognition" (CTC models and Whisper; see
`audio_pipelines.py`). As in the original, the text tasks pad every
input to the task's default length (128 tokens) unless `padding=` / `max_length=` say otherwise,
and text generation stops at 50 tokens unless `max_length=` / `max_new_tokens=` say otherwise.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from transformers import (
    AutoFeatureExtractor,
    AutoImageProcessor,
    AutoModelForAudioClassification,
    AutoModelForCausalLM,
    AutoModelForCTC,
    AutoModelForImageClassification,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForSpeechSeq2Seq,
    AutoModelForTokenClassification,
    AutoTokenizer,
    ImageClassificationPipeline,
    Pipeline,
)
from transformers.utils import ModelOutput

from optimum_ipu.call_layout import CallLayout
from optimum_ipu.compat.audio_pipelines import (
    IPUAudioClassificationPipeline,
    IPUAutomaticSpeechRecognitionPipeline,
)
from optimum_ipu.compat.pipeline_tasks import infer_task
from optimum_ipu.compat.question_answering import IPUQuestionAnsweringPipeline, RunsOnIPU
from optimum_ipu.compat.seq2seq_pipelines import (
    IPUSummarizationPipeline,
    IPUText2TextGenerationPipeline,
    IPUTranslationPipeline,
)
from optimum_ipu.compat.text_pipelines import (
    IPUFillMaskPipeline,
    IPUTextClassificationPipeline,
    IPUTextGenerationPipeline,
    IPUTokenClassificationPipeline,
    IPUZeroShotClassificationPipeline,
    tokenizer_defaults,
)
from optimum_ipu.compiling import compile_inference
from optimum_ipu.configuration import IPUConfig, IPUConfigError
from optimum_ipu.pipelining import to_pipelined
from optimum_ipu.pipelining.placement import PlacementError
from optimum_ipu.poptorch import Error
from optimum_ipu.runtime.batches import batch_size_of
from optimum_ipu.runtime.executor import InferenceExecutable
from optimum_ipu.runtime.fp16_compute import fp16_compute_context, held_fp32_copies, resolve_fp16_compute

__all__ = [
    "SUPPORTED_TASKS",
    "TASK_ALIASES",
    "IPUFillMaskPipeline",
    "IPUImageClassificationPipeline",
    "IPUInference",
    "IPUSummarizationPipeline",
    "IPUText2TextGenerationPipeline",
    "IPUTranslationPipeline",
    "IPUAudioClassificationPipeline",
    "IPUAutomaticSpeechRecognitionPipeline",
    "IPUTextClassificationPipeline",
    "IPUTextGenerationPipeline",
    "IPUTokenClassificationPipeline",
    "IPUZeroShotClassificationPipeline",
    "list_tasks",
    "pipeline",
]

logger = logging.getLogger(__name__)


def _to_host_float32(value: Any) -> Any:
    """Model outputs as the pipelines' post-processing expects them: fp32 tensors on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", torch.float32 if value.is_floating_point() else value.dtype)
    if isinstance(value, ModelOutput):
        return type(value)(**{k: _to_host_float32(v) for k, v in value.items()})
    if isinstance(value, (tuple, list)):
        return type(value)(_to_host_float32(v) for v in value)
    return value


class IPUInference:
    """The IPU side of a pipeline: a placed model, run by an inference executable, compiled on first use.

    Args:
        pipelined: the `PipelinedModel`, parallelized with its config in inference mode.
        ipu_config: that config.
        fp32: whether the model runs in fp32 (the compile report prices fp16 otherwise).
    """

    def __init__(self, pipelined, ipu_config: IPUConfig, fp32: bool):
        self.pipelined = pipelined
        self.ipu_config = ipu_config
        self.fp32 = fp32
        self.fp16_compute = resolve_fp16_compute(None, self.input_device)
        self.compiled = None
        self.attached = False

    @property
    def input_device(self) -> torch.device:
        """Where the inputs go: the device of the first IPU's blocks (hooks move them on from there)."""
        return next(self.pipelined.module.parameters()).device

    def compile(self, sample: Mapping[str, Any]) -> None:
        """On first use: PopTorch's checks, the per-IPU memory check and the estimate, for `sample`'s shape."""
        if self.compiled is None:
            self.compiled = compile_inference(
                self.pipelined, self.ipu_config, sample_batch=sample, micro_batch_size=batch_size_of(sample),
                fp32=self.fp32, fp16_compute=None if self.fp32 else self.fp16_compute,
            )  # fmt: skip
        self.attached = True  # as PopTorch's executor, a call attaches a detached model again

    # PopTorch's device calls, which Optimum Graphcore's notebooks make on `pipeline(...).model` (there a
    # poptorch.inferenceModel) to free IPUs between cells.
    def isCompiled(self) -> bool:
        return self.compiled is not None

    def isAttachedToDevice(self) -> bool:
        return self.attached

    def detachFromDevice(self) -> None:
        """Release the pipeline's IPUs; its next call attaches them again (PopTorch's errors otherwise)."""
        if self.compiled is None:
            raise Error("Model has not been compiled or has been destroyed.")
        if not self.attached:
            raise Error("Device is not attached")
        self.attached = False

    def attachToDevice(self) -> None:
        if self.compiled is None:
            raise Error("Model has not been compiled or has been destroyed.")
        if self.attached:
            raise Error("Device is already attached")
        self.attached = True

    def destroy(self) -> None:
        """Free the compiled program and the IPUs; the next call compiles again."""
        self.compiled, self.attached = None, False

    def __call__(self, inputs: dict[str, Any]) -> ModelOutput:
        """One host call: the batch through the stages; fp32 outputs on the CPU."""
        # One call is one micro-batch: the pipeline's config has one device iteration and one replica.
        size = batch_size_of(inputs)
        self._lay_out()
        self.compile(inputs)
        executable = InferenceExecutable(
            self.pipelined.module, CallLayout(), micro_batch_size=size, fp16_compute=self.fp16_compute
        )
        return _to_host_float32(executable(inputs))

    def holding(self):
        """A block of host calls on unchanged weights (the inputs of one pipeline call): with emulated fp16
        their fp32 copies are made once for the block (`held_fp32_copies`), on the layout the calls use."""
        self._lay_out()
        return held_fp32_copies(None if self.fp32 else self.fp16_compute, self.pipelined.module.parameters())

    def _lay_out(self) -> None:
        """The model in eval mode with this pipeline's layout, taken back if an IPUTrainer trained the
        model since (its layout and train mode replaced the pipeline's)."""
        if not self.pipelined.is_parallelized:
            self.pipelined.parallelize()
        self.pipelined.module.eval()

    @contextlib.contextmanager
    def generating(self, prompt: Mapping[str, Any]) -> Iterator[None]:
        """Around transformers' `generate` on the placed model: compiled for the prompt, no gradients,
        every step's forward with the IPU's fp16 arithmetic (fp32 partials)."""
        self._lay_out()
        self.compile(_forward_sample(self.pipelined.module, prompt))
        with torch.no_grad(), fp16_compute_context(self.fp16_compute, self.pipelined.module.parameters()):
            yield


def _forward_sample(model, prompt: Mapping[str, Any]) -> dict[str, Any]:
    """What the compile step traces for a generation: the prompt's model inputs, and for an
    encoder-decoder model one decoder step (the decoder start token), as each step of the loop runs."""
    sample = {k: v for k, v in prompt.items() if k in ("input_ids", "attention_mask", "input_features")}
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        first = next(iter(sample.values()))
        start = getattr(config, "decoder_start_token_id", None)
        start = 0 if start is None else start
        sample["decoder_input_ids"] = torch.full(
            (first.shape[0], 1), start, dtype=torch.long, device=first.device
        )
    return sample


class IPUImageClassificationPipeline(RunsOnIPU, ImageClassificationPipeline):
    """transformers' image-classification pipeline, each forward one host call on the simulated IPU."""

    def _forward(self, model_inputs):
        return self.ipu(dict(model_inputs))


SUPPORTED_TASKS: dict[str, dict[str, Any]] = {
    "image-classification": {
        "impl": IPUImageClassificationPipeline,
        "class": (AutoModelForImageClassification,),
        # Used when no model / IPU config is given, as in Optimum Graphcore (the model needs the Hub).
        "default": {"model": "google/vit-base-patch16-224", "ipu_config": "Graphcore/vit-base-ipu"},
        "type": "image",
    },
    # Optimum Graphcore's defaults; Whisper is placed for generation (encoder and decoder on their IPUs).
    "audio-classification": {
        "impl": IPUAudioClassificationPipeline,
        "class": (AutoModelForAudioClassification,),
        "default": {"model": "superb/hubert-base-superb-ks", "ipu_config": "Graphcore/hubert-base-ipu"},
        "type": "audio",
    },
    "automatic-speech-recognition": {
        "impl": IPUAutomaticSpeechRecognitionPipeline,
        "class": (AutoModelForCTC, AutoModelForSpeechSeq2Seq),
        "default": {"model": "facebook/wav2vec2-base-960h", "ipu_config": "Graphcore/wav2vec2-ctc-base-ipu"},
        "type": "multimodal",
    },
    "question-answering": {
        "impl": IPUQuestionAnsweringPipeline,
        "class": (AutoModelForQuestionAnswering,),
        "default": {
            "model": "distilbert-base-cased-distilled-squad",
            "ipu_config": "Graphcore/distilbert-base-ipu",
        },
        "type": "text",
    },
    "text-classification": {
        "impl": IPUTextClassificationPipeline,
        "class": (AutoModelForSequenceClassification,),
        "default": {
            "model": "distilbert-base-uncased-finetuned-sst-2-english",
            "ipu_config": "Graphcore/distilbert-base-ipu",
            "max_length": 128,
        },
        "type": "text",
    },
    "token-classification": {
        "impl": IPUTokenClassificationPipeline,
        "class": (AutoModelForTokenClassification,),
        "default": {
            "model": "dbmdz/bert-large-cased-finetuned-conll03-english",
            "ipu_config": "Graphcore/bert-large-ipu",
            "max_length": 128,
        },
        "type": "text",
    },
    "fill-mask": {
        "impl": IPUFillMaskPipeline,
        "class": (AutoModelForMaskedLM,),
        "default": {
            "model": "distilroberta-base",
            "ipu_config": "Graphcore/distilroberta-base-ipu",
            "max_length": 128,
        },
        "type": "text",
    },
    "zero-shot-classification": {
        "impl": IPUZeroShotClassificationPipeline,
        "class": (AutoModelForSequenceClassification,),
        "default": {
            "model": "roberta-large-mnli",
            "ipu_config": "Graphcore/roberta-large-ipu",
            "max_length": 128,
        },
        "type": "text",
    },
    "text-generation": {
        "impl": IPUTextGenerationPipeline,
        "class": (AutoModelForCausalLM,),
        # The original's default config for generation: IPUConfig() (one IPU).
        "default": {"model": "gpt2", "ipu_config": {}, "max_length": 50},
        "type": "text",
    },
    # Optimum Graphcore's defaults: inputs padded (and cut) to max_input_length tokens, up to max_length
    # generated, on 2 IPUs (the encoder's and the decoder's).
    "summarization": {
        "impl": IPUSummarizationPipeline,
        "class": (AutoModelForSeq2SeqLM,),
        "default": {
            "model": "ainize/bart-base-cnn",
            "ipu_config": {"ipus_per_replica": 2},
            "max_length": 20,
            "max_input_length": 50,
            "truncation": "only_first",
        },  # fmt: skip
        "type": "text",
    },
    "translation": {
        "impl": IPUTranslationPipeline,
        "class": (AutoModelForSeq2SeqLM,),
        "default": {
            "model": "t5-small",
            "ipu_config": {"ipus_per_replica": 2},
            "max_length": 50,
            "max_input_length": 45,
            "truncation": "only_first",
        },  # fmt: skip
        "type": "text",
    },
    "text2text-generation": {
        "impl": IPUText2TextGenerationPipeline,
        "class": (AutoModelForSeq2SeqLM,),
        "default": {
            "model": "t5-small",
            "ipu_config": {"ipus_per_replica": 2},
            "max_length": 50,
            "max_input_length": 50,
            "truncation": "only_first",
        },  # fmt: skip
        "type": "text",
    },
}
TASK_ALIASES = {"sentiment-analysis": "text-classification", "ner": "token-classification"}
SEQ2SEQ_TASKS = frozenset({"summarization", "translation", "text2text-generation"})
GENERATION_TASKS = frozenset({"text-generation"}) | SEQ2SEQ_TASKS


def list_tasks() -> list[str]:
    """The tasks `pipeline` runs on the simulated IPU, and their aliases."""
    return sorted({*SUPPORTED_TASKS, *TASK_ALIASES})


def _inference_config(ipu_config: IPUConfig | str | dict | None, task: str) -> IPUConfig:
    """The pipeline's own copy of the config, in inference mode, one batch per host call."""
    if ipu_config is None:
        ipu_config = SUPPORTED_TASKS[task]["default"]["ipu_config"]
    if isinstance(ipu_config, str):
        config = IPUConfig.from_pretrained(ipu_config)
    elif isinstance(ipu_config, dict):
        config = IPUConfig.from_dict(ipu_config)
    elif isinstance(ipu_config, IPUConfig):
        config = ipu_config.copy()  # the original changed the caller's config; a copy leaves it alone
    else:
        raise TypeError(
            f"ipu_config must be an IPUConfig, a name or path (e.g. 'Graphcore/vit-base-ipu') or a dict, "
            f"got {type(ipu_config).__name__}."
        )
    # A pipeline call is one batch: no device-iteration loop, no inference replicas (as in the original).
    return config.update(inference_device_iterations=1, inference_replication_factor=1).eval()


def pipeline(
    task: str | None = None,
    model: str | torch.nn.Module | None = None,
    ipu_config: IPUConfig | str | dict | None = None,
    tokenizer=None,
    feature_extractor=None,
    revision: str | None = None,
    use_auth_token: str | bool | None = None,
    pipeline_class: type | None = None,
    fp16: bool = True,
    parallelize_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Pipeline:
    """Build a pipeline for `task` whose model runs on the simulated IPU (Optimum Graphcore's signature).

    Args:
        task: one of `list_tasks()`: "question-answering", "image-classification", "text-classification"
            (alias "sentiment-analysis"), "token-classification" ("ner"), "fill-mask",
            "zero-shot-classification", "text-generation", "summarization", "translation" (or
            "translation_xx_to_yy"), "text2text-generation", "audio-classification",
            "automatic-speech-recognition" (CTC models and Whisper). None: the Hub's task for the model, as
            in the original; offline, for a local directory or a model object, the task its architecture
            names (e.g. a ...ForSequenceClassification model: "text-classification"; see `pipeline_tasks`).
        model: a model name or path, or a loaded transformers model (then pass its `tokenizer` or
            `feature_extractor` too). None loads the original's default model from the Hub.
        ipu_config: an `IPUConfig`, a config name or path, or a dict; None takes the original's default
            for the task (e.g. `Graphcore/distilbert-base-ipu`; `IPUConfig()` for text generation). Its inference
            layout places the model; the pipeline works on a copy.
        tokenizer: the tokenizer (text tasks, speech recognition), or a name or path.
        feature_extractor: the image processor (image classification) or feature extractor (audio
            tasks), or a name or path; `image_processor=` is accepted too.
        revision, use_auth_token: for loading from the Hub.
        pipeline_class: a subclass of the task's IPU pipeline class, to customise it.
        fp16: run the model in fp16 (the IPU default); False keeps fp32.
        parallelize_kwargs: options of the original's hand-written models; they have no effect here.
        **kwargs: passed to the pipeline class (e.g. `top_k`, `device`). For the text tasks but question
            answering and generation, `padding` defaults to "max_length" and `max_length` to 128, as in
            Optimum Graphcore; for text generation `max_length` defaults to 50 (unless `max_new_tokens`).

    Raises:
        ValueError: for a task with no IPU pipeline here (the message lists those that have one), or
            no task given and none found for the model.
        IPUConfigError: when the IPU config's layout does not fit the model.
    """
    if task is None:
        if model is None:
            raise ValueError(
                f"Pass a task, a model, or both: pipeline(task, model=...), task one of {list_tasks()}."
            )
        # As the original: the Hub's pipeline tag; offline or for a local model, the model's architecture.
        model_classes = {name: spec["class"] for name, spec in SUPPORTED_TASKS.items()}
        task = infer_task(model, model_classes, revision=revision, token=use_auth_token)
    targeted = TASK_ALIASES.get(task, task)
    if task.startswith("translation_"):  # translation_en_to_fr: the languages pick the model's prefix
        targeted = "translation"
    if targeted not in SUPPORTED_TASKS:
        raise ValueError(
            f"Task {task!r} has no pipeline on the simulated IPU; supported tasks: {', '.join(list_tasks())}. "
            f"For {task!r}, use transformers' `pipeline({task!r}, model=...)` on CPU/GPU."
        )
    spec = SUPPORTED_TASKS[targeted]
    impl = spec["impl"]
    if pipeline_class is not None and not (
        isinstance(pipeline_class, type) and issubclass(pipeline_class, impl)
    ):
        raise TypeError(f"pipeline_class must subclass {impl.__name__} so that its forward runs on the IPU.")
    if parallelize_kwargs:
        logger.warning(
            "parallelize_kwargs %s have no effect on the simulated IPU.", sorted(parallelize_kwargs)
        )

    load = {"revision": revision, "token": use_auth_token}
    model_id = spec["default"]["model"] if model is None else model
    if isinstance(model_id, str):
        model = _load_model(spec["class"], model_id, load)
    processor = feature_extractor if feature_extractor is not None else kwargs.pop("image_processor", None)
    if spec["type"] in ("audio", "multimodal"):
        processors = _audio_processors(spec["type"], model_id, tokenizer, processor, load)
    elif spec["type"] == "text":
        if tokenizer is None and not isinstance(model_id, str):
            raise ValueError(
                "A model passed as an object needs its tokenizer: pipeline(..., tokenizer=tokenizer)."
            )
        tokenizer = (
            AutoTokenizer.from_pretrained(tokenizer or model_id, **load)
            if not _loaded(tokenizer)
            else tokenizer
        )
        processors = {"tokenizer": tokenizer}
    else:
        if processor is None and not isinstance(model_id, str):
            raise ValueError(
                "A model passed as an object needs its image processor: pipeline(..., feature_extractor=processor)."
            )
        processor = (
            AutoImageProcessor.from_pretrained(processor or model_id, **load)
            if not _loaded(processor)
            else processor
        )
        processors = {"image_processor": processor}

    config = _inference_config(ipu_config, targeted)
    kwargs = _task_defaults(targeted, kwargs)
    if model.config.model_type == "gpt2" and spec["type"] == "text" and tokenizer.pad_token is None:
        # As in the original: GPT-2 has no pad token; padding (and batching) uses end-of-text.
        tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = model.config.eos_token_id
    model.eval()
    if fp16:
        model.half()  # computed with fp32 partials on a CPU, as the IPU does (see runtime.fp16_compute)
    try:
        pipelined = to_pipelined(model, config)
        built = (pipeline_class or impl)(model=model, task=task, **processors, **kwargs)
        pipelined.parallelize()
    except PlacementError as error:
        raise IPUConfigError(
            f"The IPU config does not fit {type(model).__name__}: {error} Pass an ipu_config whose "
            "inference_layers_per_ipu fits the model, e.g. IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2)."
        ) from error
    ipu = IPUInference(pipelined, config, fp32=not fp16)
    built.attach_ipu(ipu)
    for name in DEVICE_CALLS:  # `pipeline(...).model` was a poptorch.inferenceModel in the original
        setattr(model, name, getattr(ipu, name))
    return built


DEVICE_CALLS = ("isCompiled", "isAttachedToDevice", "detachFromDevice", "attachToDevice", "destroy")


def _task_defaults(task: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Optimum Graphcore's defaults: text inputs padded to the task's length, generation's max_length."""
    length = SUPPORTED_TASKS[task]["default"].get("max_length")
    if length is None:
        return kwargs
    if task in GENERATION_TASKS:
        if "max_new_tokens" not in kwargs:
            kwargs.setdefault("max_length", length)
        if task in SEQ2SEQ_TASKS:
            for name in ("max_input_length", "truncation"):
                kwargs.setdefault(name, SUPPORTED_TASKS[task]["default"][name])
        return kwargs
    if "max_length" not in kwargs and "padding" not in kwargs:
        logger.warning(
            "No padding arguments given: inputs are padded to %d tokens and longer ones truncated, as in "
            "Optimum Graphcore. Pass padding= and max_length= to the pipeline to change that.", length,
        )  # fmt: skip
    defaults = tokenizer_defaults(task, kwargs.get("max_length") or length)
    return {**defaults, **kwargs}


def _load_model(classes: tuple, model_id: str, load: dict[str, Any]):
    """The model from the first of the task's classes that knows its architecture (CTC, then seq2seq)."""
    for cls in classes[:-1]:
        try:
            return cls.from_pretrained(model_id, **load)
        except ValueError:  # "Unrecognized configuration class ... for this kind of AutoModel"
            continue
    return classes[-1].from_pretrained(model_id, **load)


def _audio_processors(
    kind: str, model_id, tokenizer, feature_extractor, load: dict[str, Any]
) -> dict[str, Any]:
    """The feature extractor (and for speech recognition the tokenizer) of an audio pipeline."""
    if not isinstance(model_id, str) and (
        feature_extractor is None or (kind == "multimodal" and tokenizer is None)
    ):
        needed = "feature_extractor=" + (" and tokenizer=" if kind == "multimodal" else "")
        raise ValueError(f"A model passed as an object needs its processors: pipeline(..., {needed}).")
    if not _loaded(feature_extractor):
        feature_extractor = AutoFeatureExtractor.from_pretrained(feature_extractor or model_id, **load)
    processors = {"feature_extractor": feature_extractor}
    if kind == "multimodal":
        if not _loaded(tokenizer):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer or model_id, **load)
        processors["tokenizer"] = tokenizer
    return processors


def _loaded(obj) -> bool:
    return obj is not None and not isinstance(obj, str)
