"""BART, T5 / MT5 and Whisper placed as Optimum Graphcore placed them, and numerically the plain model;
`split_encoder_decoder_ipu_config` cuts a config as the original did."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures import tiny_bart_config, tiny_t5_config, tiny_whisper_config
from transformers import (
    BartForConditionalGeneration,
    BartForSequenceClassification,
    MT5ForConditionalGeneration,
    T5EncoderModel,
    T5ForConditionalGeneration,
    WhisperForConditionalGeneration,
)

from optimum_ipu import IPUConfig
from optimum_ipu.configuration import IPUConfigError
from optimum_ipu.pipelining import SerializedEmbedding, SerializedLinear, to_pipelined
from optimum_ipu.pipelining.encoder_decoder import split_encoder_decoder_ipu_config
from optimum_ipu.pipelining.placement import PlacementError

MODELS = {
    "bart": lambda: BartForConditionalGeneration(tiny_bart_config(scale_embedding=True)),
    "bart-classification": lambda: BartForSequenceClassification(tiny_bart_config(num_labels=3)),
    "t5": lambda: T5ForConditionalGeneration(tiny_t5_config()),
    "mt5": lambda: MT5ForConditionalGeneration(tiny_t5_config(mt5=True)),
    "t5-encoder": lambda: T5EncoderModel(tiny_t5_config()),
    "whisper": lambda: WhisperForConditionalGeneration(tiny_whisper_config()),
}


def _inputs(key: str, batch: int = 3) -> dict:
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(4, 64, (batch, 5), generator=g)
    labels[1, -1] = -100  # a shorter target
    if key == "whisper":
        return {"input_features": torch.randn(batch, 8, 32, generator=g), "labels": labels}
    ids = torch.randint(4, 64, (batch, 10), generator=g)
    mask = torch.ones_like(ids)
    if key == "bart-classification":  # classifies at the last </s>: every sequence ends with one, unpadded
        ids[:, -1] = 2
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 2, 1])}
    mask[0, -3:] = 0  # one padded source
    if key == "t5-encoder":
        return {"input_ids": ids, "attention_mask": mask}
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _outputs_and_grads(model, inputs):
    model.zero_grad()
    out = model(**inputs)
    tensors = [v for v in out.values() if isinstance(v, torch.Tensor)]
    sum(t.float().sum() for t in tensors).backward()
    return [t.detach() for t in tensors], {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("key", list(MODELS))
def test_pipelined_encoder_decoder_models_match_plain(key):
    """fp32 outputs (loss, logits, encoder states) and every gradient equal the plain model's on 4 IPUs,
    with recomputation and the shared embedding (and the tied head reading it) serialized in 2 pieces."""
    torch.manual_seed(0)
    plain = MODELS[key]()
    model = copy.deepcopy(plain)
    keys = list(plain.state_dict())
    inputs = _inputs(key)
    expected_out, expected_grads = _outputs_and_grads(plain, inputs)

    layers = [1, 1] if key == "t5-encoder" else [1, 1, 1, 1]
    cfg = IPUConfig(ipus_per_replica=len(layers), layers_per_ipu=layers, embedding_serialization_factor=2,
                    recompute_checkpoint_every_layer=True)  # fmt: skip
    pipelined = to_pipelined(model, cfg).parallelize()
    assert list(model.state_dict()) == keys
    serialized = [m for m in model.modules() if isinstance(m, (SerializedEmbedding, SerializedLinear))]
    assert serialized, "the word embedding was not serialized"
    out, grads = _outputs_and_grads(model, inputs)
    assert len(out) == len(expected_out)
    for a, b in zip(out, expected_out):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name in grads:  # rounding only: the serialized head sums its slices' gradients in another order
        scale = expected_grads[name].abs().max().item()
        torch.testing.assert_close(
            grads[name], expected_grads[name], atol=1e-6 * scale + 1e-6, rtol=1e-4, msg=name
        )

    pipelined.deparallelize()
    assert not any(isinstance(m, (SerializedEmbedding, SerializedLinear)) for m in model.modules())
    assert _use_cache(model) == _use_cache(plain)  # recomputation turned the stacks' caches off, and back on


def _use_cache(model) -> list[bool]:
    return [m.config.use_cache for m in model.modules() if hasattr(getattr(m, "config", None), "use_cache")]


def _table(key: str, layers_per_ipu, ipus: int) -> dict[str, int]:
    torch.manual_seed(0)
    model = MODELS[key]()
    plan = to_pipelined(model, IPUConfig(layers_per_ipu=layers_per_ipu, ipus_per_replica=ipus)).plan
    return {b.name: b.ipu for b in plan.blocks}


def test_bart_is_placed_as_optimum_graphcore_placed_it():
    """Embeddings on IPU 0, encoder then decoder layers by layers_per_ipu, the decoder's positions back
    on IPU 0 before the first decoder layer, the LM head tied to the embedding on IPU 0."""
    assert _table("bart", [1, 1, 1, 1], 4) == {
        "Embedding": 0, "Encoder 0": 0, "Encoder 1": 1, "Decoder Embedding": 0, "Decoder 0": 2, "Decoder 1": 3,
        "LM Head": 0,
    }  # fmt: skip
    assert _table("bart-classification", [-1], 2)["Classification Head"] == 1  # a task head on the last IPU


def test_t5_and_mt5_are_placed_as_optimum_graphcore_placed_them():
    """Each stack's final layer norm on the IPU of its last layer; T5's LM head on IPU 0."""
    assert _table("t5", [0, 2, 2, 0], 4) == {
        "Embedding": 0, "Encoder 0": 1, "Encoder 1": 1, "Encoder Stack Final LayerNorm": 1, "Decoder 0": 2,
        "Decoder 1": 2, "Decoder Stack Final LayerNorm": 2, "LM Head": 0,
    }  # fmt: skip
    assert _table("mt5", [0, 2, 2, 0], 4)["LM Head"] == 0  # tied (transformers 5 always ties MT5's)


def test_an_untied_mt5_head_goes_to_the_last_ipu():
    torch.manual_seed(0)
    model = MT5ForConditionalGeneration(tiny_t5_config(mt5=True))
    model.lm_head.weight = torch.nn.Parameter(
        model.lm_head.weight.detach().clone()
    )  # google/mt5-*'s own head
    config = IPUConfig(layers_per_ipu=[0, 2, 2, 0], ipus_per_replica=4, projection_serialization_factor=4)
    pipelined = to_pipelined(model, config)
    assert {b.name: b.ipu for b in pipelined.plan.blocks}["LM Head"] == 3
    pipelined.parallelize()
    assert (
        isinstance(model.lm_head, SerializedLinear) and model.lm_head.factor == 4
    )  # serialized by its own factor
    assert isinstance(model.shared, torch.nn.Embedding)
    pipelined.deparallelize()
    assert type(model.lm_head) is torch.nn.Linear


def test_whisper_is_placed_as_optimum_graphcore_placed_it():
    """Convolutions and positions on IPU 0; the decoder's embedding and the output projection tied to it
    on the IPU of the first decoder layer (Graphcore/whisper-tiny-ipu: [4, 4] puts them on IPU 1)."""
    assert _table("whisper", [1, 1, 1, 1], 4) == {
        "Embedding": 0, "Encoder 0": 0, "Encoder 1": 1, "Encoder Layer Norm": 1, "Decoder Embedding": 2,
        "Decoder 0": 2, "Decoder 1": 3, "Decoder Layer Norm": 3, "Proj Out": 2,
    }  # fmt: skip


def test_layers_per_ipu_that_does_not_add_up_names_both_stacks():
    with pytest.raises(
        PlacementError, match=r"places 3 layers but the model has 4.*encoder's 2 layers, then the decoder's 2"
    ):
        _table("bart", [1, 2], 2)


# -- split_encoder_decoder_ipu_config -----------------------------------------------------------------


def test_split_gives_the_encoder_and_the_decoder_their_ipus():
    config = IPUConfig(layers_per_ipu=[0, 8, 8, 0], ipus_per_replica=4, serialized_embedding_splits_per_ipu=[4, 4, 0, 0],
                       matmul_proportion=[0.1, 0.2, 0.3, 0.4])  # fmt: skip
    encoder, decoder = split_encoder_decoder_ipu_config(config, 8, 8)
    assert (encoder.layers_per_ipu, encoder.ipus_per_replica) == ([0, 8], 2)
    assert (decoder.layers_per_ipu, decoder.ipus_per_replica) == ([8, 0], 2)
    assert (
        encoder.serialized_embedding_splits_per_ipu == [4, 4]
        and decoder.serialized_embedding_splits_per_ipu is None
    )
    assert (encoder.matmul_proportion, decoder.matmul_proportion) == ([0.1, 0.2], [0.3, 0.4])
    assert config.layers_per_ipu == [0, 8, 8, 0]  # the original is left alone

    # Wildcards are resolved first; of the cuts a power of two, the largest (empty IPUs make several).
    encoder, decoder = split_encoder_decoder_ipu_config(
        IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2), 4, 4
    )
    assert (encoder.layers_per_ipu, decoder.layers_per_ipu) == ([4], [4])
    encoder, decoder = split_encoder_decoder_ipu_config(
        IPUConfig(layers_per_ipu=[2, 0, 0, 2], ipus_per_replica=4), 2, 2
    )
    assert (encoder.layers_per_ipu, decoder.layers_per_ipu) == ([2, 0], [0, 2])


def test_split_reads_the_mode_of_the_config():
    config = IPUConfig(layers_per_ipu=[1, 1], ipus_per_replica=2, inference_layers_per_ipu=[1, 1, 1, 1],
                       inference_ipus_per_replica=4)  # fmt: skip
    encoder, decoder = split_encoder_decoder_ipu_config(config.eval(), 2, 2)
    assert (encoder.layers_per_ipu, decoder.layers_per_ipu, encoder.mode) == ([1, 1], [1, 1], "inference")


@pytest.mark.parametrize(
    ("values", "match"),
    [
        (dict(layers_per_ipu=[4], ipus_per_replica=1), "need an IPU each"),
        (dict(layers_per_ipu=[2, 2, 2, 2], ipus_per_replica=4), r"must fill the first 1, 2, 4.*take 3 IPUs"),
        (dict(layers_per_ipu=[3, 3], ipus_per_replica=2), "an IPU holds layers of both"),
        (dict(layers_per_ipu=[2, 2], ipus_per_replica=2, serialized_embedding_splits_per_ipu=[1, 1]),
         r"embedding on the decoder's IPUs \(\[1\]\)"),
        (dict(layers_per_ipu=[2, 2], ipus_per_replica=2, serialized_projection_splits_per_ipu=[1, 1]),
         r"output projection on the encoder's IPUs"),
    ],
)  # fmt: skip
def test_a_config_that_cannot_be_split_says_why(values, match):
    config = IPUConfig(**values)
    encoder_layers = 6 if values["layers_per_ipu"] == [2, 2, 2, 2] else 2
    with pytest.raises(IPUConfigError, match=match):
        split_encoder_decoder_ipu_config(config, encoder_layers, sum(config.layers_per_ipu) - encoder_layers)
