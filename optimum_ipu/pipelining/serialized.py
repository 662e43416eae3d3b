"""Serialized embedding and projection: a large table split into pieces and computed piece by piece.

On an IPU a 30k x 768 word embedding does not fit on one tile set in one go, so Optimum Graphcore
splits it into `factor` vocabulary slices, looks each up separately and sums the results. The math is
that of the plain layer: a lookup in a slice is the lookup in the table, and a slice of the logits is
the same dot products. So the layers here hold the split (the slices the IPU holds, checked against
the vocabulary, and what the memory model prices) and compute the whole table in one lookup or one
matmul, on the original `weight` parameter: the state_dict keys, weight tying (an LM head sharing
the table) and `padding_idx` (which the original silently dropped) are all preserved. Computing
slice by slice on views of the weight cost a gradient of the whole table's size per slice in
backward (autograd's slice backward): on GPT-2 (8 slices of 50,257 x 768 per micro-batch) it
doubled a training step on a CPU.

A vocabulary the factor does not divide (GPT-2's 50,257 with `Graphcore/gpt2-small-ipu`'s factor 4)
is split as the IPU holds it, padded to the next multiple of the factor: every slice has
ceil(vocabulary / factor) rows, the last one's padded rows included. Optimum Graphcore's GPT-2 padded
the table itself (`resize_token_embeddings` to 50,260 in `parallelize`, logits of the padded rows
masked to -10000, shrunk back in `deparallelize`). Here the padded rows are never stored, never read
and never output: the last slice is a view of the real rows only, so the logits have the original
vocabulary size, the loss and gradients are plain transformers', `config.vocab_size` never changes
and no random numbers are drawn to initialise rows that would be thrown away. The memory model
prices the padded table the IPU would hold (`padded_rows`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def padded_rows(size: int, factor: int) -> int:
    """Rows of a table of `size` rows split in `factor` slices as the IPU holds it: the next multiple of
    `factor` (50,257 -> 50,260 for factor 4), as Optimum Graphcore padded GPT-2's vocabulary."""
    return -(-size // factor) * factor


def piece_bounds(size: int, factor: int, what: str) -> list[tuple[int, int]]:
    """(start, stop) of each slice holding real rows: ceil(size / factor) rows each, the last one
    shorter when `factor` does not divide `size` (its other rows are the padding, which holds nothing)."""
    if factor < 1:
        raise ValueError(f"{what} serialization factor must be >= 1, got {factor}.")
    if factor > size:
        raise ValueError(
            f"{what} of size {size} cannot be split into {factor} pieces: a serialization factor of at most "
            f"{size} gives each piece at least one row."
        )
    split = padded_rows(size, factor) // factor
    return [(start, min(start + split, size)) for start in range(0, size, split)]


class SerializedEmbedding(nn.Module):
    """An `nn.Embedding` held in `factor` vocabulary slices, as the IPU holds it (see the module docstring).

    Args:
        embedding: the embedding to serialize; its `weight` parameter is shared, not copied.
        factor: number of vocabulary slices, ceil(`num_embeddings` / factor) rows each (the last one
            padded when the factor does not divide the vocabulary).
    """

    def __init__(self, embedding: nn.Embedding, factor: int):
        super().__init__()
        self.pieces = piece_bounds(embedding.num_embeddings, factor, "the word embedding vocabulary")
        self.split_size = self.pieces[0][1]
        self.factor = factor
        self.weight = embedding.weight
        self.num_embeddings = embedding.num_embeddings
        self.embedding_dim = embedding.embedding_dim
        self.padding_idx = embedding.padding_idx
        self.max_norm = embedding.max_norm
        # transformers' scaled word embeddings (BART's with `scale_embedding`) multiply the lookup by this.
        self.embed_scale = getattr(embedding, "embed_scale", None)
        self.original = [embedding]  # a list so the original is not registered as a submodule

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # The sum of the slices' lookups, each row found in exactly one slice: the table's lookup.
        out = F.embedding(input_ids, self.weight, padding_idx=self.padding_idx, max_norm=self.max_norm)
        if self.embed_scale is not None:
            out = out * self.embed_scale
        return out

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, factor={self.factor}, padding_idx={self.padding_idx}"


class SerializedLinear(nn.Module):
    """An `nn.Linear` whose output features are held in `factor` slices, as the IPU holds them.

    Used for an output projection such as a tied LM head (the transposed word embedding), which is as
    large as the embedding and is serialized the same way, padded the same way when the factor does
    not divide the output features (Whisper's 51,865 with a projection factor of 4).
    """

    def __init__(self, linear: nn.Linear, factor: int):
        super().__init__()
        self.pieces = piece_bounds(linear.out_features, factor, "the projection's output features")
        self.split_size = self.pieces[0][1]
        self.factor = factor
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.original = [linear]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # The slices' outputs concatenated: the same dot products as the whole projection's.
        return F.linear(hidden, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, factor={self.factor}"
