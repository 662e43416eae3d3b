"""Masked LM, sequence classification and question answering evaluated through the launcher with the
scripts' own paths (`from_pretrained`, `load_dataset("csv")`, the scripts' collators) report what
transformers' own Trainer reports for the same script, model and data.

The IPU evaluates micro-batch after micro-batch (inference device iterations x replicas per host call),
each with the loss its model computes for its own micro-batch; transformers' Trainer with
`per_device_eval_batch_size` = the micro-batch does the same, so the losses agree to round-off. The
validation set is not a multiple of the host call (a short last call counts too), and the sentences are
padded, so a loss divided by the wrong number of tokens or samples shows (the run_clm.py bug was 31/32).
"""

import json
from pathlib import Path

import numpy as np
import pytest
from fixtures import seeded, tiny_bert_config, tiny_tokenizer, write_ipu_config, write_sentence_pairs_csv
from transformers import BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification

from optimum_ipu.launcher import run_script

SCRIPT = Path(__file__).parent / "scripts" / "encoder_heads_task.py"
HEADS = {"mlm": BertForMaskedLM, "classification": BertForSequenceClassification, "qa": BertForQuestionAnswering}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pairs")
    return {
        "train": write_sentence_pairs_csv(folder / "train.csv", rows=12, seed=1),
        "validation": write_sentence_pairs_csv(folder / "validation.csv", rows=11, seed=2),
    }


def model_dir(folder: Path, task: str) -> Path:
    seeded(0)
    tiny_tokenizer(folder)
    HEADS[task](tiny_bert_config(num_labels=2)).save_pretrained(folder)
    return folder


def run(args: list[str], output_dir: Path, capsys) -> dict:
    code = run_script(SCRIPT, [*args, "--output_dir", str(output_dir)])
    assert code == 0, capsys.readouterr().err
    return json.loads((output_dir / "results.json").read_text())


def arguments(task, model, ipu, data, train: bool) -> list[str]:
    args = ["--task", task, "--model_name_or_path", str(model), "--ipu_config_name", str(ipu),
            "--validation_file", str(data["validation"]), "--per_device_eval_batch_size", "2", "--fp32",
            "--seed", "0", "--report_to", "none", "--dataloader_num_workers", "0"]  # fmt: skip
    if train:
        args += ["--do_train", "--train_file", str(data["train"]), "--num_train_epochs", "1",
                 "--per_device_train_batch_size", "2", "--learning_rate", "1e-3"]  # fmt: skip
    return args


@pytest.mark.parametrize("task", ["classification", "qa"])
def test_trained_heads_evaluate_and_predict_as_the_plain_trainer(task, data, tmp_path, capsys):
    """One IPU, training then evaluation in calls of 3 micro-batches of 2 (11 samples: a short last call)."""
    model = model_dir(tmp_path / "model", task)
    ipu = write_ipu_config(tmp_path / "ipu", layers_per_ipu=[4], ipus_per_replica=1, gradient_accumulation_steps=1,
                           inference_device_iterations=3)  # fmt: skip
    args = arguments(task, model, ipu, data, train=True)
    ipu_run = run(args, tmp_path / "ipu_out", capsys)
    plain = run([*args, "--plain_trainer"], tmp_path / "plain_out", capsys)
    assert ipu_run["train"]["train_loss"] == pytest.approx(plain["train"]["train_loss"], rel=1e-6)
    assert ipu_run["eval"]["eval_loss"] == pytest.approx(plain["eval"]["eval_loss"], rel=1e-6)
    for ours, theirs in zip(ipu_run["predictions"], plain["predictions"], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("task", ["mlm", "classification", "qa"])
def test_pipelined_heads_evaluate_as_the_plain_trainer(task, data, tmp_path, capsys):
    """Two IPUs (layers [2, 2]), evaluation alone; masked LM with one micro-batch per call, so the
    seeded collator masks the same tokens as the plain Trainer's (it draws per collated batch). Half
    the tokens masked: at 15 % a micro-batch can draw no masked token, and its loss (hence both runs'
    eval loss) is NaN, which compares as unequal; transformers 5.18's draws did so."""
    model = model_dir(tmp_path / "model", task)
    calls = 1 if task == "mlm" else 3
    ipu = write_ipu_config(tmp_path / "ipu", inference_device_iterations=calls)
    args = arguments(task, model, ipu, data, train=False)
    if task == "mlm":
        args += ["--mlm_probability", "0.5"]
    ipu_run = run(args, tmp_path / "ipu_out", capsys)
    plain = run([*args, "--plain_trainer"], tmp_path / "plain_out", capsys)
    assert np.isfinite(plain["eval"]["eval_loss"])
    assert ipu_run["eval"]["eval_loss"] == pytest.approx(plain["eval"]["eval_loss"], rel=1e-6)
    assert ipu_run["eval"]["eval_samples_per_second"] > 0
