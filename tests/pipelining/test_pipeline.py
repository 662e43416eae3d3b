"""Pipelining must not change the math: pipelined vs plain transformers, and exact undo."""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import pytest
import torch
from fixtures import tiny_bert_config, tiny_mpnet_config, tiny_vit_config
from torch import nn
from transformers import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    DistilBertConfig,
    DistilBertForQuestionAnswering,
    DistilBertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    MPNetForMaskedLM,
    MPNetForMultipleChoice,
    MPNetForQuestionAnswering,
    MPNetForSequenceClassification,
    MPNetForTokenClassification,
    MPNetModel,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaForQuestionAnswering,
    ViTForImageClassification,
)

from optimum_ipu.pipelining import SerializedEmbedding, SerializedLinear, UnsupportedModelError, to_pipelined


def ipu_cfg(**overrides):
    """A duck-typed IPU config: pipelining only reads these attributes."""
    values = dict(
        layers_per_ipu=[-1],
        ipus_per_replica=2,
        embedding_serialization_factor=1,
        serialized_embedding_splits_per_ipu=None,
        recompute_checkpoint_every_layer=False,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


def _roberta():
    return RobertaConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=80, pad_token_id=1,
    )  # fmt: skip


def _distilbert():
    return DistilBertConfig(
        vocab_size=128,
        dim=32,
        n_layers=4,
        n_heads=4,
        hidden_dim=64,
        dropout=0.0,
        attention_dropout=0.0,
        seq_classif_dropout=0.0,
        qa_dropout=0.0,
    )


def _gpt2():
    return GPT2Config(
        vocab_size=128, n_embd=32, n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip


TEXT_MODELS = [
    (BertModel, tiny_bert_config, {}),
    (BertForPreTraining, tiny_bert_config, {"labels": "mlm", "next_sentence_label": "cls"}),
    (BertForMaskedLM, tiny_bert_config, {"labels": "mlm"}),
    (BertForSequenceClassification, tiny_bert_config, {"labels": "cls"}),
    (BertForTokenClassification, tiny_bert_config, {"labels": "tok"}),
    (BertForQuestionAnswering, tiny_bert_config, {"start_positions": "pos", "end_positions": "pos"}),
    (RobertaForMaskedLM, _roberta, {"labels": "mlm"}),
    (RobertaForQuestionAnswering, _roberta, {"start_positions": "pos", "end_positions": "pos"}),
    (DistilBertForSequenceClassification, _distilbert, {"labels": "cls"}),
    (DistilBertForQuestionAnswering, _distilbert, {"start_positions": "pos", "end_positions": "pos"}),
    (GPT2LMHeadModel, _gpt2, {"labels": "mlm"}),
    (MPNetModel, tiny_mpnet_config, {}),
    (MPNetForMaskedLM, tiny_mpnet_config, {"labels": "mlm"}),
    (MPNetForSequenceClassification, tiny_mpnet_config, {"labels": "cls"}),
    (MPNetForTokenClassification, tiny_mpnet_config, {"labels": "tok"}),
    (MPNetForQuestionAnswering, tiny_mpnet_config, {"start_positions": "pos", "end_positions": "pos"}),
]


def _text_inputs(labels: dict, batch=3, seq=12, vocab=128, multiple_choice=False):
    g = torch.Generator().manual_seed(1)
    shape = (batch, 2, seq) if multiple_choice else (batch, seq)
    inputs = {
        "input_ids": torch.randint(2, vocab, shape, generator=g),
        "attention_mask": torch.ones(shape, dtype=torch.long),
    }
    inputs["attention_mask"][..., -2:] = 0
    makers = {
        "mlm": lambda: torch.randint(0, vocab, (batch, seq), generator=g),
        "cls": lambda: torch.randint(0, 2, (batch,), generator=g),
        "tok": lambda: torch.randint(0, 2, (batch, seq), generator=g),
        "pos": lambda: torch.randint(0, seq, (batch,), generator=g),
        "mc": lambda: torch.randint(0, 2, (batch,), generator=g),
    }
    inputs.update({k: makers[v]() for k, v in labels.items()})
    return inputs


def _outputs_and_grads(model: nn.Module, inputs: dict):
    model.zero_grad()
    out = model(**inputs)
    tensors = [v for v in out.values() if isinstance(v, torch.Tensor)]
    sum(t.float().sum() for t in tensors).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return [t.detach() for t in tensors], grads


def _assert_equivalent(model_cls, config, inputs, cfg):
    torch.manual_seed(0)
    plain = model_cls(config)
    pipelined_model = copy.deepcopy(plain)
    keys_before = list(pipelined_model.state_dict())
    expected_out, expected_grads = _outputs_and_grads(plain, inputs)

    pipelined = to_pipelined(pipelined_model, cfg).parallelize()
    assert list(pipelined_model.state_dict()) == keys_before
    out, grads = _outputs_and_grads(pipelined_model, inputs)
    for a, b in zip(out, expected_out):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    return pipelined


@pytest.mark.parametrize(
    "model_cls,make_config,labels", TEXT_MODELS, ids=lambda x: getattr(x, "__name__", "")
)
def test_pipelined_text_models_match_plain(model_cls, make_config, labels):
    cfg = ipu_cfg(ipus_per_replica=4, layers_per_ipu=[0, 2, 1, 1], embedding_serialization_factor=4,
                  recompute_checkpoint_every_layer=True)  # fmt: skip
    pipelined = _assert_equivalent(model_cls, make_config(), _text_inputs(labels), cfg)
    assert any(isinstance(m, SerializedEmbedding) for m in pipelined.module.modules())


def test_multiple_choice_matches_plain():
    inputs = _text_inputs({"labels": "mc"}, multiple_choice=True)
    _assert_equivalent(
        BertForMultipleChoice, tiny_bert_config(), inputs, ipu_cfg(recompute_checkpoint_every_layer=True)
    )


def test_mpnet_multiple_choice_matches_plain():
    inputs = _text_inputs({"labels": "mc"}, multiple_choice=True)
    cfg = ipu_cfg(recompute_checkpoint_every_layer=True)
    _assert_equivalent(MPNetForMultipleChoice, tiny_mpnet_config(), inputs, cfg)


def test_mpnet_is_placed_as_optimum_graphcore_places_it():
    """Relative position bias with the embeddings on IPU 0, pooler back on IPU 0 (PipelinedMPNetModel),
    the tied masked-LM head on IPU 0 (PipelinedMPNetForMaskedLM), other heads on the last IPU."""
    cfg = ipu_cfg(ipus_per_replica=4, layers_per_ipu=[0, 2, 1, 1])
    base = to_pipelined(MPNetModel(tiny_mpnet_config()), cfg).plan
    assert [(b.name, b.ipu) for b in base.blocks] == [
        ("Embedding", 0), ("Encoder 0", 1), ("Encoder 1", 1), ("Encoder 2", 2), ("Encoder 3", 3), ("Pooler", 0),
    ]  # fmt: skip
    assert base.blocks[0].modules == ("embeddings", "encoder.relative_attention_bias")
    mlm = to_pipelined(MPNetForMaskedLM(tiny_mpnet_config()), cfg).plan
    assert (mlm.blocks[-1].name, mlm.blocks[-1].ipu) == ("LM Head", 0)
    cls = to_pipelined(MPNetForSequenceClassification(tiny_mpnet_config()), cfg).plan
    assert (cls.blocks[-1].name, cls.blocks[-1].ipu) == ("Classifier", 3)


def test_vit_matches_plain():
    inputs = {"pixel_values": torch.randn(3, 3, 32, 32), "labels": torch.tensor([0, 2, 1])}
    pipelined = _assert_equivalent(
        ViTForImageClassification,
        tiny_vit_config(),
        inputs,
        ipu_cfg(ipus_per_replica=4, recompute_checkpoint_every_layer=True),
    )
    assert [b.ipu for b in pipelined.plan.blocks] == [
        0,
        0,
        1,
        2,
        3,
        3,
        3,
    ]  # embedding, 4 layers, layernorm, classifier


def test_deparallelize_restores_original_modules_exactly():
    model = BertForMaskedLM(tiny_bert_config())
    originals = {name: module for name, module in model.named_modules()}
    forward_attrs = {name: "forward" in m.__dict__ for name, m in originals.items()}
    pipelined = to_pipelined(
        model, ipu_cfg(embedding_serialization_factor=2, recompute_checkpoint_every_layer=True)
    )
    pipelined.parallelize()
    assert isinstance(model.bert.embeddings.word_embeddings, SerializedEmbedding)
    assert isinstance(model.cls.predictions.decoder, SerializedLinear)  # tied head serialized alongside
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    pipelined.deparallelize()
    assert {name: module for name, module in model.named_modules()} == originals
    assert {name: "forward" in m.__dict__ for name, m in model.named_modules()} == forward_attrs
    assert not pipelined.is_parallelized


def test_serialized_embedding_keeps_padding_idx_and_rejects_bad_factor():
    emb = nn.Embedding(12, 4, padding_idx=0)
    serialized = SerializedEmbedding(emb, 3)
    ids = torch.tensor([[0, 1, 5, 11, 4, 8]])
    torch.testing.assert_close(serialized(ids), emb(ids))
    serialized(ids).sum().backward()
    assert serialized.weight.grad[0].abs().sum() == 0  # no gradient into the padding row
    assert serialized.padding_idx == 0
    with pytest.raises(
        ValueError, match="cannot be split into 13 pieces: a serialization factor of at most 12"
    ):
        SerializedEmbedding(emb, 13)


def _graph_nodes(tensor: torch.Tensor) -> list[str]:
    seen, stack, names = set(), [tensor.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_a_serialized_table_backward_builds_one_gradient_of_the_table_not_one_per_slice():
    """Computing slice by slice on views of the weight gave each slice a gradient of the whole table's size
    in backward (autograd's slice backward): 8 tables of 50,257 x 768 per GPT-2 micro-batch, which doubled
    its step. The slices' results are those of the whole table, so the layers compute it in one go."""
    emb, head = nn.Embedding(40, 8), nn.Linear(8, 40)
    logits = SerializedLinear(head, 4)(SerializedEmbedding(emb, 4)(torch.tensor([[1, 17, 39]])))
    assert not [name for name in _graph_nodes(logits) if name.startswith(("Slice", "Select", "Index"))]


@pytest.mark.parametrize("factor", [4, 5, 7, 12])
def test_a_vocabulary_the_factor_does_not_divide_is_split_as_the_padded_table_with_plain_results(factor):
    """Optimum Graphcore padded GPT-2's 50,257 rows to 50,260 for factor 4: slices of ceil(rows / factor)
    rows, the last one short. Lookups, logits and gradients equal the plain layers, at the original size."""
    torch.manual_seed(0)
    emb = nn.Embedding(13, 4, padding_idx=12)
    head = nn.Linear(4, 13, bias=True)
    serialized, serialized_head = SerializedEmbedding(emb, factor), SerializedLinear(head, factor)
    slices = [stop - start for start, stop in serialized.pieces]
    assert sum(slices) == 13 and all(n == -(-13 // factor) for n in slices[:-1]) and 0 < slices[-1]
    ids = torch.tensor([[0, 3, 4, 9, 12, 11]])
    torch.testing.assert_close(serialized(ids), emb(ids), rtol=0, atol=0)
    logits = serialized_head(serialized(ids))
    assert logits.shape == (1, 6, 13)
    torch.testing.assert_close(logits, head(emb(ids)), rtol=0, atol=0)
    logits.square().sum().backward()
    grads = emb.weight.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()
    emb.zero_grad(), head.zero_grad()
    head(emb(ids)).square().sum().backward()
    for got, expected in zip(grads, (emb.weight.grad, head.weight.grad, head.bias.grad)):
        torch.testing.assert_close(got, expected)


def test_allocation_table_is_logged_like_optimum_graphcore(caplog):
    model = BertForQuestionAnswering(tiny_bert_config())
    with caplog.at_level(logging.INFO, logger="optimum_ipu.pipelining.pipeline"):
        to_pipelined(model, ipu_cfg(ipus_per_replica=3, layers_per_ipu=[0, 2, 2])).parallelize()
    text = caplog.text
    assert "Device Allocation" in text
    assert "Embedding  --> IPU 0" in text
    assert "Encoder 3  --> IPU 2" in text
    assert "QA Outputs --> IPU 2" in text


def test_layer_count_mismatch_is_a_clear_error():
    model = BertForQuestionAnswering(tiny_bert_config())
    with pytest.raises(ValueError, match="places 6 layers but the model has 4"):
        to_pipelined(model, ipu_cfg(ipus_per_replica=2, layers_per_ipu=[3, 3]))


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids):
        h = self.embed(input_ids)
        for block in self.blocks:
            h = torch.relu(block(h))
        return self.head(h)


def test_unregistered_models_need_force_and_then_use_the_generic_cut():
    with pytest.raises(
        UnsupportedModelError, match=r"Pass force=True \(IPUTrainer: force_to_pipelined=True\)"
    ):
        to_pipelined(_Stack(), ipu_cfg())
    model = _Stack()
    ids = torch.randint(0, 10, (2, 5))
    expected = model(ids)
    pipelined = to_pipelined(model, ipu_cfg(), force=True).parallelize()
    assert [(b.name, b.ipu) for b in pipelined.plan.blocks] == [
        ("Embedding", 0), ("Layer 0", 0), ("Layer 1", 0), ("Layer 2", 1), ("Layer 3", 1), ("Head", 1),
    ]  # fmt: skip
    torch.testing.assert_close(model(ids), expected)


def test_the_earlier_keyword_force_to_pipelined_still_acts_and_says_it_is_renamed():
    with pytest.warns(FutureWarning, match=r"now to_pipelined\(force=\.\.\.\)"):
        pipelined = to_pipelined(_Stack(), ipu_cfg(), force_to_pipelined=True)
    assert [b.ipu for b in pipelined.plan.layer_blocks] == [0, 0, 1, 1]
