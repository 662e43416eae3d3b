"""Declarative cut specs: where each architecture keeps its embeddings and its list of layers.

A spec is all the pipelining code needs to know about an architecture. Everything else is found by
walking the module tree: what sits beside the layer list inside the base model (a pooler, a final
layer norm) and the task heads outside it go to the last IPU; a head whose weight is tied to the word
embedding goes to IPU 0 beside it. Adding an architecture is one entry in `CUT_SPECS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class CutSpec:
    """Where an architecture's pieces live, relative to its base model (e.g. `model.bert`).

    Attributes:
        embeddings: module paths that form the "Embedding" block on IPU 0.
        layers: path of the `nn.ModuleList` of transformer layers to spread over the IPUs.
        word_embedding: path of the `nn.Embedding` that embedding serialization splits.
        layer_name: how the allocation table names each layer ("Encoder 3").
    """

    embeddings: tuple[str, ...]
    layers: str
    word_embedding: str | None = None
    layer_name: str = "Encoder"


CUT_SPECS: dict[str, CutSpec] = {
    "bert": CutSpec(("embeddings",), "encoder.layer", "embeddings.word_embeddings"),
    "roberta": CutSpec(("embeddings",), "encoder.layer", "embeddings.word_embeddings"),
    "distilbert": CutSpec(("embeddings",), "transformer.layer", "embeddings.word_embeddings"),
    "vit": CutSpec(("embeddings",), "layers"),
    "gpt2": CutSpec(("wte", "wpe"), "h", "wte", layer_name="Layer"),
}


def base_model_path(model: nn.Module) -> str:
    """Dotted path of the base model inside `model` ("" when `model` is the base model itself)."""
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and isinstance(getattr(model, prefix, None), nn.Module):
        return prefix
    return ""


def spec_for(model: nn.Module) -> CutSpec | None:
    """The registered spec for `model`'s architecture, or None when it has none."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return CUT_SPECS.get(model_type)


def generic_spec(model: nn.Module) -> CutSpec:
    """A spec guessed from the module tree, for `force_to_pipelined=True`.

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
