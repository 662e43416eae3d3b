"""Tiny builders shared by the test suite: models, a word-level tokenizer, seeds.

Every test that needs a model builds it here, so the whole suite runs in seconds on a CPU and a
change to "what a tiny BERT is" happens in one place.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import BertConfig, ViTConfig

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
