"""Scripts of ours in the style of Optimum Graphcore 0.7's run_summarization.py and run_translation.py run
through the launcher on tiny BART / T5 models and local JSON files, and report what transformers' own
Seq2SeqTrainer reports for the same script, model, data and seed: losses, ROUGE / BLEU on the generated
text, and the generated text itself."""

import json
from pathlib import Path

import pytest
from fixtures import tiny_seq2seq_model_dir, write_ipu_config, write_tiny_seq2seq_json

from optimum_ipu.launcher import run_script
from optimum_ipu.launcher._report import PREFIX

pytest.importorskip("evaluate")

SCRIPTS = Path(__file__).parent / "scripts"


def run(script: str, args: list[str], output_dir: Path, capsys) -> dict:
    code = run_script(SCRIPTS / script, [*args, "--output_dir", str(output_dir)])
    err = capsys.readouterr().err
    assert code == 0, err
    notes = [PREFIX + line for line in err.split(PREFIX)[1:]]
    return {**json.loads((output_dir / "results.json").read_text()), "notes": notes}


def assert_same_run(ipu_run: dict, plain: dict, metrics: tuple[str, ...]) -> None:
    """Generated text and metrics on it equal; losses to float rounding."""
    assert ipu_run["predictions"] == plain["predictions"]
    for split in ("eval", "predict"):
        for name in (*metrics, "gen_len"):
            key = f"{split}_{name}"
            assert ipu_run[split][key] == plain[split][key], key
        loss = f"{split}_loss"
        assert ipu_run[split][loss] == pytest.approx(plain[split][loss], rel=1e-6), loss
    assert ipu_run["train"]["train_loss"] == pytest.approx(plain["train"]["train_loss"], rel=1e-6)
    assert ipu_run["eval"]["epoch"] == plain["eval"]["epoch"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_tiny_seq2seq_json(tmp_path_factory.mktemp("seq2seq"))


def test_summarization_script_reports_the_plain_seq2seq_trainers_rouge(data, tmp_path, capsys):
    """fp32 on one IPU, AdamW, beam search: IPUSeq2SeqTrainer's losses, summaries and ROUGE are transformers'.

    (A few steps: over hundreds, AdamW grows last-bit differences in the weights into the losses' fifth digit.)"""
    pytest.importorskip("rouge_score")
    model = tiny_seq2seq_model_dir(tmp_path / "bart", "bart")
    ipu = write_ipu_config(
        tmp_path / "ipu", layers_per_ipu=[4], ipus_per_replica=1, gradient_accumulation_steps=1
    )
    args = ["--model_name_or_path", str(model), "--data_dir", str(data), "--ipu_config_name", str(ipu),
            "--predict_with_generate", "--num_beams", "2", "--num_train_epochs", "6", "--learning_rate", "1e-2",
            "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2", "--seed", "0", "--fp32",
            "--save_strategy", "no", "--report_to", "none", "--dataloader_num_workers", "0"]  # fmt: skip
    ipu_run = run("summarization_task.py", args, tmp_path / "ipu_out", capsys)
    plain = run("summarization_task.py", [*args, "--plain_trainer"], tmp_path / "plain_out", capsys)
    assert_same_run(ipu_run, plain, ("rouge1", "rouge2", "rougeL", "rougeLsum"))
    assert ipu_run["eval"]["eval_rouge1"] > 0  # the summaries share words with the references
    assert any("is_offline_mode() was removed in transformers v5" in line for line in ipu_run["notes"])
    assert any("evaluate.load('rouge'): served offline" in line for line in ipu_run["notes"])


def test_translation_script_on_a_pipeline_reports_the_plain_seq2seq_trainers_bleu(data, tmp_path, capsys):
    """fp32 T5 on 2 IPUs (micro-batch 1 x GA 8 against batch 8), SGD, beam search in the IPU's static form:
    losses, translations and BLEU are transformers'."""
    pytest.importorskip("sacrebleu")
    model = tiny_seq2seq_model_dir(tmp_path / "t5", "t5")
    ipu = write_ipu_config(tmp_path / "ipu", layers_per_ipu=[2, 2], gradient_accumulation_steps=8)
    args = ["--model_name_or_path", str(model), "--data_dir", str(data), "--ipu_config_name", str(ipu),
            "--source_prefix", "translate : ", "--predict_with_generate", "--num_beams", "2", "--num_train_epochs", "4",
            "--learning_rate", "0.5", "--optim", "sgd", "--per_device_eval_batch_size", "2", "--seed", "0",
            "--fp32", "--save_strategy", "no", "--report_to", "none", "--dataloader_num_workers", "0"]  # fmt: skip
    ipu_run = run("translation_task.py", [*args, "--per_device_train_batch_size", "1", "--static_generation", "true"],
                  tmp_path / "ipu_out", capsys)  # fmt: skip
    plain = run("translation_task.py", [*args, "--per_device_train_batch_size", "8", "--plain_trainer"],
                tmp_path / "plain_out", capsys)  # fmt: skip
    assert_same_run(ipu_run, plain, ("bleu",))
    assert ipu_run["eval"]["eval_bleu"] > 0
    assert any("evaluate.load('sacrebleu'): served offline" in line for line in ipu_run["notes"])


@pytest.mark.parametrize("script", ["summarization_task.py", "translation_task.py"])
def test_scripts_run_with_the_ipu_defaults_fp16_on_a_pipeline(data, tmp_path, capsys, script):
    """The examples' defaults: fp16 model and compute, loss scaling, a BART on 2 IPUs with gradient accumulation 8."""
    pytest.importorskip("rouge_score" if script.startswith("summarization") else "sacrebleu")
    model = tiny_seq2seq_model_dir(tmp_path / "bart", "bart")
    ipu = write_ipu_config(tmp_path / "ipu", layers_per_ipu=[2, 2], gradient_accumulation_steps=8)
    result = run(script, [
        "--model_name_or_path", str(model), "--data_dir", str(data), "--ipu_config_name", str(ipu),
        "--predict_with_generate", "--per_device_train_batch_size", "1", "--per_device_eval_batch_size", "2",
        "--save_strategy", "no", "--report_to", "none", "--dataloader_num_workers", "0",
    ], tmp_path / "out", capsys)  # fmt: skip
    assert result["train"]["train_loss"] > 0 and result["eval"]["eval_loss"] > 0
    assert len(result["predictions"]) == 8 and result["predict"]["predict_gen_len"] > 0
