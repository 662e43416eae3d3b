"""What `IPUTrainer.evaluate()` / `predict()` report equals plain transformers' on the same model and data.

An inference call on the IPU runs micro-batch after micro-batch (device iterations x replicas), each
with the loss the model computes for its own micro-batch; the call's loss is their sample-weighted
mean. That is exactly what plain transformers' `Trainer.evaluate()` reports with
`per_device_eval_batch_size` = the micro-batch (each batch's loss, weighted by its size). Every head
with a loss, every inference split (device iterations, replicas, micro-batch, a short last batch,
padding) must agree, in fp32, to float round-off. Labels are padded with -100 in varying amounts, so
a loss divided by the wrong number of tokens shows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures import tiny_bert_config, tiny_vit_config
from transformers import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
    ViTForImageClassification,
)

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments

SEQ = 12
SAMPLES = 23  # not a multiple of any combined batch below: the short last batch counts too


def _tokens(generator, n, seq=SEQ):
    ids = torch.randint(5, 120, (n, seq), generator=generator)
    lengths = torch.randint(3, seq + 1, (n,), generator=generator)  # varying amounts of padding
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return ids * mask, mask


def _rows(columns: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    n = len(next(iter(columns.values())))
    return [{k: v[i] for k, v in columns.items()} for i in range(n)]


def causal_lm():
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=4, n_head=4, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    g = torch.Generator().manual_seed(1)
    ids, mask = _tokens(g, SAMPLES)
    labels = ids.masked_fill(mask == 0, -100)
    return GPT2LMHeadModel(config), _rows({"input_ids": ids, "attention_mask": mask, "labels": labels})


def masked_lm():
    g = torch.Generator().manual_seed(2)
    ids, mask = _tokens(g, SAMPLES)
    chosen = (torch.rand(ids.shape, generator=g) < 0.3) & (mask == 1)
    chosen[:, 0] = True  # at least one masked token per sample
    labels = ids.masked_fill(~chosen, -100)
    return BertForMaskedLM(tiny_bert_config()), _rows(
        {"input_ids": ids, "attention_mask": mask, "labels": labels}
    )


def sequence_classification():
    g = torch.Generator().manual_seed(3)
    ids, mask = _tokens(g, SAMPLES)
    labels = torch.randint(0, 3, (SAMPLES,), generator=g)
    model = BertForSequenceClassification(tiny_bert_config(num_labels=3))
    return model, _rows({"input_ids": ids, "attention_mask": mask, "labels": labels})


def token_classification():
    g = torch.Generator().manual_seed(4)
    ids, mask = _tokens(g, SAMPLES)
    labels = torch.randint(0, 5, ids.shape, generator=g).masked_fill(mask == 0, -100)
    model = BertForTokenClassification(tiny_bert_config(num_labels=5))
    return model, _rows({"input_ids": ids, "attention_mask": mask, "labels": labels})


def question_answering():
    g = torch.Generator().manual_seed(5)
    ids, mask = _tokens(g, SAMPLES)
    start = torch.randint(0, SEQ, (SAMPLES,), generator=g)
    end = torch.minimum(start + torch.randint(0, 3, (SAMPLES,), generator=g), torch.tensor(SEQ - 1))
    return BertForQuestionAnswering(tiny_bert_config()), _rows(
        {"input_ids": ids, "attention_mask": mask, "start_positions": start, "end_positions": end}
    )


def multiple_choice():
    g = torch.Generator().manual_seed(6)
    ids, mask = _tokens(g, SAMPLES * 4)
    labels = torch.randint(0, 4, (SAMPLES,), generator=g)
    return BertForMultipleChoice(tiny_bert_config()), _rows(
        {
            "input_ids": ids.view(SAMPLES, 4, SEQ),
            "attention_mask": mask.view(SAMPLES, 4, SEQ),
            "labels": labels,
        }
    )


def image_classification():
    g = torch.Generator().manual_seed(7)
    pixels = torch.randn(SAMPLES, 3, 32, 32, generator=g)
    labels = torch.randint(0, 3, (SAMPLES,), generator=g)
    return ViTForImageClassification(tiny_vit_config()), _rows({"pixel_values": pixels, "labels": labels})


HEADS = {
    "causal-lm": causal_lm,
    "masked-lm": masked_lm,
    "sequence-classification": sequence_classification,
    "token-classification": token_classification,
    "question-answering": question_answering,
    "multiple-choice": multiple_choice,
    "image-classification": image_classification,
}

# (micro-batch, inference device iterations, inference replicas, pad_on_batch_axis)
SPLITS = [(1, 5, 1, False), (2, 2, 2, False), (3, 1, 1, False), (2, 3, 1, True), (1, 2, 4, True)]


def _build(head: str):
    torch.manual_seed(0)
    model, rows = HEADS[head]()
    return model.eval(), rows


def _plain_metrics(head, tmp_path, micro):
    model, rows = _build(head)
    if head == "causal-lm":
        # transformers' Trainer divides GPT-2's summed loss by its own count of label tokens, and counts
        # every label where the loss predicts all but the first of each row (GPT-2's `loss_type` is None,
        # so the Trainer does not know the loss shifts them): its eval_loss is too low by the rows' share of
        # their labels. The reference is the plain model's own loss per batch, averaged over the samples.
        losses = []
        with torch.no_grad():
            for first in range(0, len(rows), micro):
                batch = {k: torch.stack([row[k] for row in rows[first : first + micro]]) for k in rows[0]}
                losses.append((model(**batch).loss.item(), len(batch["input_ids"])))
        return {"eval_loss": sum(loss * n for loss, n in losses) / len(rows)}
    args = TrainingArguments(output_dir=str(tmp_path / "plain"), per_device_eval_batch_size=micro, report_to="none",
                             use_cpu=True)  # fmt: skip
    return Trainer(model, args, eval_dataset=rows).evaluate()


def _ipu_trainer(head, tmp_path, micro, di, replicas, pad):
    model, rows = _build(head)
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, inference_device_iterations=di,
                       inference_replication_factor=replicas)  # fmt: skip
    args = IPUTrainingArguments(output_dir=str(tmp_path / "ipu"), per_device_eval_batch_size=micro, report_to="none",
                                use_cpu=True, fp32=True, pad_on_batch_axis=pad)  # fmt: skip
    return IPUTrainer(model, config, args, eval_dataset=rows), rows


@pytest.mark.parametrize(
    "split", SPLITS, ids=lambda s: "mb{}-di{}-r{}{}".format(*s[:3], "-pad" if s[3] else "")
)
@pytest.mark.parametrize("head", sorted(HEADS))
def test_eval_loss_equals_plain_transformers_at_the_micro_batch(tmp_path, head, split):
    micro, di, replicas, pad = split
    trainer, _ = _ipu_trainer(head, tmp_path, micro, di, replicas, pad)
    ipu = trainer.evaluate()
    plain = _plain_metrics(head, tmp_path, micro)
    assert ipu["eval_loss"] == pytest.approx(plain["eval_loss"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("head", ["causal-lm", "token-classification"])
def test_predictions_and_per_call_outputs_equal_plain_transformers(tmp_path, head):
    """`predict()`'s predictions and label ids, concatenated over calls and trimmed, are the plain model's."""
    trainer, rows = _ipu_trainer(head, tmp_path, micro=2, di=3, replicas=1, pad=True)
    ipu = trainer.predict(rows)
    model, _ = _build(head)
    args = TrainingArguments(output_dir=str(tmp_path / "plain"), per_device_eval_batch_size=2, report_to="none",
                             use_cpu=True)  # fmt: skip
    plain = Trainer(model, args).predict(rows)
    expected = (
        _plain_metrics(head, tmp_path, 2)["eval_loss"] if head == "causal-lm" else plain.metrics["test_loss"]
    )
    assert ipu.metrics["test_loss"] == pytest.approx(expected, rel=1e-5)
    ipu_logits = ipu.predictions[0] if isinstance(ipu.predictions, tuple) else ipu.predictions
    plain_logits = plain.predictions[0] if isinstance(plain.predictions, tuple) else plain.predictions
    np.testing.assert_allclose(ipu_logits, plain_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ipu.label_ids, plain.label_ids)


def test_logged_training_loss_is_the_mean_of_the_calls_micro_batch_losses(tmp_path):
    """Training reduces as PopTorch does: each micro-batch's own loss, averaged over the call.

    Checked on a causal LM whose micro-batches hold different numbers of label tokens, against the plain
    model's loss on each micro-batch (the combined batch is laid out replica by replica, micro-batch by
    micro-batch). transformers' own Trainer weighs accumulated micro-batches by their token counts
    instead; the IPU does not.
    """
    model, rows = _build("causal-lm")
    rows = rows[:16]
    config = IPUConfig(gradient_accumulation_steps=2, replication_factor=2)
    args = IPUTrainingArguments(output_dir=str(tmp_path / "ipu"), per_device_train_batch_size=2, report_to="none",
                                use_cpu=True, fp32=True, optim="sgd", learning_rate=0.0, logging_steps=1, num_train_epochs=1,
                                save_strategy="no", train_sampling_strategy="sequential")  # fmt: skip
    trainer = IPUTrainer(model, config, args, train_dataset=rows)
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]

    reference, _ = _build("causal-lm")
    expected = []
    with torch.no_grad():
        for step in range(2):
            micro_losses = []
            for first in range(8 * step, 8 * step + 8, 2):
                batch = {k: torch.stack([row[k] for row in rows[first : first + 2]]) for k in rows[0]}
                micro_losses.append(reference(**batch).loss.item())
            expected.append(sum(micro_losses) / len(micro_losses))
    assert logged == pytest.approx(expected, rel=1e-5)
