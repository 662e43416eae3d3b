"""IPUTrainer end to end on tiny models: equivalence with transformers' Trainer, fp16 training,
checkpoints that plain transformers loads, resume, and the errors users meet."""

from __future__ import annotations

import contextlib
import json
import logging
import os

import numpy as np
import pytest
import torch
from fixtures import PatternQA, tiny_bert_config, tiny_tokenizer
from transformers import AutoModelForQuestionAnswering, BertForQuestionAnswering, Trainer, TrainingArguments

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments

SEQ = 16


def tiny_qa(layers=4, seed=0):
    torch.manual_seed(seed)
    return BertForQuestionAnswering(tiny_bert_config(num_hidden_layers=layers))


def ipu_args(tmp_path, **kwargs):
    values = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, per_device_eval_batch_size=2,
        learning_rate=1e-3, num_train_epochs=1, logging_steps=1, save_strategy="no", report_to="none",
        seed=7, dataloader_num_workers=0, use_cpu=True,
    )  # fmt: skip
    values.update(kwargs)
    return IPUTrainingArguments(**values)


def two_ipu_config(**kwargs):
    return IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=4, **kwargs)


def _train_losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize("optim", ["sgd", "adamw_torch"])
def test_fp32_training_matches_plain_trainer_on_the_same_effective_batch(tmp_path, optim):
    """micro-batch 2 x GA 4 on a 2-IPU pipeline == transformers at batch 8, with clipping honoured.

    With SGD the update is linear in the gradient, so weights must agree to float rounding. Adam divides
    by sqrt(v): for parameters whose gradient is ~0 (the QA head bias) rounding noise becomes a full
    `lr`-sized step, so there the losses and the bulk of the weights are compared instead.
    """
    data = PatternQA(48)
    plain_model, ipu_model = tiny_qa(), tiny_qa()
    plain_args = TrainingArguments(
        output_dir=str(tmp_path / "plain"), per_device_train_batch_size=8, learning_rate=1e-3, num_train_epochs=1,
        save_strategy="no", report_to="none", seed=7, max_grad_norm=0.5, use_cpu=True, logging_steps=1, optim=optim,
    )  # fmt: skip
    plain = Trainer(plain_model, plain_args, train_dataset=data)
    plain.train()

    args = ipu_args(tmp_path, fp32=True, max_grad_norm=0.5, optim=optim)
    trainer = IPUTrainer(ipu_model, two_ipu_config(), args, train_dataset=data)
    result = trainer.train()
    assert result.global_step == 6  # one step per combined batch of 8
    torch.testing.assert_close(_train_losses(trainer), _train_losses(plain), atol=1e-5, rtol=1e-5)
    if optim == "sgd":
        for (name, a), (_, b) in zip(plain_model.named_parameters(), ipu_model.named_parameters()):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    else:
        flat = lambda m: torch.cat([p.detach().flatten() for p in m.parameters()])  # noqa: E731
        a, b = flat(plain_model), flat(ipu_model)
        assert (a - b).abs().max() < 2 * 6 * 1e-3  # never more than the steps' total learning rate
        assert ((a - b).abs() < 1e-5).float().mean() > 0.999


@pytest.mark.parametrize("fp32", [False, True], ids=["fp16", "fp32"])
def test_tiny_bert_qa_learns_with_bert_base_ipu_and_pod16(tmp_path, fp32):
    """Graphcore/bert-base-ipu ([0,4,4,4], GA 16) on pod16 (4 replicas), loss scaling 64."""
    args = ipu_args(
        tmp_path, pod_type="pod16", ipu_config_name="Graphcore/bert-base-ipu", loss_scaling=64.0, fp32=fp32,
        per_device_train_batch_size=1, learning_rate=3e-3, num_train_epochs=8, warmup_steps=0,
        ipu_config_overrides="embedding_serialization_factor=2",
    )  # fmt: skip
    model = tiny_qa(layers=12)
    trainer = IPUTrainer(model, args=args, train_dataset=PatternQA(128))
    cfg = trainer.ipu_config
    assert (cfg.replication_factor, cfg.gradient_accumulation_steps, cfg.embedding_serialization_factor) == (
        4,
        16,
        2,
    )
    assert trainer._train_batch_size == 64
    assert model.dtype == (torch.float32 if fp32 else torch.float16)
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 16
    assert sum(losses[-3:]) / 3 < 0.75 * sum(losses[:3]) / 3, losses
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_checkpoint_loads_in_plain_transformers_and_resume_reproduces_the_run(tmp_path):
    data = PatternQA(64)
    tokenizer = tiny_tokenizer(tmp_path / "tok")

    full = IPUTrainer(tiny_qa(), two_ipu_config(), ipu_args(tmp_path / "a", fp32=True, save_strategy="steps", save_steps=4),
                      train_dataset=data, processing_class=tokenizer)  # fmt: skip
    full.train()
    checkpoint = tmp_path / "a" / "out" / "checkpoint-4"
    names = set(os.listdir(checkpoint))
    assert {"model.safetensors", "config.json", "ipu_config.json", "optimizer.pt", "scheduler.pt",
            "trainer_state.json", "tokenizer.json"} <= names, names  # fmt: skip
    assert any(n.startswith("rng_state") for n in names)
    assert json.loads((checkpoint / "ipu_config.json").read_text())["gradient_accumulation_steps"] == 4

    resumed = IPUTrainer(
        tiny_qa(seed=99), two_ipu_config(), ipu_args(tmp_path / "a", fp32=True), train_dataset=data
    )
    resumed.train(resume_from_checkpoint=str(checkpoint))
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name  # bit for bit, as the README says

    full.save_model(str(tmp_path / "final"))
    plain = AutoModelForQuestionAnswering.from_pretrained(str(tmp_path / "final"))
    batch = {k: torch.stack([data[i][k] for i in range(4)]) for k in ("input_ids", "attention_mask")}
    full.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(**batch).start_logits, full.model(**batch).start_logits)


def test_fp16_checkpoint_loads_in_plain_transformers(tmp_path):
    trainer = IPUTrainer(tiny_qa(), two_ipu_config(embedding_serialization_factor=2), ipu_args(tmp_path),
                         train_dataset=PatternQA(16))  # fmt: skip
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    plain = AutoModelForQuestionAnswering.from_pretrained(str(tmp_path / "final"), dtype=torch.float32)
    assert set(plain.state_dict()) == set(tiny_qa().state_dict())
    for name, p in plain.named_parameters():
        torch.testing.assert_close(p, trainer.model.get_parameter(name).float(), msg=name)


def test_evaluation_keeps_the_short_last_batch_and_pads_when_asked(tmp_path):
    data = PatternQA(13)
    for pad in (False, True):
        trainer = IPUTrainer(tiny_qa(), two_ipu_config(inference_device_iterations=2),
                             ipu_args(tmp_path, pad_on_batch_axis=pad), eval_dataset=data)  # fmt: skip
        loader = trainer.get_eval_dataloader()
        assert [len(b["input_ids"]) for b in loader] == [
            4,
            4,
            4,
            1,
        ]  # micro-batch 2 x inference DI 2, short tail kept
        prediction = trainer.predict(data)
        assert prediction.predictions[0].shape == (13, SEQ)
        assert prediction.predictions[0].dtype.name == "float32"
        assert "test_loss" in prediction.metrics


def test_evaluate_returns_the_metrics_transformers_trainer_returns_epoch_included(tmp_path):
    """transformers' log() adds `epoch` to the metrics evaluate() returns (example scripts save them)."""
    data = PatternQA(16)
    plain_args = TrainingArguments(output_dir=str(tmp_path / "plain"), per_device_train_batch_size=8,
                                   per_device_eval_batch_size=2, num_train_epochs=1, save_strategy="no",
                                   report_to="none", use_cpu=True)  # fmt: skip
    plain = Trainer(tiny_qa(), plain_args, train_dataset=data, eval_dataset=data)
    plain.train()
    trainer = IPUTrainer(tiny_qa(), two_ipu_config(), ipu_args(tmp_path, fp32=True), train_dataset=data,
                         eval_dataset=data)  # fmt: skip
    trainer.train()
    expected, got = plain.evaluate(), trainer.evaluate()
    assert set(got) == set(expected) and got["epoch"] == expected["epoch"] == 1.0
    assert "ipu_estimated_samples_per_second" in trainer.state.log_history[-1]  # logged, not returned


def test_eval_loss_of_a_model_returning_a_tuple_is_the_mean_over_the_calls_micro_batches(tmp_path):
    """A model returning a tuple (`return_dict=False`, a user's own `(loss,)`) gives transformers' Trainer
    its loss first; with 2 device iterations each call has 2 micro-batches, and their losses are averaged
    (the first one's alone was taken)."""
    data = PatternQA(16)
    expected = Trainer(tiny_qa(), TrainingArguments(output_dir=str(tmp_path / "plain"), per_device_eval_batch_size=2,
                                                    report_to="none", use_cpu=True), eval_dataset=data).evaluate()  # fmt: skip
    model = tiny_qa()
    model.config.return_dict = False
    trainer = IPUTrainer(model, two_ipu_config(inference_device_iterations=2), ipu_args(tmp_path, fp32=True),
                         eval_dataset=data)  # fmt: skip
    assert trainer.evaluate()["eval_loss"] == pytest.approx(expected["eval_loss"], rel=1e-6)


def test_dataset_smaller_than_one_combined_batch_is_a_clear_error(tmp_path):
    trainer = IPUTrainer(tiny_qa(), two_ipu_config(), ipu_args(tmp_path), train_dataset=PatternQA(5))
    with pytest.raises(
        ValueError, match=r"5 samples, fewer than one combined batch of 8 .*micro-batch 2 x gradient"
    ):
        trainer.train()


def test_pipeline_too_short_for_its_stages_fails_at_compile(tmp_path):
    cfg = IPUConfig(layers_per_ipu=[1, 1, 1, 1], ipus_per_replica=4, gradient_accumulation_steps=4)
    trainer = IPUTrainer(tiny_qa(), cfg, ipu_args(tmp_path), train_dataset=PatternQA(16))
    with pytest.raises(ValueError, match="number of pipeline stages"):
        trainer.train()


def test_a_tied_head_back_on_ipu_0_is_one_more_stage_to_fill(tmp_path):
    """PopART asks GA >= the pipeline's stages, forward and backward: 2S−1 for S forward stages. A masked
    LM head tied to the word embedding runs on IPU 0 after the last layer, so 2 IPUs make S = 3 and
    GA 3 (enough without the head) is refused while GA 5 compiles."""
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    ids = torch.randint(1, 128, (40, SEQ))
    data = [{"input_ids": x, "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": x} for x in ids]
    for ga, error in ((3, r"2S−1 = 5 for S = 3 forward stages"), (5, None)):
        cfg = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2, gradient_accumulation_steps=ga)
        trainer = IPUTrainer(BertForMaskedLM(tiny_bert_config()), cfg, ipu_args(tmp_path / str(ga), max_steps=1),
                             train_dataset=data)  # fmt: skip
        if error:
            with pytest.raises(ValueError, match=error):
                trainer.train()
        else:
            trainer.train()


def test_lamb_and_the_legacy_tokenizer_keyword(tmp_path):
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    trainer = IPUTrainer(tiny_qa(), two_ipu_config(), ipu_args(tmp_path, lamb=True), train_dataset=PatternQA(16),
                         tokenizer=tokenizer)  # fmt: skip
    assert trainer.processing_class is tokenizer
    trainer.train()
    assert (
        type(
            trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
        ).__name__
        == "LAMB"
    )


def test_plain_training_arguments_are_rejected_with_the_fix(tmp_path):
    with pytest.raises(TypeError, match="IPUTrainingArguments"):
        IPUTrainer(tiny_qa(), two_ipu_config(), TrainingArguments(output_dir=str(tmp_path)))


def test_the_executable_cache_tells_a_tied_head_from_an_untied_one(tmp_path):
    """Tying changes no module and no config value, but the table's memory: an untied head must not
    load the tied model's trace (it priced the table twice, as a stale trace did on RoBERTa's MLM)."""
    from transformers import BertForMaskedLM

    weights = []
    for tied in (False, True):
        torch.manual_seed(0)
        model = BertForMaskedLM(tiny_bert_config())
        if not tied:
            model.cls.predictions.decoder.weight = torch.nn.Parameter(
                model.cls.predictions.decoder.weight.clone()
            )
        cfg = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=8,
                        executable_cache_dir=str(tmp_path / "exe_cache"))  # fmt: skip
        data = [{"input_ids": torch.arange(10, 26), "labels": torch.arange(10, 26)}] * 16
        trainer = IPUTrainer(model, cfg, ipu_args(tmp_path, compile_only=True), train_dataset=data)
        trainer.train()
        assert not trainer.compile_report.from_cache
        weights.append(sum(m.weights for m in trainer.compile_report.memory.ipus))
    assert weights[0] - weights[1] == 128 * 32 * 2  # the untied head's own table, in fp16


def test_executable_cache_turns_compiled_into_loaded_with_the_same_report(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="optimum_ipu")
    reports = []
    for _ in range(2):
        cfg = two_ipu_config(executable_cache_dir=str(tmp_path / "exe_cache"))
        trainer = IPUTrainer(
            tiny_qa(), cfg, ipu_args(tmp_path, compile_only=False, max_steps=1), train_dataset=PatternQA(8)
        )
        trainer.train()
        reports.append(trainer.compile_report)
    logs = [r.getMessage() for r in caplog.records if r.getMessage().endswith("secs")]
    assert logs[0].startswith("Compiled model in") and logs[1].startswith("Loaded model in"), logs
    assert len(os.listdir(tmp_path / "exe_cache")) == 1
    assert not reports[0].from_cache and reports[1].from_cache
    assert reports[0].memory.ipus == reports[1].memory.ipus
    assert reports[0].estimated_samples_per_second == reports[1].estimated_samples_per_second


# -- fp16 semantics and run state (issue: fp16 numerics and IPU semantics) -------------------------


@pytest.mark.parametrize("lamb", [False, True])
@pytest.mark.parametrize("fp32", [False, True], ids=["fp16", "fp32"])
def test_optimizer_state_types_are_optimum_graphcores(tmp_path, fp32, lamb):
    """Optimum Graphcore 0.7's `create_optimizer`: fp16 training keeps the gradient accumulator and the first
    moment in fp16, the second moment in fp32; `--fp32` keeps all three in fp32."""
    args = ipu_args(tmp_path, fp32=fp32, lamb=lamb, max_steps=1, optim="adamw_torch")
    trainer = IPUTrainer(tiny_qa(), two_ipu_config(), args, train_dataset=PatternQA(16))
    trainer.train()
    half = torch.float32 if fp32 else torch.float16
    state = trainer.optimizer.state[next(trainer.model.parameters())]
    assert (state["exp_avg"].dtype, state["exp_avg_sq"].dtype) == (half, torch.float32)
    if not fp32 or lamb:  # IPU optimizers; an fp32 run without --lamb takes transformers' own optimizer
        assert trainer.optimizer.optimizer.accum_type == half  # inside accelerate's wrapper
    assert trainer._calls.executable.gradients.dtype == half


def test_auto_loss_scaling_in_the_ipu_config_file_alone_turns_it_on(tmp_path):
    cfg = two_ipu_config(auto_loss_scaling=True)
    path = tmp_path / "cfg"
    cfg.save_pretrained(path)
    trainer = IPUTrainer(tiny_qa(), IPUConfig.from_pretrained(path), ipu_args(tmp_path, loss_scaling=16.0, max_steps=2),
                         train_dataset=PatternQA(16))  # fmt: skip
    assert trainer.loss_scaler.auto
    trainer.train()
    assert trainer.loss_scaler.scale == 64.0  # clean updates double it: 16 -> 32 -> 64
    assert [e["loss_scale"] for e in trainer.state.log_history if "loss_scale" in e] == [32.0, 64.0]


def test_device_iterations_through_the_trainer_equal_the_same_updates_one_by_one(tmp_path):
    data = PatternQA(32)
    kwargs = dict(fp32=True, optim="sgd", max_grad_norm=0.05, lr_scheduler_type="constant")
    one_call = IPUTrainer(tiny_qa(), two_ipu_config(device_iterations=2), ipu_args(tmp_path / "a", **kwargs),
                          train_dataset=data)  # fmt: skip
    one_call.train()
    one_by_one = IPUTrainer(
        tiny_qa(), two_ipu_config(), ipu_args(tmp_path / "b", **kwargs), train_dataset=data
    )
    one_by_one.train()
    assert one_call.state.global_step * 2 == one_by_one.state.global_step == 4
    for (name, a), (_, b) in zip(one_call.model.named_parameters(), one_by_one.model.named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_padded_evaluation_equals_an_unpadded_one(tmp_path):
    data = PatternQA(13)
    results = []
    for pad in (False, True):
        trainer = IPUTrainer(tiny_qa(), two_ipu_config(inference_device_iterations=2),
                             ipu_args(tmp_path, fp32=True, pad_on_batch_axis=pad), eval_dataset=data)  # fmt: skip
        results.append(trainer.predict(data))
    torch.testing.assert_close(
        results[0].metrics["test_loss"], results[1].metrics["test_loss"], atol=1e-6, rtol=1e-6
    )
    for a, b in zip(results[0].predictions, results[1].predictions):
        torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b))


@pytest.mark.parametrize("fp16_compute", ["emulated", "native"])
def test_fp16_resume_reproduces_the_uninterrupted_run_bit_for_bit(tmp_path, fp16_compute):
    """fp16, automatic loss scaling, GA x replicas, dropout on: stop at a checkpoint, resume, same weights."""
    data = PatternQA(64)

    def model():
        torch.manual_seed(0)
        return BertForQuestionAnswering(
            tiny_bert_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
        )

    def run(folder, **kwargs):
        cfg = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=4, replication_factor=2,
                        auto_loss_scaling=True)  # fmt: skip
        args = ipu_args(tmp_path / folder, loss_scaling=256.0, fp16_compute=fp16_compute, save_strategy="steps",
                        save_steps=2, num_train_epochs=2, **kwargs)  # fmt: skip
        return IPUTrainer(model(), cfg, args, train_dataset=data)

    full = run("full")
    full.train()
    resumed = run("full")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "out" / "checkpoint-2"))
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name
    assert full.loss_scaler.state_dict() == resumed.loss_scaler.state_dict()


def test_fp16_trains_the_same_on_the_emulated_and_the_native_path(tmp_path):
    losses = {}
    for mode in ("emulated", "native"):
        trainer = IPUTrainer(tiny_qa(), two_ipu_config(), ipu_args(tmp_path / mode, fp16_compute=mode, loss_scaling=64.0,
                             num_train_epochs=2), train_dataset=PatternQA(48))  # fmt: skip
        trainer.train()
        assert trainer.compile_report.precision.startswith(f"precision: fp16, matmuls {mode}")
        losses[mode] = _train_losses(trainer)
    assert losses["emulated"][-1] < 0.95 * losses["emulated"][0]  # it learns (2.72 -> 2.47 on this seed)
    torch.testing.assert_close(losses["emulated"], losses["native"], atol=0.05, rtol=0.02)


def test_emulated_fp16_weights_copied_once_per_device_iteration_train_the_same_bits(tmp_path, monkeypatch):
    """The trainer hands the mode its weights (one fp32 copy per device iteration); training with a copy
    at every op instead (no weights declared) ends with the same bits: GA, replicas, dropout, loss scaling."""
    from optimum_ipu.runtime import executor, fp16_compute

    def run(folder):
        torch.manual_seed(0)
        model = BertForQuestionAnswering(
            tiny_bert_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
        )
        cfg = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=3, replication_factor=2,
                        device_iterations=2)  # fmt: skip
        args = ipu_args(tmp_path / folder, fp16_compute="emulated", loss_scaling=64.0, num_train_epochs=2)
        trainer = IPUTrainer(model, cfg, args, train_dataset=PatternQA(48))
        trainer.train()
        return trainer

    once = run("once")
    monkeypatch.setattr(
        executor, "fp16_compute_context", lambda mode, weights=(): fp16_compute.fp16_compute_context(mode)
    )
    per_op = run("per_op")
    assert once.state.global_step == per_op.state.global_step >= 2
    for (name, a), (_, b) in zip(once.model.named_parameters(), per_op.model.named_parameters()):
        assert a.dtype == torch.float16 and torch.equal(a, b), name


def test_an_fp16_evaluation_copies_each_weight_once_for_the_loop_with_the_same_predictions(tmp_path, monkeypatch):
    """Nothing changes the weights between an evaluation loop's calls: each call reads the fp32 copies made
    for the loop (`held_fp32_copies`), and predicts what a copy made for each call predicts."""
    from optimum_ipu import trainer as trainer_module
    from optimum_ipu.runtime import fp16_compute

    monkeypatch.setattr(fp16_compute, "CACHED_WEIGHT_ELEMENTS", 1)  # the tiny model's weights too
    copies = []
    copy = fp16_compute._storage_as_fp32
    monkeypatch.setattr(
        fp16_compute, "_storage_as_fp32", lambda tensor, *into: copies.append(tensor) or copy(tensor, *into)
    )

    def copies_held_at_the_metrics(prediction):  # the metrics may need the memory: the copies are gone
        block = fp16_compute._held()
        return {"copies_held": float(len(block._fp32)) if block is not None else -1.0}

    def predict(folder):
        copies.clear()
        trainer = IPUTrainer(tiny_qa(), two_ipu_config(inference_device_iterations=2),
                             ipu_args(tmp_path / folder, fp16_compute="emulated"),
                             compute_metrics=copies_held_at_the_metrics)  # fmt: skip
        prediction = trainer.predict(PatternQA(13))  # 4 calls: 4, 4, 4 and 1 samples
        return prediction, len(copies)

    held, held_copies = predict("held")
    assert held.metrics["test_copies_held"] == 0
    monkeypatch.setattr(
        trainer_module, "held_fp32_copies", lambda mode, weights: contextlib.nullcontext(lambda: None)
    )
    each, each_copies = predict("per_call")
    assert held_copies > 0 and each_copies == 4 * held_copies
    for a, b in zip(held.predictions, each.predictions):
        np.testing.assert_array_equal(a, b)
    assert held.metrics["test_loss"] == each.metrics["test_loss"]


def test_compile_only_returns_a_result_instead_of_exiting(tmp_path):
    trainer = IPUTrainer(
        tiny_qa(), two_ipu_config(), ipu_args(tmp_path, compile_only=True), train_dataset=PatternQA(8)
    )
    result = trainer.train()
    assert result.metrics == {"compile_only": True} and result.global_step == 0
    assert (tmp_path / "out" / "ipu_report.json").exists()


def test_compiling_loads_one_micro_batch_not_a_combined_batch(tmp_path):
    """A combined batch of real inputs can be gigabytes (ViT-base at micro-batch 17 x GA 128 is 1.3 GB of
    pixels): the compile reads only the first micro-batch (and the data loader's one prefetched)."""

    class Counted(PatternQA):
        read = 0

        def __getitem__(self, i):
            Counted.read += 1
            return super().__getitem__(i)

    data = Counted(64)
    args = ipu_args(tmp_path, compile_only=True, per_device_train_batch_size=2)
    trainer = IPUTrainer(tiny_qa(), two_ipu_config(device_iterations=4), args, train_dataset=data)
    trainer.train()
    assert args.train_batch_size == 32 and 0 < Counted.read <= 2 * 2


@pytest.mark.parametrize(
    "code_fraction, check, refused",
    [
        (1.05, "auto", False),
        (1.05, "strict", True),
        (1.35, "auto", True),
        (1.35, "off", False),
        (0.5, "strict", False),
    ],
)
def test_ipu_memory_check_refuses_beyond_the_models_error_unless_told_otherwise(
    tmp_path, caplog, monkeypatch, code_fraction, check, refused
):
    """margin (auto's default): an estimate within the model's error of the limit compiles, warning once;
    beyond it, it is refused as Poplar would. strict refuses anything over the limit; off never refuses."""
    import dataclasses

    from optimum_ipu import _once
    from optimum_ipu.costmodel import memory
    from optimum_ipu.costmodel.memory import IPUOutOfMemoryError

    capacity = 1472 * 638_976
    code = int(code_fraction * capacity)  # a tiny model made to sit at a chosen fraction of its IPU
    monkeypatch.setattr(
        memory, "MEMORY_CALIBRATION", dataclasses.replace(memory.MEMORY_CALIBRATION, code_bytes_per_ipu=code)
    )
    _once.forget()
    trainer = IPUTrainer(tiny_qa(), two_ipu_config(), ipu_args(tmp_path, compile_only=True, ipu_memory_check=check),
                         train_dataset=PatternQA(8))  # fmt: skip
    if refused:
        with pytest.raises(IPUOutOfMemoryError, match="Out of memory on IPU"):
            trainer.train()
        return
    with caplog.at_level(logging.WARNING, logger="optimum_ipu.compiling"):
        trainer.train()
    warned = [r for r in caplog.records if "a real IPU may not fit this layout" in r.getMessage()]
    assert len(warned) == (0 if code_fraction < 0.8 else 1)


def test_settings_without_effect_are_named_once(tmp_path, caplog):
    from optimum_ipu import _once

    _once.forget()
    cfg = two_ipu_config(parallelize_kwargs={"use_cache": False}, projection_serialization_factor=2,
                         output_mode="all", explicit_ir_inference=True)  # fmt: skip
    caplog.set_level(logging.WARNING, logger="optimum_ipu")
    for _ in range(2):
        IPUTrainer(
            tiny_qa(),
            cfg,
            ipu_args(tmp_path, dataloader_mode="async", optim="sgd"),
            train_dataset=PatternQA(8),
        )
    messages = [r.getMessage() for r in caplog.records]
    for setting in ("dataloader_mode='async'", "parallelize_kwargs", "projection_serialization_factor=2",
                    "enable_half_partials=True", "--optim sgd", "output_mode='all'",
                    "explicit_ir_inference=True"):  # fmt: skip
        assert sum(setting in m for m in messages) == 1, (setting, messages)


def test_only_atomic_checkpoints_overrides_private_trainer_methods():
    """One class of ours overrides transformers' private Trainer methods (`AtomicCheckpoints`, whose
    contract tests/test_checkpoints.py pins); the trainers join them through its hooks, so a
    transformers release that changes one breaks one file."""
    from transformers import Seq2SeqTrainer

    from optimum_ipu import IPUSeq2SeqTrainer
    from optimum_ipu.checkpoints.trainer_hooks import AtomicCheckpoints

    private = {name for name in dir(Seq2SeqTrainer) if name.startswith("_") and not name.startswith("__")}
    elsewhere = {
        f"{owner.__qualname__}.{name}"
        for trainer in (IPUTrainer, IPUSeq2SeqTrainer)
        for name in private
        for owner in trainer.__mro__[: trainer.__mro__.index(Trainer)]
        if name in vars(owner)
        and owner is not AtomicCheckpoints
        and not owner.__module__.startswith("transformers")
    }
    assert not elsewhere, f"private Trainer methods overridden outside AtomicCheckpoints: {sorted(elsewhere)}"


def test_ipu_trainer_skips_an_update_whose_loss_is_not_finite(tmp_path):
    """IPUTrainer keeps Optimum Graphcore's rule (users rely on it): the weights stay as they were; PopTorch
    programs apply such an update as the IPU does (`tests/poptorch/test_non_finite_loss.py`)."""

    class InfiniteLoss(IPUTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            return super().compute_loss(model, inputs, *args, **kwargs) * float("inf")

    model = tiny_qa()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = InfiniteLoss(model, two_ipu_config(), ipu_args(tmp_path, fp32=True, max_steps=1),
                           train_dataset=PatternQA(16))  # fmt: skip
    trainer.train()
    assert trainer.loss_scaler.skipped_updates == 1
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name


def test_fp16_compute_under_fp32_says_it_changes_nothing(tmp_path):
    from optimum_ipu.trainer import settings_without_effect

    said = settings_without_effect(two_ipu_config(), ipu_args(tmp_path, fp32=True, fp16_compute="native"))
    assert [m for m in said if m.startswith("--fp16_compute native has no effect with --fp32")]
    assert not [m for m in settings_without_effect(two_ipu_config(), ipu_args(tmp_path, fp32=True)) if "fp16_compute" in m]


@pytest.mark.parametrize("drop_last, predictions", [(False, 7), (True, 6)])
def test_evaluation_drops_a_short_last_batch_only_when_dataloader_drop_last_says_so(tmp_path, caplog, drop_last,
                                                                                       predictions):
    """Optimum Graphcore's evaluation loader passes `--dataloader_drop_last` on (seed 002 sets it: 5,606
    images at batch 4 evaluated as 1,401 full batches); 7 samples at batch 2 give 3 batches or 4."""
    from optimum_ipu import _once

    _once.forget()
    trainer = IPUTrainer(tiny_qa(), two_ipu_config(), ipu_args(tmp_path, fp32=True, dataloader_drop_last=drop_last))
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        output = trainer.predict(PatternQA(7))
    assert output.predictions[0].shape[0] == predictions
    said = [r.getMessage() for r in caplog.records if "--dataloader_drop_last" in r.getMessage()]
    assert len(said) == (1 if drop_last else 0) and all("leaves out the last 1 of 7 samples" in m for m in said)


def test_the_fp16_adamw_takes_optimum_graphcores_first_step_without_bias_correction(tmp_path):
    """Optimum Graphcore 0.7's `create_optimizer` builds PopTorch's AdamW with `bias_correction=False`: its first
    step moves a weight by lr x (1 - beta1) / sqrt(1 - beta2) = 3.16 lr (hand-worked: m = (1 - beta1) g,
    v = (1 - beta2) g^2), where a bias-corrected Adam moves it by lr."""
    model = tiny_qa().half()
    weight = model.bert.encoder.layer[1].intermediate.dense.weight
    before = weight.detach().float().clone()
    trainer = IPUTrainer(model, two_ipu_config(), ipu_args(tmp_path, learning_rate=1e-2, max_steps=1, weight_decay=0.0,
                                                         lr_scheduler_type="constant"), train_dataset=PatternQA(16))  # fmt: skip
    trainer.train()
    moved = ((weight.detach().float() - before).abs() / 1e-2).median().item()
    assert moved == pytest.approx((1 - 0.9) / (1 - 0.999) ** 0.5, rel=0.02)
