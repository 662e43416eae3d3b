"""Wav2Vec2 and HuBERT placed as Optimum Graphcore placed them, and numerically the plain model."""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures import tiny_speech_config
from transformers import (
    HubertForCTC,
    HubertForSequenceClassification,
    Wav2Vec2ForCTC,
    Wav2Vec2ForSequenceClassification,
    Wav2Vec2Model,
)

from optimum_ipu import IPUConfig
from optimum_ipu.pipelining import to_pipelined

CLASSES = {
    ("wav2vec2", "ctc"): Wav2Vec2ForCTC,
    ("wav2vec2", "classification"): Wav2Vec2ForSequenceClassification,
    ("hubert", "ctc"): HubertForCTC,
    ("hubert", "classification"): HubertForSequenceClassification,
}


def _inputs(task: str, batch: int = 3, samples: int = 1600) -> dict:
    g = torch.Generator().manual_seed(1)
    attention_mask = torch.ones(batch, samples, dtype=torch.long)
    attention_mask[0, -400:] = 0  # one padded waveform
    inputs = {"input_values": torch.randn(batch, samples, generator=g), "attention_mask": attention_mask}
    if task == "ctc":
        inputs["labels"] = torch.randint(1, 16, (batch, 4), generator=g)
        inputs["labels"][1, -1] = -100  # a shorter transcript
    else:
        inputs["labels"] = torch.randint(0, 3, (batch,), generator=g)
    return inputs


def _outputs_and_grads(model, inputs):
    model.zero_grad()
    out = model(**inputs)
    tensors = [v for v in out.values() if isinstance(v, torch.Tensor)]
    sum(t.float().sum() for t in tensors).backward()
    return [t.detach() for t in tensors], {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("stable", [False, True], ids=["post-norm", "stable-layer-norm"])
@pytest.mark.parametrize("key", list(CLASSES), ids=lambda k: "-".join(k))
def test_pipelined_speech_models_match_plain(key, stable):
    """fp32 outputs (loss, logits) and every gradient equal the plain model's, on 4 IPUs with
    recomputation, for both encoder variants (layer norm before the first layer, or after the last)."""
    model_type, task = key
    config = tiny_speech_config(
        model_type, do_stable_layer_norm=stable, feat_extract_norm="layer" if stable else "group"
    )
    torch.manual_seed(0)
    plain = CLASSES[key](config)
    pipelined_model = copy.deepcopy(plain)
    keys = list(plain.state_dict())
    inputs = _inputs(task)
    expected_out, expected_grads = _outputs_and_grads(plain, inputs)

    layers = (
        [3, 1, 1, 2] if task == "ctc" else [0, 1, 1, 0]
    )  # CTC counts 3 convolutions + position + 2 + head
    cfg = IPUConfig(ipus_per_replica=4, layers_per_ipu=layers, recompute_checkpoint_every_layer=True)
    pipelined = to_pipelined(pipelined_model, cfg).parallelize()
    assert list(pipelined_model.state_dict()) == keys
    out, grads = _outputs_and_grads(pipelined_model, inputs)
    for a, b in zip(out, expected_out):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    pipelined.deparallelize()
    assert all("forward" not in m.__dict__ for m in pipelined_model.modules())


def _placement(model, config_name: str) -> list[tuple[str, int]]:
    plan = to_pipelined(model, IPUConfig.from_pretrained(config_name)).plan
    return [(b.name, b.ipu) for b in plan.blocks]


def test_wav2vec2_ctc_base_config_counts_convolutions_as_optimum_graphcore_did():
    """[9,4,4,4] = 7 convolutions + positional convolution + 12 layers + output projection."""
    model = Wav2Vec2ForCTC(tiny_speech_config(convolutions=7, num_hidden_layers=12))
    placed = _placement(model, "Graphcore/wav2vec2-ctc-base-ipu")
    assert placed[:9] == [(f"Conv {i}", 0) for i in range(7)] + [
        ("Positional Embedding", 0),
        ("Encoder 0", 0),
    ]
    assert placed[9:] == [(f"Encoder {i}", 1 + (i - 1) // 4) for i in range(1, 12)] + [("Project Hidden", 3)]
    plan = to_pipelined(model, IPUConfig.from_pretrained("Graphcore/wav2vec2-ctc-base-ipu")).plan
    # Modules without a block of their own run where the block before them ran.
    assert plan.blocks[6].modules[-1] == "wav2vec2.feature_projection"
    assert plan.blocks[7].modules == ("wav2vec2.encoder.pos_conv_embed", "wav2vec2.encoder.layer_norm")


def test_wav2vec2_ctc_large_config_puts_the_last_convolutions_on_ipu_1():
    """[4,5,3,4,4,4,4,5] over 33 units: convolutions 4-6 share IPU 1 with the positional convolution;
    the stable-layer-norm encoder's final norm runs after the last layer, on the last IPU."""
    config = tiny_speech_config(
        convolutions=7, num_hidden_layers=24, do_stable_layer_norm=True, feat_extract_norm="layer"
    )
    placed = dict(_placement(Wav2Vec2ForCTC(config), "Graphcore/wav2vec2-ctc-large-ipu"))
    assert [placed[f"Conv {i}"] for i in range(7)] == [0, 0, 0, 0, 1, 1, 1]
    assert placed["Positional Embedding"] == placed["Encoder 0"] == 1
    assert (placed["Encoder 23"], placed["Layer Norm"], placed["Project Hidden"]) == (7, 7, 7)


@pytest.mark.parametrize("model_cls,model_type", [(HubertForSequenceClassification, "hubert"),
                                                  (Wav2Vec2ForSequenceClassification, "wav2vec2")])  # fmt: skip
def test_audio_classification_keeps_the_feature_encoder_on_ipu_0(model_cls, model_type):
    """Graphcore/hubert-base-ipu ([0,4,4,4]) counts only the 12 transformer layers."""
    model = model_cls(tiny_speech_config(model_type, num_hidden_layers=12))
    placed = _placement(model, "Graphcore/hubert-base-ipu")
    assert placed[0] == ("Embedding", 0)
    assert [ipu for name, ipu in placed if name.startswith("Encoder")] == [1] * 4 + [2] * 4 + [3] * 4
    assert placed[-2:] == [("Projector", 3), ("Classifier", 3)]
    front = to_pipelined(model, IPUConfig.from_pretrained("Graphcore/hubert-base-ipu")).plan.blocks[0].modules
    assert front == tuple(f"{model_type}.{p}" for p in ("feature_extractor", "feature_projection",
                                                       "encoder.pos_conv_embed", "encoder.layer_norm"))  # fmt: skip


def test_a_base_speech_model_is_placed_like_the_classification_layout():
    plan = to_pipelined(
        Wav2Vec2Model(tiny_speech_config()), IPUConfig(ipus_per_replica=2, layers_per_ipu=[1, 1])
    ).plan
    assert [(b.name, b.ipu) for b in plan.blocks] == [("Embedding", 0), ("Encoder 0", 0), ("Encoder 1", 1)]


def test_wav2vec2_pretraining_counts_its_three_heads_and_matches_plain():
    """PipelinedWav2Vec2ForPreTraining's units: convolutions, positional convolution, layers, then
    Project Hidden, Quantizer, Project Quantizer. Compared in eval mode: training draws Gumbel noise."""
    from transformers import Wav2Vec2ForPreTraining
    from transformers.models.wav2vec2.modeling_wav2vec2 import _compute_mask_indices, _sample_negative_indices

    config = tiny_speech_config(num_codevector_groups=2, num_codevectors_per_group=8, codevector_dim=16,
                                proj_codevector_dim=16, num_negatives=4, mask_time_prob=0.05)  # fmt: skip
    torch.manual_seed(0)
    plain = Wav2Vec2ForPreTraining(config).eval()
    pipelined_model = copy.deepcopy(plain)
    values = torch.randn(2, 1600, generator=torch.Generator().manual_seed(2))
    frames = int(plain._get_feat_extract_output_lengths(1600))
    mask = _compute_mask_indices((2, frames), mask_prob=0.3, mask_length=2, min_masks=2)
    negatives = _sample_negative_indices((2, frames), 4, mask_time_indices=mask)
    inputs = {"input_values": values, "mask_time_indices": torch.tensor(mask),
              "sampled_negative_indices": torch.tensor(negatives)}  # fmt: skip
    expected_out, expected_grads = _outputs_and_grads(plain, inputs)

    cfg = IPUConfig(ipus_per_replica=2, layers_per_ipu=[4, 5], recompute_checkpoint_every_layer=True)
    pipelined = to_pipelined(pipelined_model, cfg).parallelize()
    assert [(b.name, b.ipu) for b in pipelined.plan.blocks][-4:] == [
        ("Encoder 1", 1), ("Project Hidden", 1), ("Quantizer", 1), ("Project Quantizer", 1),
    ]  # fmt: skip
    out, grads = _outputs_and_grads(pipelined_model, inputs)
    for a, b in zip(out, expected_out):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)
