"""`DataCollatorForLanguageModelingWithMaxTokensMasked` (optimum_ipu/compat/data.py): transformers' masked-LM
collator with at most `max_num_masked_tokens` masked tokens per sequence, as Optimum Graphcore 0.7 had it.

References: hand-worked caps, transformers' own `DataCollatorForLanguageModeling` (same seed, same batches
where the cap does not bind), and the exact expectation of min(Binomial(n, p), cap) where it does.
"""

import math

import numpy as np
import pytest
import torch
from fixtures import tiny_bert_config, tiny_tokenizer
from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

from optimum.graphcore import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum.graphcore.data import DataCollatorForLanguageModelingWithMaxTokensMasked as Collator
from optimum.graphcore.data.data_collator import DataCollatorForLanguageModelingWithMaxTokensMasked
from optimum_ipu.compat.data import max_num_masked_tokens


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def examples(tokenizer, count, words, seed=0, ragged=False):
    """`count` tokenized sequences of `words` random words each ([CLS] ... [SEP]); `ragged`: lengths vary."""
    rng = np.random.default_rng(seed)
    vocab = sorted(w for w in tokenizer.get_vocab() if not w.startswith("["))
    rows = []
    for _ in range(count):
        n = int(rng.integers(words // 2, words + 1)) if ragged else words
        rows.append(tokenizer(" ".join(rng.choice(vocab, n)), return_special_tokens_mask=True))
    return rows


def masked(batch):
    return batch["labels"] != -100


def test_both_import_paths_give_the_collator():
    assert Collator is DataCollatorForLanguageModelingWithMaxTokensMasked


@pytest.mark.parametrize(
    "length, p, cap",
    # mean + 2 std, rounded up to a multiple of 16, at most the length: 19.2 + 8.08 -> 32, 57.6 + 13.99 -> 80,
    # 76.8 + 16.16 -> 96, 2.4 + 2.86 -> 16, 5 + 3.16 -> 16 capped at 10, 0.9 * 100 + 6 -> 96.
    [(128, 0.15, 32), (384, 0.15, 80), (512, 0.15, 96), (16, 0.15, 16), (10, 0.5, 10), (100, 0.9, 96)],
)
def test_the_cap_is_mean_plus_two_std_rounded_up_to_16(tokenizer, length, p, cap):
    assert max_num_masked_tokens(length, p) == cap
    assert Collator(length, tokenizer=tokenizer, mlm_probability=p).max_num_masked_tokens == cap


def test_no_sequence_has_more_masked_tokens_than_the_cap(tokenizer):
    # max_seq_length 16 at p = 0.5 caps at 16; sequences of 40-80 words would mask 20-40.
    collator = Collator(16, tokenizer=tokenizer, mlm_probability=0.5, seed=0)
    assert collator.max_num_masked_tokens == 16
    rows = examples(tokenizer, 32, 80, ragged=True)
    batch = collator(rows)
    original = tokenizer.pad(rows, return_tensors="pt")["input_ids"]
    assert masked(batch).sum(-1).max() == 16 and (masked(batch).sum(-1) <= 16).all()
    # Every choice of the transformers collator beyond the cap is undone: input restored, label -100.
    assert torch.equal(batch["labels"][masked(batch)], original[masked(batch)])
    assert torch.equal(batch["input_ids"][~masked(batch)], original[~masked(batch)])
    assert type(batch) is dict  # a plain dict, as the original returned


def test_special_and_padding_tokens_are_never_masked(tokenizer):
    collator = Collator(16, tokenizer=tokenizer, mlm_probability=1.0, seed=0)
    collator.max_num_masked_tokens = 1000  # every maskable token is chosen at p = 1: the cap must not matter
    for with_mask in (True, False):  # special_tokens_mask from the tokenizer, or worked out by the collator
        rows = examples(tokenizer, 8, 12, ragged=True)
        if not with_mask:
            rows = [{"input_ids": r["input_ids"]} for r in rows]
        batch = collator(rows)
        original = tokenizer.pad(rows, return_tensors="pt")["input_ids"]
        special = torch.isin(original, torch.tensor(tokenizer.all_special_ids))
        assert (original == tokenizer.pad_token_id).any()  # ragged: there is padding
        assert not masked(batch)[special].any() and masked(batch)[~special].all()
        assert torch.equal(batch["input_ids"][special], original[special])


def test_where_the_cap_never_binds_the_batches_equal_transformers_collator(tokenizer):
    ours = Collator(128, tokenizer=tokenizer, seed=3)
    theirs = DataCollatorForLanguageModeling(tokenizer=tokenizer, seed=3)
    for step in range(5):
        rows = examples(tokenizer, 8, 126, seed=step)
        a, b = ours(rows), theirs(rows)
        assert masked(a).sum(-1).max() <= ours.max_num_masked_tokens
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def expected_capped_count(n: int, p: float, cap: int) -> float:
    return sum(min(k, cap) * math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1))


def test_the_masked_fraction_matches_transformers_in_expectation_on_long_inputs(tokenizer):
    ours = Collator(128, tokenizer=tokenizer, seed=0)
    theirs = DataCollatorForLanguageModeling(tokenizer=tokenizer, seed=1)
    rows = examples(tokenizer, 64, 126)
    ours_fraction = torch.stack([masked(ours(rows)).float().mean() for _ in range(20)]).mean()
    theirs_fraction = torch.stack([masked(theirs(rows)).float().mean() for _ in range(20)]).mean()
    expected = expected_capped_count(126, 0.15, 32) / 128  # [CLS] and [SEP] are never masked
    # 20 x 64 x 126 tokens: the standard error of the fraction is ~0.001.
    assert float(ours_fraction) == pytest.approx(expected, abs=0.004)
    assert float(ours_fraction) == pytest.approx(float(theirs_fraction), abs=0.006)


def test_where_the_cap_binds_the_count_is_the_capped_binomial_and_80_10_10_holds(tokenizer):
    collator = Collator(16, tokenizer=tokenizer, mlm_probability=0.4, seed=0)  # 6.4 + 2 x 1.96 -> 16
    rows = examples(tokenizer, 64, 40)
    original = tokenizer.pad(rows, return_tensors="pt")["input_ids"]
    counts, mask_token, unchanged = [], [], []
    for _ in range(20):
        batch = collator(rows)
        chosen = masked(batch)
        counts.append(chosen.sum(-1).float())
        mask_token.append((batch["input_ids"][chosen] == tokenizer.mask_token_id).float())
        unchanged.append((batch["input_ids"][chosen] == original[chosen]).float())
    # E[min(Bin(40, 0.4), 16)] = 14.77 against 16 uncapped: the cap binds in ~half the sequences. The
    # mean of 1,280 counts has a standard error of about 0.05: 0.2 is 4 of them (the seeded stream
    # differs between transformers releases), and still far from 16 or from a cap of 15 (14.1).
    assert float(torch.cat(counts).mean()) == pytest.approx(expected_capped_count(40, 0.4, 16), abs=0.2)
    assert float(torch.cat(mask_token).mean()) == pytest.approx(0.8, abs=0.02)
    # 10% kept, plus the random replacements that happen to draw the same token (1 in len(tokenizer)).
    assert float(torch.cat(unchanged).mean()) == pytest.approx(0.1 + 0.1 / len(tokenizer), abs=0.015)


def test_the_numpy_path_is_capped_too(tokenizer):
    collator = Collator(16, tokenizer=tokenizer, mlm_probability=0.5, seed=0, return_tensors="np")
    batch = collator(examples(tokenizer, 16, 80))
    assert isinstance(batch["labels"], np.ndarray) and (masked(batch).sum(-1) == 16).all()


def test_the_same_seed_gives_the_same_batches(tokenizer):
    rows = examples(tokenizer, 16, 80, ragged=True)
    first = [Collator(16, tokenizer=tokenizer, mlm_probability=0.5, seed=5)(rows) for _ in range(2)]
    assert all(torch.equal(first[0][k], first[1][k]) for k in first[0])
    collator = Collator(16, tokenizer=tokenizer, mlm_probability=0.5)  # no seed: torch's global generator
    torch.manual_seed(11)
    a = collator(rows)
    torch.manual_seed(11)
    b = collator(rows)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["labels"], collator(rows)["labels"])


@pytest.mark.parametrize("bad", [0, -3, 12.5, "128", None])
def test_a_bad_max_seq_length_says_what_to_pass(tokenizer, bad):
    with pytest.raises(ValueError, match=r"max_seq_length must be a positive int .* got"):
        Collator(bad, tokenizer=tokenizer)


def test_a_tiny_bert_mlm_trains_on_the_ipu_with_the_collator_as_with_plain_transformers(tmp_path, tokenizer):
    """fp32, one IPU, micro-batch 4: IPUTrainer's losses equal transformers' Trainer's with the same collator
    and seed; then fp16 on two IPUs (the tied head back on IPU 0 needs GA 5) learns."""
    rows = [
        {k: r[k] for k in ("input_ids", "special_tokens_mask")}
        for r in examples(tokenizer, 40, 30, ragged=True)
    ]
    config = tiny_bert_config(vocab_size=len(tokenizer))
    common = dict(learning_rate=5e-3, num_train_epochs=1, logging_steps=1, save_strategy="no", report_to="none",
                  seed=7, use_cpu=True, dataloader_num_workers=0, remove_unused_columns=False)  # fmt: skip

    def collator():
        return Collator(32, tokenizer=tokenizer, seed=0)

    torch.manual_seed(0)
    plain = Trainer(BertForMaskedLM(config), TrainingArguments(str(tmp_path / "plain"), per_device_train_batch_size=4,
                                                               **common),
                    train_dataset=rows, data_collator=collator())  # fmt: skip
    plain.train()
    torch.manual_seed(0)
    ipu = IPUTrainer(BertForMaskedLM(config), IPUConfig(),
                     IPUTrainingArguments(str(tmp_path / "ipu"), per_device_train_batch_size=4, fp32=True, **common),
                     train_dataset=rows, data_collator=collator())  # fmt: skip
    ipu.train()
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (plain, ipu)]
    assert len(losses[1]) == 10
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)

    torch.manual_seed(0)
    two_ipus = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2, gradient_accumulation_steps=5)
    args = IPUTrainingArguments(
        str(tmp_path / "fp16"), per_device_train_batch_size=2, **common | {"num_train_epochs": 6}
    )
    fp16 = IPUTrainer(BertForMaskedLM(config), two_ipus, args, train_dataset=rows, data_collator=collator())
    fp16.train()
    history = [e["loss"] for e in fp16.state.log_history if "loss" in e]
    assert len(history) == 24 and sum(history[-4:]) < sum(history[:4])
