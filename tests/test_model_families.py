"""Each bundled config's model family trains with IPUTrainer: fp32 equal to transformers' Trainer on the
same effective batch (SGD, so weights agree to rounding), and a resume that reproduces the run."""

from __future__ import annotations

import pytest
import torch
import transformers
from fixtures import (
    PatternClassification,
    SyntheticAudio,
    SyntheticSeq2Seq,
    tiny_bart_config,
    tiny_mpnet_config,
    tiny_speech_config,
    tiny_t5_config,
    tiny_whisper_config,
)
from transformers import (
    BartForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2TokenizerFast,
    HubertForSequenceClassification,
    MPNetForSequenceClassification,
    MT5ForConditionalGeneration,
    T5ForConditionalGeneration,
    Trainer,
    TrainingArguments,
    Wav2Vec2ForCTC,
    WhisperForConditionalGeneration,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from optimum.graphcore import pipeline
from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments


def _args(folder, **kwargs) -> IPUTrainingArguments:
    values = dict(
        output_dir=str(folder), per_device_train_batch_size=1, learning_rate=0.05, num_train_epochs=1,
        logging_steps=1, save_strategy="no", report_to="none", seed=7, dataloader_num_workers=0, use_cpu=True,
        fp32=True, optim="sgd",
    )  # fmt: skip
    values.update(kwargs)
    return IPUTrainingArguments(**values)


def _bundled(name: str, **overrides) -> IPUConfig:
    """A bundled config at test scale: its layout kept, the accumulation and replicas made small."""
    values = dict(gradient_accumulation_steps=8, replication_factor=1, inference_replication_factor=1)
    values.update(overrides)
    return IPUConfig.from_pretrained(name, **values)


def _losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def _assert_trains_like_plain_trainer(make_model, ipu_config, data, tmp_path, collator=None, batch=8):
    plain_model, ipu_model = make_model(), make_model()
    plain_args = TrainingArguments(
        output_dir=str(tmp_path / "plain"), per_device_train_batch_size=batch, learning_rate=0.05, num_train_epochs=1,
        save_strategy="no", report_to="none", seed=7, use_cpu=True, logging_steps=1, optim="sgd",
    )  # fmt: skip
    plain = Trainer(plain_model, plain_args, train_dataset=data, data_collator=collator)
    plain.train()
    trainer = IPUTrainer(
        ipu_model, ipu_config, _args(tmp_path / "ipu"), train_dataset=data, data_collator=collator
    )
    trainer.train()
    assert trainer.state.global_step == len(data) // batch
    torch.testing.assert_close(_losses(trainer), _losses(plain), atol=1e-5, rtol=1e-5)
    for (name, a), (_, b) in zip(plain_model.named_parameters(), ipu_model.named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    return trainer


def _assert_resume_reproduces_the_run(make_model, ipu_config, data, tmp_path, collator=None):
    def trainer():
        args = _args(tmp_path / "run", save_strategy="steps", save_steps=2, num_train_epochs=2)
        return IPUTrainer(make_model(), ipu_config, args, train_dataset=data, data_collator=collator)

    full = trainer()
    full.train()
    resumed = trainer()
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert resumed.state.global_step == full.state.global_step > 2
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name


# -- MPNet: Graphcore/mpnet-base-ipu ([0, 4, 4, 4]) ---------------------------------------------------


def _mpnet():
    torch.manual_seed(0)
    return MPNetForSequenceClassification(tiny_mpnet_config(num_hidden_layers=12))


@pytest.fixture
def mpnet_ipu_config():
    return _bundled("Graphcore/mpnet-base-ipu")


def test_mpnet_with_its_bundled_config_trains_like_plain_transformers(tmp_path, mpnet_ipu_config):
    trainer = _assert_trains_like_plain_trainer(_mpnet, mpnet_ipu_config, PatternClassification(32), tmp_path)
    assert trainer._pipelined.plan.layers_per_ipu() == [0, 4, 4, 4]


def test_mpnet_resume_reproduces_the_uninterrupted_run(tmp_path, mpnet_ipu_config):
    _assert_resume_reproduces_the_run(_mpnet, mpnet_ipu_config, PatternClassification(32), tmp_path)


# -- DeBERTa: placed as Optimum Graphcore's PipelinedDeberta* ([0, 4, 4, 4] as its BERT-base layouts) ----


def _deberta(v2: bool):
    from transformers import (
        DebertaConfig,
        DebertaForSequenceClassification,
        DebertaV2Config,
        DebertaV2ForSequenceClassification,
    )

    torch.manual_seed(0)
    sizes = dict(vocab_size=128, hidden_size=32, num_hidden_layers=12, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                 relative_attention=True, position_buckets=8, pooler_dropout=0.0)  # fmt: skip
    if v2:  # deberta-v3's layout: normed relative embeddings and a convolution after the first layer
        config = DebertaV2Config(**sizes, norm_rel_ebd="layer_norm", conv_kernel_size=3, share_att_key=True,
                                 pos_att_type=["p2c", "c2p"])  # fmt: skip
        return DebertaV2ForSequenceClassification(config)
    return DebertaForSequenceClassification(DebertaConfig(**sizes, pos_att_type=["c2p", "p2c"]))


@pytest.mark.parametrize("v2", [False, True], ids=["deberta", "deberta-v2"])
def test_deberta_trains_like_plain_transformers(tmp_path, v2):
    config = IPUConfig(layers_per_ipu=[0, 4, 4, 4], ipus_per_replica=4, gradient_accumulation_steps=8)
    trainer = _assert_trains_like_plain_trainer(
        lambda: _deberta(v2), config, PatternClassification(32), tmp_path
    )
    plan = trainer._pipelined.plan
    assert plan.layers_per_ipu() == [0, 4, 4, 4]
    embedding = plan.blocks[0]
    assert embedding.ipu == 0 and "deberta.encoder.rel_embeddings" in embedding.modules
    assert ("deberta.encoder.conv" in plan.blocks[1].modules) is v2  # runs after the first layer, in its block


# -- Speech: Graphcore/wav2vec2-ctc-base-ipu, wav2vec2-ctc-large-ipu, hubert-base-ipu ------------------


def _wav2vec2_ctc(large: bool = False):
    torch.manual_seed(0)
    if large:  # the stable-layer-norm encoder of wav2vec2-large-lv60 and its fine-tunes
        config = tiny_speech_config(convolutions=7, num_hidden_layers=24, do_stable_layer_norm=True,
                                    feat_extract_norm="layer")  # fmt: skip
    else:
        config = tiny_speech_config(convolutions=7, num_hidden_layers=12)
    return Wav2Vec2ForCTC(config)


def _hubert_classifier():
    torch.manual_seed(0)
    return HubertForSequenceClassification(tiny_speech_config("hubert", num_hidden_layers=12))


def test_wav2vec2_ctc_base_config_trains_like_plain_transformers(tmp_path):
    data = SyntheticAudio(24, samples=3200)
    config = _bundled("Graphcore/wav2vec2-ctc-base-ipu")
    trainer = _assert_trains_like_plain_trainer(_wav2vec2_ctc, config, data, tmp_path)
    assert trainer._pipelined.plan.layers_per_ipu() == [9, 4, 4, 4]


def test_wav2vec2_ctc_large_config_trains_like_plain_transformers(tmp_path):
    """8 IPUs: the pipeline needs gradient accumulation >= 15, so 16 micro-batches of 1 per step."""
    data = SyntheticAudio(32, samples=3200)
    config = _bundled("Graphcore/wav2vec2-ctc-large-ipu", gradient_accumulation_steps=16)
    trainer = _assert_trains_like_plain_trainer(
        lambda: _wav2vec2_ctc(large=True), config, data, tmp_path, batch=16
    )
    assert trainer._pipelined.plan.layers_per_ipu() == [4, 5, 3, 4, 4, 4, 4, 5]


def test_wav2vec2_ctc_resume_reproduces_the_uninterrupted_run(tmp_path):
    config = _bundled("Graphcore/wav2vec2-ctc-base-ipu")
    _assert_resume_reproduces_the_run(_wav2vec2_ctc, config, SyntheticAudio(24, samples=3200), tmp_path)


def test_hubert_audio_classification_trains_like_plain_transformers(tmp_path):
    data = SyntheticAudio(24, task="classification")
    trainer = _assert_trains_like_plain_trainer(
        _hubert_classifier, _bundled("Graphcore/hubert-base-ipu"), data, tmp_path
    )
    assert trainer._pipelined.plan.layers_per_ipu() == [0, 4, 4, 4]


def test_hubert_audio_classification_resume_reproduces_the_uninterrupted_run(tmp_path):
    data = SyntheticAudio(24, task="classification")
    _assert_resume_reproduces_the_run(
        _hubert_classifier, _bundled("Graphcore/hubert-base-ipu"), data, tmp_path
    )


# -- Encoder-decoder: BART, T5 and Graphcore/mt5-small-ipu ([0, 8, 8, 0]) ------------------------------


def _bart():
    torch.manual_seed(0)
    return BartForConditionalGeneration(tiny_bart_config())


def _t5():
    torch.manual_seed(0)
    return T5ForConditionalGeneration(tiny_t5_config())


def _mt5():
    torch.manual_seed(0)
    return MT5ForConditionalGeneration(tiny_t5_config(layers=8, mt5=True))


def test_bart_trains_like_plain_transformers(tmp_path):
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=8)
    trainer = _assert_trains_like_plain_trainer(_bart, config, SyntheticSeq2Seq(32, eos=2), tmp_path)
    assert trainer._pipelined.plan.layers_per_ipu() == [2, 2]  # encoder on IPU 0, decoder on IPU 1


def test_t5_trains_like_plain_transformers(tmp_path):
    config = IPUConfig(layers_per_ipu=[1, 1, 1, 1], ipus_per_replica=4, gradient_accumulation_steps=16)
    _assert_trains_like_plain_trainer(_t5, config, SyntheticSeq2Seq(32, eos=1), tmp_path, batch=16)


def test_mt5_with_its_bundled_config_trains_like_plain_transformers(tmp_path):
    """Its tied LM head back on IPU 0 makes a 5th pipeline stage: GA >= 9, so 16 micro-batches a step."""
    config = _bundled("Graphcore/mt5-small-ipu", gradient_accumulation_steps=16, device_iterations=1)
    trainer = _assert_trains_like_plain_trainer(_mt5, config, SyntheticSeq2Seq(32, eos=1), tmp_path, batch=16)
    assert trainer._pipelined.plan.layers_per_ipu() == [0, 8, 8, 0]


def test_mt5_resume_reproduces_the_uninterrupted_run(tmp_path):
    config = _bundled("Graphcore/mt5-small-ipu", gradient_accumulation_steps=16, device_iterations=1)
    _assert_resume_reproduces_the_run(_mt5, config, SyntheticSeq2Seq(64, eos=1), tmp_path)


def test_bart_resume_reproduces_the_uninterrupted_run(tmp_path):
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=8)
    _assert_resume_reproduces_the_run(_bart, config, SyntheticSeq2Seq(32, eos=2), tmp_path)


# -- Whisper: Graphcore/whisper-tiny-ipu ([4, 4]) -----------------------------------------------------


def _whisper():
    torch.manual_seed(0)
    return WhisperForConditionalGeneration(tiny_whisper_config(layers=4))


def _log_mel(n: int) -> SyntheticSeq2Seq:
    return SyntheticSeq2Seq(n, eos=3, features=(8, 32))  # 8 mel bins x 32 frames of random "log-mel"


def test_whisper_with_its_bundled_config_trains_like_plain_transformers(tmp_path):
    """4 encoder layers on IPU 0, 4 decoder layers (and the decoder embedding, the tied projection) on IPU 1."""
    config = _bundled("Graphcore/whisper-tiny-ipu")
    trainer = _assert_trains_like_plain_trainer(_whisper, config, _log_mel(32), tmp_path)
    assert trainer._pipelined.plan.layers_per_ipu() == [4, 4]
    assert trainer._pipelined.plan.ipu_of_module("proj_out") == 1


def test_whisper_resume_reproduces_the_uninterrupted_run(tmp_path):
    _assert_resume_reproduces_the_run(
        _whisper, _bundled("Graphcore/whisper-tiny-ipu"), _log_mel(32), tmp_path
    )


# -- GPT-2: Graphcore/gpt2-small-ipu ([0, 4, 4, 4], embedding_serialization_factor 4) ---------------------
# GPT-2's real vocabulary (50,257) is not a multiple of 4; Optimum Graphcore padded it to 50,260. A
# byte-level vocabulary of 257 (256 bytes and end-of-text) keeps that property at test scale.

GPT2_VOCABULARY = 257


def _gpt2():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=GPT2_VOCABULARY, n_positions=32, n_embd=16, n_layer=12, n_head=2,
                        bos_token_id=GPT2_VOCABULARY - 1, eos_token_id=GPT2_VOCABULARY - 1, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    return GPT2LMHeadModel(config)


class CausalText:
    """Random token sequences; labels = inputs (the model shifts them) with the first one -100.

    The first label is never predicted (the model drops it when it shifts); -100 there keeps transformers'
    Trainer exact as the reference: for GPT-2 (whose `loss_type` is None in transformers 5.24) it
    divides the summed loss by the unshifted label count, every label not -100, not the shifted one.
    """

    def __init__(self, n: int, length: int = 12, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, GPT2_VOCABULARY, (n, length), generator=g)
        self.labels = self.ids.clone()
        self.labels[:, 0] = -100

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def test_gpt2_with_an_unsplittable_vocabulary_trains_like_plain_transformers(tmp_path):
    """Optimum Graphcore padded the vocabulary to the next multiple of the factor; training equals plain
    transformers, and the weights saved have the original vocabulary and load into plain transformers."""
    # The tied LM head back on IPU 0 is a 5th pipeline stage: GA >= 9, so its own 16 micro-batches a step.
    config = _bundled("Graphcore/gpt2-small-ipu", gradient_accumulation_steps=16, device_iterations=1)
    assert config.embedding_serialization_factor == 4 and GPT2_VOCABULARY % 4
    trainer = _assert_trains_like_plain_trainer(_gpt2, config, CausalText(32), tmp_path, batch=16)
    assert trainer._pipelined.plan.layers_per_ipu() == [0, 4, 4, 4]
    trainer.save_model(str(tmp_path / "saved"))
    saved = GPT2LMHeadModel.from_pretrained(str(tmp_path / "saved"))
    assert saved.config.vocab_size == GPT2_VOCABULARY
    assert saved.transformer.wte.weight.shape == (GPT2_VOCABULARY, 16)
    torch.testing.assert_close(saved.transformer.wte.weight, trainer.model.transformer.wte.weight)


def test_gpt2_evaluation_and_generation_with_a_padded_vocabulary_equal_plain_transformers(tmp_path):
    """Logits of the original vocabulary size, transformers' eval loss, and the same greedy tokens."""
    data = CausalText(10)
    plain_model, ipu_model = _gpt2().eval(), _gpt2()
    args = _args(tmp_path, per_device_eval_batch_size=1)
    trainer = IPUTrainer(ipu_model, _bundled("Graphcore/gpt2-small-ipu"), args, eval_dataset=data)
    output = trainer.predict(data)
    assert output.predictions.shape == (10, 12, GPT2_VOCABULARY)
    with torch.no_grad():
        expected = plain_model(input_ids=data.ids, labels=data.labels)
    torch.testing.assert_close(torch.as_tensor(output.predictions), expected.logits, atol=1e-5, rtol=1e-5)
    assert output.metrics["test_loss"] == pytest.approx(expected.loss.item(), rel=1e-5)

    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = GPT2TokenizerFast(vocab=vocab, merges=[])
    generator = pipeline("text-generation", model=_gpt2().eval(), tokenizer=tokenizer,
                         ipu_config="Graphcore/gpt2-small-ipu", fp16=False)  # fmt: skip
    plain = transformers.pipeline("text-generation", model=plain_model, tokenizer=tokenizer, device="cpu")
    expected = plain("alice was born in", max_new_tokens=8, do_sample=False)
    assert generator("alice was born in", max_new_tokens=8, do_sample=False) == expected
    assert generator.ipu.compiled is not None  # the answer came from the placed model
