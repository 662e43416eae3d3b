"""`optimum.graphcore.data`: `pad_on_batch_axis` and the masked-LM collator with a cap on masked tokens.

`pad_on_batch_axis` gives a data collator fixed-size batches by repeating samples.
`DataCollatorForLanguageModelingWithMaxTokensMasked` is transformers' masked-LM collator with at most
`max_num_masked_tokens` masked tokens per sequence: on an IPU the model gathered only the masked
positions into a tensor of that fixed size (static shapes), and the collator made sure no sequence
had more.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformers import DataCollatorForLanguageModeling
from transformers.tokenization_utils_base import BatchEncoding

__all__ = ["DataCollatorForLanguageModelingWithMaxTokensMasked", "max_num_masked_tokens", "pad_on_batch_axis"]


def _pad(value: Any, batch_size: int) -> Any:
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] in (0, batch_size):
        return value
    rows = torch.arange(batch_size, device=value.device) % value.shape[0]
    return value.index_select(0, rows)


def pad_on_batch_axis(batch_size: int) -> Callable[[Callable[..., dict]], Callable[..., dict]]:
    """Wrap a data collator so every batch it returns has `batch_size` rows.

    A short batch (the last of an epoch) is filled by repeating its samples from the first one, and a
    longer one is cut to `batch_size`, so that a compiled IPU program always sees one batch shape. In
    `IPUTrainer` the same padding is `IPUTrainingArguments(pad_on_batch_axis=True)`, which also trims
    the predictions of the repeated samples back; this wrapper is for loops of your own.

    Args:
        batch_size: the number of rows of every batch.

    Returns:
        A decorator: `pad_on_batch_axis(8)(collator)` is the padded collator.
    """
    if batch_size < 1:
        raise ValueError(f"pad_on_batch_axis needs a batch_size >= 1, got {batch_size}.")

    def decorate(collator: Callable[..., dict]) -> Callable[..., dict]:
        @functools.wraps(collator)
        def padded(*args, **kwargs) -> dict:
            batch = collator(*args, **kwargs)
            for key in list(batch.keys()):
                batch[key] = _pad(batch[key], batch_size)
            return batch

        return padded

    return decorate


def max_num_masked_tokens(max_seq_length: int, mlm_probability: float) -> int:
    """The cap on masked tokens per sequence, as Optimum Graphcore 0.7 computed it.

    The number of masked tokens of a sequence of `max_seq_length` maskable tokens is binomial
    (n = max_seq_length, p = mlm_probability); the cap is its mean plus two standard deviations, rounded
    up to a multiple of 16, and at most `max_seq_length`. With the defaults (p = 0.15) a sequence of 128
    gets 32, of 384 gets 80, of 512 gets 96.
    """
    mean = max_seq_length * mlm_probability
    std = math.sqrt(max_seq_length * mlm_probability * (1 - mlm_probability))
    return min(math.ceil((mean + 2 * std) / 16) * 16, max_seq_length)


class DataCollatorForLanguageModelingWithMaxTokensMasked(DataCollatorForLanguageModeling):
    """Masked-LM batches with at most `max_num_masked_tokens` masked tokens in every sequence.

    Masking is transformers' `DataCollatorForLanguageModeling`: each token that is not special (nor
    padding) is chosen with probability `mlm_probability`; of the chosen, 80% become the mask token,
    10% a random token and 10% stay (`mask_replace_prob` / `random_replace_prob`). Then, in a sequence
    where more than `max_num_masked_tokens` tokens were chosen, a uniformly random subset of that many
    stays chosen and the others are restored (their input token back, their label -100). The cap
    (`max_num_masked_tokens(max_seq_length, mlm_probability)`, mean + 2 std of the binomial count,
    rounded up to a multiple of 16) binds rarely, so the masked fraction stays close to
    `mlm_probability`; where it never binds, the batches equal transformers' collator's, seed for seed.

    Differences from Optimum Graphcore 0.7, which assumed every sequence was exactly `max_seq_length`
    long: sequences of any length are capped here (the original failed on shorter ones and did not cap
    longer ones correctly), and the cap also applies with `return_tensors="np"`.

    Args:
        max_seq_length: the sequence length the cap is computed for (the script's `--max_seq_length`).
        *args, **kwargs: those of `DataCollatorForLanguageModeling` (`tokenizer`, `mlm_probability`,
            `pad_to_multiple_of`, `seed`, ...).

    Attributes:
        max_seq_length: as given.
        max_num_masked_tokens: the cap; the original's example scripts copy it into
            `model.config.max_num_masked_tokens` (harmless here: the model does not read it).
    """

    def __init__(self, max_seq_length: int, *args, **kwargs):
        if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int) or max_seq_length < 1:
            raise ValueError(
                f"max_seq_length must be a positive int (the padded sequence length, e.g. 128), got "
                f"{max_seq_length!r}. Pass it first: "
                "DataCollatorForLanguageModelingWithMaxTokensMasked(128, tokenizer=tokenizer)."
            )
        super().__init__(*args, **kwargs)
        self.max_seq_length = max_seq_length
        self.max_num_masked_tokens = max_num_masked_tokens(max_seq_length, self.mlm_probability or 0.0)

    def torch_call(self, examples: list) -> dict[str, Any]:
        batch = super().torch_call(examples)
        # A plain dict, as the original returned (PopTorch's rebatching loader took dicts only).
        return dict(batch) if isinstance(batch, BatchEncoding) else batch

    def torch_mask_tokens(self, inputs: Any, special_tokens_mask: Any = None, offset_mapping: Any = None):
        inputs, labels = super().torch_mask_tokens(inputs, special_tokens_mask, offset_mapping)
        chosen = labels != -100
        if chosen.numel() == 0 or int(chosen.sum(dim=-1).max()) <= self.max_num_masked_tokens:
            return inputs, labels  # no draw at all: the same random stream as transformers' collator
        # The `cap` chosen positions with the smallest noise stay chosen: a uniform random subset.
        noise = torch.rand(labels.shape, generator=self.generator).masked_fill_(~chosen, 2.0)
        k = min(self.max_num_masked_tokens, labels.shape[-1])
        kept = (
            torch.zeros_like(chosen).scatter_(-1, noise.topk(k, dim=-1, largest=False).indices, True) & chosen
        )
        dropped = chosen & ~kept
        inputs[dropped] = labels[dropped]
        labels[dropped] = -100
        return inputs, labels

    def numpy_mask_tokens(self, inputs: Any, special_tokens_mask: Any = None, offset_mapping: Any = None):
        inputs, labels = super().numpy_mask_tokens(inputs, special_tokens_mask, offset_mapping)
        chosen = labels != -100
        if int(chosen.sum(axis=-1).max(initial=0)) <= self.max_num_masked_tokens:
            return inputs, labels
        draw = self.generator.random if self.generator is not None else np.random.random
        noise = np.where(chosen, draw(labels.shape), 2.0)
        k = min(self.max_num_masked_tokens, labels.shape[-1])
        kept = np.zeros_like(chosen)
        np.put_along_axis(kept, np.argsort(noise, axis=-1, kind="stable")[..., :k], True, axis=-1)
        dropped = chosen & ~kept
        inputs[dropped] = labels[dropped]
        labels[dropped] = -100
        return inputs, labels
