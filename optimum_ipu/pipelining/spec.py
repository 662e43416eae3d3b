"""Declarative cut specs: where each architecture keeps its embeddings and its list of layers.

A spec is all the pipelining code needs to know about an architecture. Everything else is found by
walking the module tree: what sits beside the layer list inside the base model (a pooler, a final
layer norm) and the task heads outside it go to the last IPU; a head whose weight is tied to the word
embedding goes to IPU 0 beside it. Adding an architecture is one entry in `CUT_SPECS`.

Optimum Graphcore cut a few heads its own way, and the spec says so: MPNet's pooler goes back to
IPU 0; a speech model for CTC counts its feature encoder's convolutions, its positional convolution
and its output projection in `layers_per_ipu` together with the transformer layers (so
`Graphcore/wav2vec2-ctc-base-ipu`'s `[9, 4, 4, 4]` places 7 convolutions + 1 + 12 layers + 1 = 21
units), while its audio-classification head keeps the whole feature encoder on IPU 0 and counts only
the transformer layers (`Graphcore/hubert-base-ipu`'s `[0, 4, 4, 4]`).

An encoder-decoder model has two layer lists, and `layers_per_ipu` counts them together, encoder
first (`Graphcore/mt5-small-ipu`'s `[0, 8, 8, 0]`: 8 encoder then 8 decoder layers). Its spec names
the decoder's list in a `DecoderStack`, with what runs just before the first decoder layer (BART's
decoder positions, back on IPU 0; Whisper's decoder embedding, beside the first decoder layer) and
the stacks' final layer norms, each a block of its own on the IPU of its stack's last layer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class DecoderStack:
    """The decoder of an encoder-decoder model: its layer list and what runs around it.

    Attributes:
        layers: path of the decoder's `nn.ModuleList` of layers; `layers_per_ipu` counts these after
            the encoder's layers.
        embeddings: modules that form the "Decoder Embedding" block, run before the first decoder layer.
        embeddings_on_first_ipu: True: that block is on IPU 0 (BART, whose decoder went back to IPU 0
            for its positions); False: on the IPU of the first decoder layer (Whisper).
        layer_name: how the allocation table names each decoder layer ("Decoder 3").
        final: `(name, path)` blocks right after the last decoder layer, on its IPU (a final layer norm).
    """

    layers: str
    embeddings: tuple[str, ...] = ()
    embeddings_on_first_ipu: bool = True
    layer_name: str = "Decoder"
    final: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CutSpec:
    """Where an architecture's pieces live, relative to its base model (e.g. `model.bert`).

    Attributes:
        embeddings: module paths that form the "Embedding" block on IPU 0.
        layers: path of the `nn.ModuleList` of transformer layers to spread over the IPUs.
        word_embedding: path of the `nn.Embedding` that embedding serialization splits.
        layer_name: how the allocation table names each layer ("Encoder 3").
        counted_before: `(name, path)` units placed by `layers_per_ipu` ahead of the layers, as if they
            were layers; a path ending in `.*` is an `nn.ModuleList` whose items count one each
            ("Conv 0", "Conv 1", ...).
        counted_after: `(name, path)` units placed by `layers_per_ipu` after the layers; these paths
            are from the model's root (they are task heads, outside the base model).
        riders: `(path, host)` pairs: the module at `path` joins the block that owns `host` (the last
            one, for a list), running on its IPU, as a module without a PopTorch block of its own ran
            on the IPU of the block before it.
        first_ipu_heads: modules outside the embeddings and layers that Optimum Graphcore put back on
            IPU 0 after the last layer (MPNet's pooler).
        final: `(name, path)` blocks right after the last layer of `layers`, on its IPU (T5's "Encoder
            Stack Final LayerNorm").
        decoder: the decoder's stack, for an encoder-decoder model (then `layers` is the encoder's).
        optional: paths above that some configurations of the architecture do not build (DeBERTa's
            relative position embeddings exist only with `relative_attention`); a model without one is
            placed with the spec minus that path.
    """

    embeddings: tuple[str, ...]
    layers: str
    word_embedding: str | None = None
    layer_name: str = "Encoder"
    counted_before: tuple[tuple[str, str], ...] = ()
    counted_after: tuple[tuple[str, str], ...] = ()
    riders: tuple[tuple[str, str], ...] = ()
    first_ipu_heads: tuple[str, ...] = ()
    final: tuple[tuple[str, str], ...] = ()
    decoder: DecoderStack | None = None
    optional: tuple[str, ...] = ()

    @property
    def layer_lists(self) -> tuple[str, ...]:
        """Paths of the layer lists `layers_per_ipu` spreads, in the order it counts them."""
        return (self.layers,) if self.decoder is None else (self.layers, self.decoder.layers)

    def without(self, path: str) -> CutSpec:
        """This spec with `path` no longer named as an embedding or a rider (it then goes where the
        module-tree walk puts it)."""
        return dataclasses.replace(
            self,
            embeddings=tuple(p for p in self.embeddings if p != path),
            riders=tuple(r for r in self.riders if r[0] != path),
        )


# The feature encoder of Wav2Vec2 and HuBERT (same module tree): for audio classification all of it is
# the "Embedding" block on IPU 0; for CTC its convolutions are counted units and the projection rides
# with the last one, the encoder's layer norm with the positional convolution (both ran, in Optimum
# Graphcore, inside the block opened before them).
_SPEECH_FRONT = ("feature_extractor", "feature_projection", "encoder.pos_conv_embed", "encoder.layer_norm")
_SPEECH_CLASSIFICATION = CutSpec(_SPEECH_FRONT, "encoder.layers")
_SPEECH_CTC = CutSpec(
    (),
    "encoder.layers",
    counted_before=(
        ("Conv", "feature_extractor.conv_layers.*"),
        ("Positional Embedding", "encoder.pos_conv_embed"),
    ),
    counted_after=(("Project Hidden", "lm_head"),),
    riders=(
        ("feature_projection", "feature_extractor.conv_layers"),
        ("encoder.layer_norm", "encoder.pos_conv_embed"),
    ),
)

# Pretraining: the same counted units, then the three heads of the contrastive loss.
_SPEECH_PRETRAINING = dataclasses.replace(
    _SPEECH_CTC,
    counted_after=(
        ("Project Hidden", "project_hid"),
        ("Quantizer", "quantizer"),
        ("Project Quantizer", "project_q"),
    ),
)


# Encoder-decoder models, as Optimum Graphcore's Pipelined*ForConditionalGeneration placed them. The
# decoder's word embedding (a module of its own sharing the table's weight) was computed with the
# encoder's on IPU 0 at the start of the step, so it is part of the "Embedding" block.
_BART = CutSpec(
    (
        "shared",
        "encoder.embed_tokens",
        "decoder.embed_tokens",
        "encoder.embed_positions",
        "encoder.layernorm_embedding",
    ),
    "encoder.layers",
    "shared",
    decoder=DecoderStack("decoder.layers", ("decoder.embed_positions", "decoder.layernorm_embedding")),
)
_T5_FINAL_NORMS = {
    "final": (("Encoder Stack Final LayerNorm", "encoder.final_layer_norm"),),
    "decoder": DecoderStack(
        "decoder.block", final=(("Decoder Stack Final LayerNorm", "decoder.final_layer_norm"),)
    ),
}
# MT5's LM head, untied from the embedding (`tie_word_embeddings=False`), is on the last IPU; T5's on
# IPU 0 whether tied or not (the original's T5 class always put it there).
_MT5 = CutSpec(("shared", "encoder.embed_tokens", "decoder.embed_tokens"), "encoder.block", "shared",
               **_T5_FINAL_NORMS)  # fmt: skip
_T5 = dataclasses.replace(_MT5, first_ipu_heads=("lm_head",))
# Whisper: the convolutions and encoder positions on IPU 0; the decoder's embedding and the output
# projection tied to it on the IPU of the first decoder layer.
_WHISPER = CutSpec(
    ("encoder.conv1", "encoder.conv2", "encoder.embed_positions"),
    "encoder.layers",
    "decoder.embed_tokens",
    final=(("Encoder Layer Norm", "encoder.layer_norm"),),
    decoder=DecoderStack(
        "decoder.layers",
        ("decoder.embed_tokens", "decoder.embed_positions"),
        embeddings_on_first_ipu=False,
        final=(("Decoder Layer Norm", "decoder.layer_norm"),),
    ),
)

CUT_SPECS: dict[str, CutSpec] = {
    "bert": CutSpec(("embeddings",), "encoder.layer", "embeddings.word_embeddings"),
    "roberta": CutSpec(("embeddings",), "encoder.layer", "embeddings.word_embeddings"),
    "distilbert": CutSpec(("embeddings",), "transformer.layer", "embeddings.word_embeddings"),
    "vit": CutSpec(("embeddings",), "layers"),
    "gpt2": CutSpec(("wte", "wpe"), "h", "wte", layer_name="Layer"),
    # MPNet's relative position bias table is computed before the first layer: in the Embedding block.
    "mpnet": CutSpec(
        ("embeddings", "encoder.relative_attention_bias"),
        "encoder.layer",
        "embeddings.word_embeddings",
        first_ipu_heads=("pooler",),
    ),
    # DeBERTa's relative position table (and v2's norm of it) is computed before the first layer: in the
    # Embedding block, as Optimum Graphcore placed it; v2's convolution runs after the first layer, in its block.
    "deberta": CutSpec(
        ("embeddings", "encoder.rel_embeddings"),
        "encoder.layer",
        "embeddings.word_embeddings",
        optional=("encoder.rel_embeddings",),
    ),
    "deberta-v2": CutSpec(
        ("embeddings", "encoder.rel_embeddings", "encoder.LayerNorm"),
        "encoder.layer",
        "embeddings.word_embeddings",
        riders=(("encoder.conv", "encoder.layer.0"),),
        optional=("encoder.rel_embeddings", "encoder.LayerNorm", "encoder.conv"),
    ),
    "wav2vec2": _SPEECH_CLASSIFICATION,
    "hubert": _SPEECH_CLASSIFICATION,
    # Keyed by class: Optimum Graphcore cut these heads differently from the rest of their family.
    "Wav2Vec2ForCTC": _SPEECH_CTC,
    "HubertForCTC": _SPEECH_CTC,
    "Wav2Vec2ForPreTraining": _SPEECH_PRETRAINING,
    "bart": _BART,
    "t5": _T5,
    "mt5": _MT5,
    "whisper": _WHISPER,
    # The encoders alone: the encoder's half of the spec.
    "T5EncoderModel": dataclasses.replace(_T5, embeddings=("shared", "encoder.embed_tokens"), decoder=None),
    "MT5EncoderModel": dataclasses.replace(_MT5, embeddings=("shared", "encoder.embed_tokens"), decoder=None),
}


def base_model_path(model: nn.Module) -> str:
    """Dotted path of the base model inside `model` ("" when `model` is the base model itself)."""
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and isinstance(getattr(model, prefix, None), nn.Module):
        return prefix
    return ""


def spec_for(model: nn.Module) -> CutSpec | None:
    """The registered spec for `model`'s architecture, or None when it has none."""
    config = getattr(model, "config", None)
    spec = CUT_SPECS.get(type(model).__name__) or CUT_SPECS.get(getattr(config, "model_type", None))
    if spec is not None and not _has_layer_lists(model, spec):
        return None  # a head of the family built differently (BART's decoder-only causal LM)
    if spec is not None:
        base = base_model_path(model)
        for path in spec.optional:
            try:
                model.get_submodule(".".join(p for p in (base, path) if p))
            except AttributeError:
                spec = spec.without(path)
    if spec is not None and getattr(config, "do_stable_layer_norm", False):
        # The "stable layer norm" encoder applies its layer norm after the last layer, not before the
        # first: it is then a head on the last IPU.
        spec = spec.without("encoder.layer_norm")
    return spec


def _has_layer_lists(model: nn.Module, spec: CutSpec) -> bool:
    base = base_model_path(model)
    for path in spec.layer_lists:
        try:
            model.get_submodule(".".join(p for p in (base, path) if p))
        except AttributeError:
            return False
    return True


def generic_spec(model: nn.Module) -> CutSpec:
    """A spec guessed from the module tree, for `to_pipelined(..., force=True)` (IPUTrainer: `force_to_pipelined=True`).

    The layer list is the `nn.ModuleList` with the most parameters; the embeddings are the
    `nn.Embedding` modules outside it (none for, e.g., a plain MLP stack).
    """
    base = base_model_path(model)
    root = model.get_submodule(base) if base else model
    candidates = [
        (sum(p.numel() for p in module.parameters()), name)
        for name, module in root.named_modules()
        if isinstance(module, nn.ModuleList) and len(module) > 0 and name
    ]
    if not candidates:
        raise ValueError(
            f"{type(model).__name__} has no nn.ModuleList of layers to spread over IPUs; "
            "pipelining needs a list of repeated layers."
        )
    _, layers = max(candidates)
    embeddings = tuple(
        name
        for name, module in root.named_modules()
        if isinstance(module, nn.Embedding) and not name.startswith(layers + ".")
    )
    word = max(
        embeddings,
        key=lambda name: root.get_submodule(name).num_embeddings,
        default=None,
    )
    return CutSpec(embeddings, layers, word, layer_name="Layer")
