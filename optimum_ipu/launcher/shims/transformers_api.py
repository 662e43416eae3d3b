"""Shims for transformers APIs that v5 removed and Optimum Graphcore 0.7 scripts still call.

- `transformers.utils.send_example_telemetry(...)`: gone in v5; every example script calls it once.
- `transformers.utils.is_offline_mode()`: gone in v5 (huggingface_hub has it); run_summarization.py imports it.
- `use_auth_token=` on `from_pretrained`: gone in v5 (models then fail with "unexpected keyword",
  tokenizers store it in their saved config); the scripts pass it on every load.
- `AutoFeatureExtractor` for an image model: v5 maps ViT & co. to image processors only.
- `config.tokenizer_class`: v5 no longer sets it on every config (the CTC example reads it).
- `tokenizer.encode_plus` / `batch_encode_plus`: gone in v5 (mt5_xnli.ipynb).
- `truncation_strategy=` / `pad_to_max_length=` on a tokenizer call: v5 raises TypeError on the first and
  silently ignores the second (the DeBERTa notebook passes `truncation_strategy="only_first"`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect

from optimum_ipu.launcher._report import LauncherError, note_once
from optimum_ipu.launcher.shims._base import Shim, Skip
from optimum_ipu.launcher.shims._patch import Patches, wrap_classmethod

__all__ = [
    "AUTO_FEATURE_EXTRACTOR",
    "CONFIG_DEFAULTS",
    "IS_OFFLINE_MODE",
    "REMOVED_CONFIG_DEFAULTS",
    "SEND_EXAMPLE_TELEMETRY",
    "TOKENIZER_OLD_KEYWORDS",
    "USE_AUTH_TOKEN",
    "adapt_use_auth_token",
]


def _send_example_telemetry(*args, **kwargs) -> None:
    note_once(
        "send_example_telemetry",
        "send_example_telemetry() was removed in transformers v5: skipped (nothing is sent).",
    )


def _install_telemetry(patches: Patches) -> Skip | None:
    utils = importlib.import_module("transformers.utils")
    if hasattr(utils, "send_example_telemetry"):
        return Skip("transformers still has send_example_telemetry")
    patches.set(utils, "send_example_telemetry", _send_example_telemetry)
    return None


SEND_EXAMPLE_TELEMETRY = Shim(
    name="send_example_telemetry",
    replaces="`from transformers.utils import send_example_telemetry` (removed in transformers v5)",
    by="a function that does nothing (no telemetry is sent); noted once when the script calls it",
    install=_install_telemetry,
)


def _install_is_offline_mode(patches: Patches) -> Skip | None:
    utils = importlib.import_module("transformers.utils")
    if hasattr(utils, "is_offline_mode"):
        return Skip("transformers still has is_offline_mode")
    hub = importlib.import_module("huggingface_hub")
    if not hasattr(hub, "is_offline_mode"):
        return Skip(
            "huggingface_hub has no is_offline_mode to stand in for transformers' (removed in v5); if the script "
            "stops on that import, read the HF_HUB_OFFLINE environment variable instead",
            problem=True,
        )

    def is_offline_mode() -> bool:
        note_once("is_offline_mode", "transformers.utils.is_offline_mode() was removed in transformers v5: answered "
                  "by huggingface_hub.is_offline_mode() (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE).")  # fmt: skip
        return hub.is_offline_mode()

    patches.set(utils, "is_offline_mode", is_offline_mode)
    return None


IS_OFFLINE_MODE = Shim(
    name="is_offline_mode",
    replaces="`from transformers.utils import is_offline_mode` (removed in transformers v5)",
    by="huggingface_hub's `is_offline_mode()`, the function transformers 4's answered with: True when HF_HUB_OFFLINE "
    "(or TRANSFORMERS_OFFLINE) is set",
    install=_install_is_offline_mode,
)


def adapt_use_auth_token(kwargs: dict, where: str) -> None:
    """Rewrite a removed `use_auth_token=` keyword in `kwargs` as today's `token=` (None: dropped)."""
    if "use_auth_token" not in kwargs:
        return
    value = kwargs.pop("use_auth_token")
    if value is not None and kwargs.get("token") is None:
        kwargs["token"] = value
    note_once(
        "use_auth_token",
        f"use_auth_token= was removed in transformers v5 and datasets 3: passed on as token= "
        f"(first seen in {where}; use_auth_token=None is dropped).",
    )


# Where `from_pretrained` is defined: the Auto* front doors and the base classes every model,
# config, tokenizer and processor inherits from (subclasses that override it call these).
_FROM_PRETRAINED_OWNERS = (
    "transformers:AutoConfig",
    "transformers:AutoTokenizer",
    "transformers:AutoImageProcessor",
    "transformers:AutoFeatureExtractor",
    "transformers:AutoProcessor",
    "transformers.models.auto.auto_factory:_BaseAutoModelClass",
    "transformers.modeling_utils:PreTrainedModel",
    "transformers.configuration_utils:PretrainedConfig",
    "transformers.tokenization_utils_base:PreTrainedTokenizerBase",
    "transformers.image_processing_base:ImageProcessingMixin",
    "transformers.feature_extraction_utils:FeatureExtractionMixin",
    "transformers.processing_utils:ProcessorMixin",
)


def _owner(target: str):
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr, None)
    except ImportError:
        return None


def _install_use_auth_token(patches: Patches) -> Skip | None:
    wrapped = []
    for target in _FROM_PRETRAINED_OWNERS:
        owner = _owner(target)
        if owner is not None and owner not in wrapped:
            where = f"{owner.__name__}.from_pretrained"
            if wrap_classmethod(
                patches, owner, "from_pretrained", lambda kw, where=where: adapt_use_auth_token(kw, where)
            ):
                wrapped.append(owner)
    if not wrapped:
        return Skip(
            "none of transformers' from_pretrained entry points was found where transformers 5 defines them "
            "(AutoConfig, PreTrainedModel, ...); if the script stops on use_auth_token=, remove that argument",
            problem=True,
        )
    return None


USE_AUTH_TOKEN = Shim(
    name="use_auth_token",
    replaces="`use_auth_token=` on `from_pretrained` and `load_dataset` (removed in transformers v5 and datasets 3)",
    by="`token=` with the same value (`use_auth_token=None`, what the scripts pass by default, is dropped)",
    install=_install_use_auth_token,
)


def _install_auto_feature_extractor(patches: Patches) -> Skip | None:
    transformers = importlib.import_module("transformers")
    auto_feature_extractor = getattr(transformers, "AutoFeatureExtractor", None)
    auto_image_processor = getattr(transformers, "AutoImageProcessor", None)
    if auto_feature_extractor is None or auto_image_processor is None:
        return Skip(
            "transformers has no AutoFeatureExtractor or AutoImageProcessor to bridge; load the image processor "
            "with the class your transformers version provides",
            problem=True,
        )
    mapping = importlib.import_module("transformers.models.auto.feature_extraction_auto")
    if "vit" in getattr(mapping, "FEATURE_EXTRACTOR_MAPPING_NAMES", {}):
        return Skip("transformers still maps image models to feature extractors")
    original = auto_feature_extractor.__dict__["from_pretrained"].__func__

    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        try:
            return original(cls, pretrained_model_name_or_path, *args, **kwargs)
        except ValueError as error:
            try:
                processor = auto_image_processor.from_pretrained(
                    pretrained_model_name_or_path, *args, **kwargs
                )
            except Exception:
                raise error from None
        note_once(
            "AutoFeatureExtractor",
            f"AutoFeatureExtractor has no feature extractor for {pretrained_model_name_or_path!r} in transformers v5 "
            f"(image models have image processors): loaded {type(processor).__name__} with AutoImageProcessor instead.",
        )
        return processor

    patches.set(auto_feature_extractor, "from_pretrained", classmethod(from_pretrained))
    return None


AUTO_FEATURE_EXTRACTOR = Shim(
    name="AutoFeatureExtractor",
    replaces="`AutoFeatureExtractor.from_pretrained` for an image model such as ViT (transformers v5 has no feature "
    "extractor for it)",
    by="`AutoImageProcessor.from_pretrained` of the same checkpoint, when no feature extractor is found (same "
    "`size`, `image_mean`, `image_std`, and callable on images the same way)",
    install=_install_auto_feature_extractor,
)


class _RemovedConfigDefault:
    """A config attribute transformers 4 set on every config (to `default`) and v5 no longer sets.

    Reads give the value the config holds, or transformers 4's default (noted once); writes and
    `to_dict()` are as for any attribute (the value lives in the instance's `__dict__`).
    """

    def __init__(self, name: str, default) -> None:
        self.name, self.default = name, default

    def __get__(self, config, owner=None):
        if config is None:
            return self
        if self.name in config.__dict__:
            return config.__dict__[self.name]
        note_once(f"config.{self.name}", f"config.{self.name} is no longer set on every config in transformers v5: "
                  f"read as transformers 4's default, {self.default!r}.")  # fmt: skip
        return self.default

    def __set__(self, config, value) -> None:
        config.__dict__[self.name] = value

    def __delete__(self, config) -> None:
        config.__dict__.pop(self.name, None)


# What transformers 4's PretrainedConfig.__init__ set on every config, that Optimum Graphcore 0.7's examples read
# (run_speech_recognition_ctc.py: `config.tokenizer_class`).
REMOVED_CONFIG_DEFAULTS = {"tokenizer_class": None}


def _install_config_defaults(patches: Patches) -> Skip | None:
    config_class = _owner("transformers.configuration_utils:PretrainedConfig")
    if config_class is None:
        return Skip("transformers has no PretrainedConfig where transformers 5 defines it", problem=True)
    sample = config_class()
    missing = [name for name in REMOVED_CONFIG_DEFAULTS if not hasattr(sample, name)]
    if not missing:
        return Skip("transformers still sets these attributes on every config")
    for name in missing:
        patches.set(config_class, name, _RemovedConfigDefault(name, REMOVED_CONFIG_DEFAULTS[name]))
    return None


CONFIG_DEFAULTS = Shim(
    name="config.tokenizer_class",
    replaces="`config.tokenizer_class` on a model config that does not set it (transformers v5 no longer sets it on "
    "every config: AttributeError)",
    by="transformers 4's default, None, when the config does not hold a value; a config that sets it is unchanged",
    install=_install_config_defaults,
)


def _pairs(batch: list) -> tuple[list, list | None]:
    """`batch_encode_plus`'s input: texts, or (text, text_pair) tuples split into two lists."""
    if batch and all(isinstance(item, (tuple, list)) and len(item) == 2 for item in batch):
        return [a for a, _ in batch], [b for _, b in batch]
    return batch, None


def _encode_plus(self, text, text_pair=None, **kwargs):
    """transformers 4's `encode_plus`: one text (or pair), encoded as `tokenizer(text, text_pair)` does.

    One tuple or list of two texts without `text_pair` is a pair, as transformers 4's fast tokenizers read it
    (each input of their batch encoder is a text or a (text, text_pair)); transformers 5's call would read
    it as a batch of two texts. Words split beforehand (`is_split_into_words=True`) stay one input.
    """
    if (
        text_pair is None and isinstance(text, (tuple, list)) and len(text) == 2
        and all(isinstance(part, str) for part in text) and not kwargs.get("is_split_into_words")
    ):  # fmt: skip
        text, text_pair = text
    return self(text, text_pair, **kwargs)


def _batch_encode_plus(self, batch_text_or_text_pairs, **kwargs):
    """transformers 4's `batch_encode_plus`: a list of texts or of (text, text_pair) tuples."""
    texts, pairs = _pairs(list(batch_text_or_text_pairs))
    return self(texts, pairs, **kwargs)


def _install_tokenizer_methods(patches: Patches) -> Skip | None:
    base = _owner("transformers.tokenization_utils_base:PreTrainedTokenizerBase")
    if base is None:
        return Skip("transformers has no PreTrainedTokenizerBase where transformers 5 defines it", problem=True)
    missing = {name: f for name, f in (("encode_plus", _encode_plus), ("batch_encode_plus", _batch_encode_plus))
               if not hasattr(base, name)}  # fmt: skip
    if not missing:
        return Skip("transformers still has encode_plus and batch_encode_plus")
    for name, method in missing.items():
        patches.set(base, name, method)
    return None


TOKENIZER_METHODS = Shim(
    name="encode_plus",
    replaces="`tokenizer.encode_plus(...)` / `tokenizer.batch_encode_plus(...)` (removed in transformers v5: "
    "AttributeError)",
    by="the tokenizer's own call, `tokenizer(text, text_pair, **kwargs)`, with a batch of pairs split in two lists",
    install=_install_tokenizer_methods,
)


@contextlib.contextmanager
def _as_target_tokenizer(self):
    """transformers 4's `as_target_tokenizer()`: calls inside encode their texts as targets.

    4 switched the tokenizer to its target mode (Marian's target vocabulary, mBART's target-language tokens; no
    change for BERT, T5 or BART) and set the flag that keeps `__call__` from switching back. transformers 5 kept
    the flag and the switches, and encodes targets with `tokenizer(text_target=...)`: the same ids.
    """
    note_once("as_target_tokenizer", "tokenizer.as_target_tokenizer() was removed in transformers v5: the calls "
              "inside encode their texts as targets, as tokenizer(text_target=...) does.")  # fmt: skip
    if hasattr(self, "_switch_to_target_mode"):
        self._switch_to_target_mode()
    self._in_target_context_manager = True
    try:
        yield
    finally:
        self._in_target_context_manager = False
        if hasattr(self, "_switch_to_input_mode"):
            self._switch_to_input_mode()


def _install_as_target_tokenizer(patches: Patches) -> Skip | None:
    base = _owner("transformers.tokenization_utils_base:PreTrainedTokenizerBase")
    if base is None:
        return Skip("transformers has no PreTrainedTokenizerBase where transformers 5 defines it", problem=True)
    if hasattr(base, "as_target_tokenizer"):
        return Skip("transformers still has as_target_tokenizer")
    if "_in_target_context_manager" not in inspect.unwrap(base.__call__).__code__.co_names:
        return Skip("this transformers' tokenizer call no longer reads the target-context flag", problem=True)
    patches.set(base, "as_target_tokenizer", _as_target_tokenizer)
    return None


AS_TARGET_TOKENIZER = Shim(
    name="as_target_tokenizer",
    replaces="`with tokenizer.as_target_tokenizer(): labels = tokenizer(targets, ...)` (removed in transformers v5: "
    "AttributeError)",
    by="a context whose calls encode their texts as targets, the ids of `tokenizer(text_target=targets, ...)`",
    install=_install_as_target_tokenizer,
)


# transformers 4's target mode was an attribute of the processor (so it pickled with it); this is its depth.
_TARGET_DEPTH = "_optimum_ipu_target_depth"
_ROUTED = "_optimum_ipu_routes_targets"


def _route_to_tokenizer(processor_class: type, patches: Patches) -> None:
    """For the rest of the run, `processor_class`'s call and `pad` go to the processor's tokenizer whenever the
    processor is in target mode (once per class; the run's end puts the class back as it was)."""
    if processor_class.__dict__.get(_ROUTED):
        return
    for name in ("__call__", "pad"):
        original = getattr(processor_class, name, None)

        def routed(self, *args, __name=name, __original=original, **kwargs):
            if self.__dict__.get(_TARGET_DEPTH):
                return self.tokenizer(*args, **kwargs) if __name == "__call__" else self.tokenizer.pad(*args, **kwargs)
            if __original is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {__name!r}")
            return __original(self, *args, **kwargs)

        patches.set(processor_class, name, functools.wraps(original)(routed) if original else routed)
    patches.set(processor_class, _ROUTED, True)


def _target_mode(processor, patches: Patches):
    """transformers 4's `as_target_processor()`: inside, the processor's call and `pad` are its tokenizer's (4
    switched `current_processor` to the tokenizer, which its call and `pad` then used). Contexts nest."""
    if getattr(processor, "tokenizer", None) is None:
        raise LauncherError(f"{type(processor).__name__}.as_target_processor(): transformers 4's target mode sends "
                            "the processor's calls to its tokenizer, and this processor has none.")  # fmt: skip
    note_once("as_target_processor", "processor.as_target_processor() was removed in transformers v5: the "
              "processor's calls and pad() inside go to its tokenizer, as in transformers 4.")  # fmt: skip
    _route_to_tokenizer(type(processor), patches)
    processor.__dict__[_TARGET_DEPTH] = processor.__dict__.get(_TARGET_DEPTH, 0) + 1
    try:
        yield
    finally:
        depth = processor.__dict__.get(_TARGET_DEPTH, 1) - 1
        if depth > 0:
            processor.__dict__[_TARGET_DEPTH] = depth
        else:
            processor.__dict__.pop(_TARGET_DEPTH, None)


def _install_as_target_processor(patches: Patches) -> Skip | None:
    mixin = _owner("transformers.processing_utils:ProcessorMixin")
    if mixin is None:
        return Skip("transformers has no ProcessorMixin where transformers 5 defines it", problem=True)
    if hasattr(mixin, "as_target_processor"):
        return Skip("transformers still has as_target_processor")

    @contextlib.contextmanager
    def as_target_processor(self):
        yield from _target_mode(self, patches)

    patches.set(mixin, "as_target_processor", as_target_processor)
    return None


AS_TARGET_PROCESSOR = Shim(
    name="as_target_processor",
    replaces="`with processor.as_target_processor(): labels = processor(texts).input_ids` and `processor.pad(...)` "
    "inside it (removed in transformers v5: AttributeError)",
    by="a context in which the processor's call and `pad` are its tokenizer's, as in transformers 4",
    install=_install_as_target_processor,
)


def adapt_old_tokenizer_keywords(kwargs: dict) -> None:
    """Rewrite transformers 4's deprecated tokenizer keywords in `kwargs` as 4 read them.

    4 read `truncation_strategy=X` as `truncation=X` and `pad_to_max_length=True` as `padding="max_length"`,
    each only when the new keyword was not given (the new one wins when both are); v5 raises on the first
    and drops the second without a word.
    """
    if "truncation_strategy" in kwargs:
        old = kwargs.pop("truncation_strategy")
        if kwargs.get("truncation") is None and old is not None:
            kwargs["truncation"] = getattr(old, "value", old)
        note_once("truncation_strategy", "truncation_strategy= was removed from tokenizer calls in transformers v5: "
                  "read as truncation=, as transformers 4 did.")  # fmt: skip
    if "pad_to_max_length" in kwargs:
        if kwargs.pop("pad_to_max_length") and kwargs.get("padding", False) is False:
            kwargs["padding"] = "max_length"
        note_once("pad_to_max_length", 'pad_to_max_length= is ignored by tokenizer calls in transformers v5: read as '
                  'padding="max_length", as transformers 4 did.')  # fmt: skip


def _install_old_tokenizer_keywords(patches: Patches) -> Skip | None:
    base = _owner("transformers.tokenization_utils_base:PreTrainedTokenizerBase")
    if base is None:
        return Skip("transformers has no PreTrainedTokenizerBase where transformers 5 defines it", problem=True)
    for name in ("__call__", "encode"):
        original = base.__dict__.get(name)
        if original is None:
            continue

        @functools.wraps(original)
        def adapted(self, *args, __original=original, **kwargs):
            adapt_old_tokenizer_keywords(kwargs)
            return __original(self, *args, **kwargs)

        patches.set(base, name, adapted)
    return None


TOKENIZER_OLD_KEYWORDS = Shim(
    name="truncation_strategy",
    replaces="`truncation_strategy=` and `pad_to_max_length=` on `tokenizer(...)` / `tokenizer.encode(...)` "
    "(transformers v5: TypeError for the first, silently ignored for the second)",
    by="`truncation=` and `padding=\"max_length\"`, as transformers 4 read them when those were not given",
    install=_install_old_tokenizer_keywords,
)
