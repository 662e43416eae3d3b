"""The meta-device trace: exact FLOPs and shapes per block, and the caller's model left untouched."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from fixtures import tiny_bert_config, tiny_vit_config
from transformers import BertForQuestionAnswering, GPT2Config, GPT2LMHeadModel, ViTForImageClassification

from optimum_ipu.costmodel.profile import ModelProfile
from optimum_ipu.costmodel.trace import profile_model, sample_inputs_for
from optimum_ipu.pipelining import build_stage_plan, to_pipelined
from optimum_ipu.pipelining.spec import spec_for

BATCH, SEQ = 2, 16  # tiny BERT: hidden 32, 4 heads, intermediate 64, vocab 128


def _qa_inputs(device="meta"):
    long = dict(dtype=torch.long, device=device)
    return {
        "input_ids": torch.zeros(BATCH, SEQ, **long), "attention_mask": torch.ones(BATCH, SEQ, **long),
        "token_type_ids": torch.zeros(BATCH, SEQ, **long), "start_positions": torch.zeros(BATCH, **long),
        "end_positions": torch.zeros(BATCH, **long),
    }  # fmt: skip


@pytest.fixture(scope="module")
def bert():
    with torch.device("meta"):
        model = BertForQuestionAnswering(tiny_bert_config())
    plan = build_stage_plan(model, spec_for(model), [-1], 2)
    return model, plan, profile_model(model, plan, _qa_inputs())


def test_layer_matmuls_have_the_shapes_and_flops_of_the_math(bert):
    _, _, profile = bert
    tokens, hidden, inner, heads = BATCH * SEQ, 32, 64, 4
    layer = profile.block("Encoder 0")
    shapes = sorted((m.batch, m.m, m.k, m.n) for m in layer.matmuls)
    head_dim = hidden // heads
    expected = sorted(
        [(1, tokens, hidden, hidden)] * 4  # q, k, v, attention output
        + [(1, tokens, hidden, inner), (1, tokens, inner, hidden)]  # feed-forward
        + [(BATCH * heads, SEQ, head_dim, SEQ), (BATCH * heads, SEQ, SEQ, head_dim)]  # scores, context
    )
    assert shapes == expected
    matmul_flops = sum(2 * b * m * k * n for b, m, k, n in expected)
    assert matmul_flops <= layer.forward_flops < 1.2 * matmul_flops  # + one FLOP per elementwise output
    assert all(profile.block(f"Encoder {i}").forward_flops == layer.forward_flops for i in range(4))


def test_parameters_are_charged_to_their_blocks_once(bert):
    model, _, profile = bert
    assert profile.parameters == sum(p.numel() for p in model.parameters())
    embedding = profile.block("Embedding")
    assert embedding.word_embedding_parameters == 128 * 32
    assert embedding.embedding_lookups == 1
    assert profile.block("QA Outputs").parameters == 32 * 2 + 2
    assert profile.block("Encoder 1").parameters == sum(
        p.numel() for p in model.bert.encoder.layer[1].parameters()
    )


def test_activations_flow_between_layers_and_are_saved_for_backward(bert):
    _, _, profile = bert
    hidden_bytes = BATCH * SEQ * 32 * 2  # fp16
    flows = {(t.producer, t.consumer): t.bytes for t in profile.transfers if t.floating}
    assert flows[("Encoder 0", "Encoder 1")] == hidden_bytes
    assert flows[("Encoder 3", "QA Outputs")] == hidden_bytes
    assert profile.block("Encoder 2").output_bytes == hidden_bytes
    assert profile.input_bytes == 3 * BATCH * SEQ * 4 + 2 * BATCH * 4  # int32 ids, masks and positions
    assert all(b.saved_bytes > 0 for b in profile.blocks if b.kind == "layer")


def test_inference_saves_nothing_and_fp32_doubles_bytes(bert):
    model, plan, profile = bert
    inference = profile_model(model, plan, _qa_inputs(), training=False)
    assert all(b.saved_bytes == 0 for b in inference.blocks)
    fp32 = profile_model(model, plan, _qa_inputs(), float_bytes=4)
    assert fp32.block("Encoder 0").output_bytes == 2 * profile.block("Encoder 0").output_bytes


def test_real_model_is_not_changed_and_profiles_like_its_meta_twin(bert):
    _, plan, meta_profile = bert
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny_bert_config()).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile = profile_model(model, plan, _qa_inputs(device="cpu"))
    assert not model.training
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert profile.to_dict()["blocks"] == meta_profile.to_dict()["blocks"]


def test_parallelized_model_profiles_like_the_plain_one(bert):
    _, _, plain = bert
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny_bert_config())
    cfg = SimpleNamespace(layers_per_ipu=[-1], ipus_per_replica=2, embedding_serialization_factor=4,
                          serialized_embedding_splits_per_ipu=None, recompute_checkpoint_every_layer=True)  # fmt: skip
    pipelined = to_pipelined(model, cfg).parallelize()
    profile = profile_model(pipelined.module, pipelined.plan, _qa_inputs(device="cpu"))
    assert [(b.name, b.forward_flops, b.saved_bytes) for b in profile.blocks] == [
        (b.name, b.forward_flops, b.saved_bytes) for b in plain.blocks
    ]


def test_vit_patch_embedding_is_a_matmul():
    with torch.device("meta"):
        model = ViTForImageClassification(tiny_vit_config())
    plan = build_stage_plan(model, spec_for(model), [-1], 2)
    profile = profile_model(model, plan, sample_inputs_for(model, micro_batch_size=3))
    patches = (32 // 8) ** 2
    assert (1, 3 * patches, 3 * 8 * 8, 32) in {
        (m.batch, m.m, m.k, m.n) for m in profile.block("Embedding").matmuls
    }


def test_tied_lm_head_reads_the_word_embedding_and_stays_on_ipu_0():
    config = GPT2Config(vocab_size=128, n_embd=32, n_layer=4, n_head=4, bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
    plan = build_stage_plan(model, spec_for(model), [-1], 4)
    profile = profile_model(model, plan, sample_inputs_for(model, 2, seq_len=16))
    head = profile.block("LM Head")
    assert any(m.word_embedding and m.n == 128 for m in head.matmuls)
    assert head.on_first_ipu and head.parameters == 0  # tied: counted with the embedding


@pytest.mark.parametrize("layers,ipus", [([-1], 2), ([0, 2, 1, 1], 4), ([3, 1], 2), ([4], 1)])
def test_placement_follows_build_stage_plan(bert, layers, ipus):
    model, _, profile = bert
    plan = build_stage_plan(model, spec_for(model), layers, ipus)
    assert profile.placement(layers, ipus) == {b.name: b.ipu for b in plan.blocks}


def test_profile_round_trips_through_json(bert):
    _, _, profile = bert
    again = ModelProfile.from_dict(copy.deepcopy(profile.to_dict()))
    assert again == profile


def test_sample_inputs_follow_the_task():
    with torch.device("meta"):
        qa = BertForQuestionAnswering(tiny_bert_config())
        vit = ViTForImageClassification(tiny_vit_config())
    text = sample_inputs_for(qa, 4, seq_len=64)
    assert text["input_ids"].shape == (4, 64) and text["start_positions"].shape == (4,)
    assert "token_type_ids" in text
    image = sample_inputs_for(vit, 2)
    assert image["pixel_values"].shape == (2, 3, 32, 32) and image["labels"].shape == (2,)


def test_a_ctc_speech_model_traces_on_meta_with_its_convolutions_charged_to_their_blocks():
    """A waveform just long enough for 20 frames; each convolution a matmul of the im2col shape
    (frames x kernel*channels x channels); CTC's loss (no meta kernel) traced with static shapes."""
    from fixtures import tiny_speech_config
    from transformers import Wav2Vec2ForCTC

    with torch.device("meta"):
        model = Wav2Vec2ForCTC(tiny_speech_config())  # convolutions (10, 5), (3, 2), (3, 2) of 16 channels
    inputs = sample_inputs_for(model, BATCH, seq_len=20)
    lengths = [83, 41, 20]  # each convolution's output: 20 <- (41 - 1) * 2 + 3 = 83 <- (83 - 1) * 5 + 10
    assert inputs["input_values"].shape == (BATCH, (83 - 1) * 5 + 10)
    assert inputs["labels"].shape == (BATCH, 5)
    plan = build_stage_plan(model, spec_for(model), [4, 3], 2)
    profile = profile_model(model, plan, inputs)
    assert [(m.m, m.k, m.n) for m in profile.block("Conv 0").matmuls] == [(BATCH * lengths[0], 10, 16)]
    assert [(m.m, m.k, m.n) for m in profile.block("Conv 1").matmuls] == [(BATCH * lengths[1], 3 * 16, 16)]
    assert [(m.m, m.k, m.n) for m in profile.block("Conv 2").matmuls][0] == (BATCH * lengths[2], 3 * 16, 16)
    # The feature projection (16 -> 32) rides with the last convolution.
    assert (1, BATCH * 20, 16, 32) in [(m.batch, m.m, m.k, m.n) for m in profile.block("Conv 2").matmuls]
    assert profile.parameters == sum(p.numel() for p in model.parameters())
    assert profile.num_layers == 3 + 1 + 2 + 1  # what layers_per_ipu counts


def test_audio_classification_inputs_have_one_label_per_waveform():
    from fixtures import tiny_speech_config
    from transformers import HubertForSequenceClassification

    with torch.device("meta"):
        model = HubertForSequenceClassification(tiny_speech_config("hubert"))
    inputs = sample_inputs_for(model, BATCH, seq_len=20)
    assert set(inputs) == {"input_values", "labels"} and inputs["labels"].shape == (BATCH,)
    profile = profile_model(model, build_stage_plan(model, spec_for(model), [0, 2], 2), inputs)
    assert [b.name for b in profile.blocks] == [
        "Embedding",
        "Encoder 0",
        "Encoder 1",
        "Projector",
        "Classifier",
    ]


def test_dropout_masks_are_not_saved_for_backward_as_the_ipu_draws_them_again():
    """PopART's DropoutGradOp takes the gradient and the seed, no mask (graphcore/popart, op/dropout.hpp).
    With dropout a layer saves one tensor more than without: the dropped attention probabilities the
    context matmul reads (a tensor of its own now). Its three masks, which PyTorch's autograd keeps,
    are not counted."""
    saved = []
    for p in (0.0, 0.1):
        config = tiny_bert_config(hidden_dropout_prob=p, attention_probs_dropout_prob=p)
        with torch.device("meta"):
            model = BertForQuestionAnswering(config)
        plan = build_stage_plan(model, spec_for(model), [-1], 2)
        saved.append(profile_model(model, plan, _qa_inputs()).block("Encoder 0").saved_bytes)
    dropped_probabilities = BATCH * 4 * SEQ * SEQ * 2  # 4 heads, fp16
    assert saved[1] - saved[0] == dropped_probabilities and saved[0] > 0


def test_an_untied_lm_head_is_a_serializable_projection_and_the_largest_tensors_are_recorded():
    """MT5's LM head is apart from the word embedding: its matmul is a projection (serialized by
    projection_serialization_factor), its weight counted as the projection, and every block records its
    largest trainable tensor other than the table and the projection (off-chip state streams in by tensor)."""
    from fixtures import tiny_t5_config
    from transformers import MT5ForConditionalGeneration

    from optimum_ipu.costmodel.presets import ModelSource, build_meta_model

    config = tiny_t5_config(layers=2, mt5=True).to_dict()
    config["tie_word_embeddings"] = False  # as the checkpoint says; transformers 5 ties MT5 whatever it says
    model = build_meta_model(ModelSource("mt5", config, "MT5ForConditionalGeneration"))
    assert isinstance(model, MT5ForConditionalGeneration) and model.lm_head.weight is not model.shared.weight
    plan = build_stage_plan(model, spec_for(model), [-1], 2)
    inputs = sample_inputs_for(model, BATCH, SEQ)
    profile = profile_model(model, plan, inputs)
    head = profile.block("LM Head")
    assert head.projection_parameters == model.lm_head.weight.numel() == head.parameters
    assert head.largest_trainable_tensor == 0  # its one tensor is the projection
    assert [m.projection for m in head.matmuls] == [True] and not any(m.word_embedding for m in head.matmuls)
    layer = profile.block("Encoder 0")
    largest = max(p.numel() for p in model.encoder.block[0].parameters())
    assert layer.largest_trainable_tensor == largest and layer.projection_parameters == 0
