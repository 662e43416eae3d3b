"""Serialized embedding and projection: a large table split into pieces and computed piece by piece.

On an IPU a 30k x 768 word embedding does not fit on one tile set in one go, so Optimum Graphcore
splits it into `factor` vocabulary slices, looks each up separately and sums the results. The math is
that of the plain layer, and here it is exactly the same computation: each slice is a *view* of the
original `weight` parameter, so the state_dict keys, weight tying (an LM head sharing the table) and
`padding_idx` (which the original silently dropped) are all preserved.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _check_factor(size: int, factor: int, what: str) -> int:
    if factor < 1:
        raise ValueError(f"{what} serialization factor must be >= 1, got {factor}.")
    if size % factor:
        raise ValueError(
            f"{what} of size {size} cannot be split into {factor} equal pieces: choose a serialization "
            f"factor that divides {size} (e.g. {', '.join(str(d) for d in range(2, 9) if size % d == 0) or '1'})."
        )
    return size // factor


class SerializedEmbedding(nn.Module):
    """An `nn.Embedding` looked up in `factor` vocabulary slices and summed.

    Args:
        embedding: the embedding to serialize; its `weight` parameter is shared, not copied.
        factor: number of equal vocabulary slices (must divide `num_embeddings`).
    """

    def __init__(self, embedding: nn.Embedding, factor: int):
        super().__init__()
        self.split_size = _check_factor(embedding.num_embeddings, factor, "the word embedding vocabulary")
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
        out = None
        for i in range(self.factor):
            start = i * self.split_size
            local = input_ids - start
            in_slice = (local >= 0) & (local < self.split_size)
            padding = None
            if self.padding_idx is not None and start <= self.padding_idx < start + self.split_size:
                padding = self.padding_idx - start
            piece = F.embedding(
                local.clamp(0, self.split_size - 1),
                self.weight[start : start + self.split_size],
                padding_idx=padding,
            )
            piece = piece * in_slice.unsqueeze(-1).to(piece.dtype)
            out = piece if out is None else out + piece
        if self.embed_scale is not None:
            out = out * self.embed_scale
        return out

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, factor={self.factor}, padding_idx={self.padding_idx}"


class SerializedLinear(nn.Module):
    """An `nn.Linear` whose output features are computed in `factor` slices and concatenated.

    Used for an output projection such as a tied LM head (the transposed word embedding), which is as
    large as the embedding and is serialized the same way.
    """

    def __init__(self, linear: nn.Linear, factor: int):
        super().__init__()
        self.split_size = _check_factor(linear.out_features, factor, "the projection's output features")
        self.factor = factor
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.original = [linear]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        pieces = []
        for i in range(self.factor):
            rows = slice(i * self.split_size, (i + 1) * self.split_size)
            bias = None if self.bias is None else self.bias[rows]
            pieces.append(F.linear(hidden, self.weight[rows], bias))
        return torch.cat(pieces, dim=-1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, factor={self.factor}"
