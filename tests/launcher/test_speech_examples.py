"""Scripts of ours in the style of Optimum Graphcore 0.7's speech examples (run_audio_classification.py,
run_speech_recognition_ctc.py) run through the launcher on tiny models and generated audio, and report
the metrics transformers' own Trainer reports for the same script, model and data."""

import importlib.util
import json
from pathlib import Path

import pytest
from fixtures import tiny_speech_model_dir, write_ipu_config, write_tiny_audiofolder, write_tiny_speech_corpus

from optimum_ipu.launcher import run_script
from optimum_ipu.launcher._report import PREFIX

pytest.importorskip("evaluate")

SCRIPTS = Path(__file__).parent / "scripts"


def run(script: str, args: list[str], output_dir: Path, capsys) -> dict:
    code = run_script(SCRIPTS / script, [*args, "--output_dir", str(output_dir)])
    err = capsys.readouterr().err
    assert code == 0, err
    notes = [
        PREFIX + line for line in err.split(PREFIX)[1:]
    ]  # a note may follow a progress bar (carriage return)
    return {**json.loads((output_dir / "results.json").read_text()), "notes": notes}


@pytest.fixture(scope="module")
def audio_data(tmp_path_factory):
    return write_tiny_audiofolder(tmp_path_factory.mktemp("audio"))


def test_audio_classification_script_trains_to_the_plain_trainers_metrics(audio_data, tmp_path, capsys):
    """fp32 on one IPU: IPUTrainer's train loss, eval loss and accuracy are transformers' Trainer's."""
    model = tiny_speech_model_dir(tmp_path / "model", num_labels=2)
    ipu = write_ipu_config(
        tmp_path / "ipu", layers_per_ipu=[2], ipus_per_replica=1, gradient_accumulation_steps=1
    )
    args = ["--dataset_name", str(audio_data), "--model_name_or_path", str(model), "--ipu_config_name", str(ipu),
            "--do_train", "--do_eval", "--num_train_epochs", "2", "--per_device_train_batch_size", "2",
            "--per_device_eval_batch_size", "2", "--learning_rate", "1e-3", "--seed", "0", "--fp32",
            "--report_to", "none", "--dataloader_num_workers", "0"]  # fmt: skip
    ipu_run = run("audio_classification_task.py", args, tmp_path / "ipu_out", capsys)
    plain = run("audio_classification_task.py", [*args, "--plain_trainer"], tmp_path / "plain_out", capsys)
    assert ipu_run["labels"] == plain["labels"] == ["high", "low"]
    assert ipu_run["eval"]["eval_accuracy"] == plain["eval"]["eval_accuracy"]
    assert ipu_run["eval"]["eval_loss"] == pytest.approx(plain["eval"]["eval_loss"], rel=1e-6)
    assert ipu_run["train"]["train_loss"] == pytest.approx(plain["train"]["train_loss"], rel=1e-6)
    if importlib.util.find_spec("torchcodec") is None:  # the audio was read by the launcher's stand-in
        assert any("torchcodec is not installed" in line for line in ipu_run["notes"])


def test_audio_classification_script_pipelined_in_fp16(audio_data, tmp_path, capsys):
    """The script's own defaults: fp16 inputs and model, two IPUs, gradient accumulation 4; a HuBERT."""
    model = tiny_speech_model_dir(tmp_path / "model", num_labels=2, model_type="hubert")
    ipu = write_ipu_config(tmp_path / "ipu", layers_per_ipu=[1, 1])
    result = run("audio_classification_task.py", [
        "--dataset_name", str(audio_data), "--model_name_or_path", str(model), "--ipu_config_name", str(ipu),
        "--do_train", "--do_eval", "--per_device_train_batch_size", "1", "--per_device_eval_batch_size", "2",
        "--report_to", "none", "--dataloader_num_workers", "0",
    ], tmp_path / "out", capsys)  # fmt: skip
    assert 0.0 <= result["eval"]["eval_accuracy"] <= 1.0 and result["train"]["train_loss"] > 0


def edit_distance(reference: list[str], prediction: list[str]) -> int:
    """Levenshtein distance (substitutions, deletions, insertions each 1) between two token lists."""
    row = list(range(len(prediction) + 1))
    for i, ref in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, hyp in enumerate(prediction, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ref != hyp))
    return row[-1]


def error_rate(predictions: list[str], references: list[str], split) -> float:
    pairs = [(split(r.strip()), split(p.strip())) for p, r in zip(predictions, references)]
    return sum(edit_distance(r, p) for r, p in pairs) / sum(len(r) for r, _ in pairs)


@pytest.fixture(scope="module")
def speech_corpus(tmp_path_factory):
    return write_tiny_speech_corpus(tmp_path_factory.mktemp("speech"))


def test_ctc_script_trains_to_the_plain_trainers_wer_and_cer(speech_corpus, tmp_path, capsys):
    """fp32 on one IPU: the vocabulary, losses, decoded transcripts, WER and CER are transformers' Trainer's;
    and the served wer/cer are the word/character edit distances over the reference lengths."""
    pytest.importorskip("jiwer")
    model = tiny_speech_model_dir(tmp_path / "model", task="ctc")
    ipu = write_ipu_config(
        tmp_path / "ipu", layers_per_ipu=[7], ipus_per_replica=1, gradient_accumulation_steps=1
    )
    args = ["--dataset_name", str(speech_corpus), "--model_name_or_path", str(model), "--ipu_config_name", str(ipu),
            "--do_train", "--do_eval", "--num_train_epochs", "2", "--per_device_train_batch_size", "2",
            "--per_device_eval_batch_size", "2", "--learning_rate", "1e-4", "--seed", "0", "--fp32",
            "--report_to", "none", "--dataloader_num_workers", "0"]  # fmt: skip
    ipu_run = run("speech_recognition_ctc_task.py", args, tmp_path / "ipu_out", capsys)
    plain = run("speech_recognition_ctc_task.py", [*args, "--plain_trainer"], tmp_path / "plain_out", capsys)
    assert (tmp_path / "ipu_out" / "vocab.json").read_text() == (
        tmp_path / "plain_out" / "vocab.json"
    ).read_text()
    assert ipu_run["predictions"] == plain["predictions"] and ipu_run["references"] == plain["references"]
    for name in ("eval_wer", "eval_cer"):
        assert ipu_run["eval"][name] == plain["eval"][name]
    assert ipu_run["eval"]["eval_loss"] == pytest.approx(plain["eval"]["eval_loss"], rel=1e-6)
    assert ipu_run["train"]["train_loss"] == pytest.approx(plain["train"]["train_loss"], rel=1e-6)
    predictions, references = ipu_run["predictions"], ipu_run["references"]
    assert ipu_run["eval"]["eval_wer"] == pytest.approx(error_rate(predictions, references, str.split))
    assert ipu_run["eval"]["eval_cer"] == pytest.approx(error_rate(predictions, references, list))
    assert any("resume_from_checkpoint=" in line for line in ipu_run["notes"])
    assert any("config.tokenizer_class" in line for line in ipu_run["notes"])
    print(ipu_run["eval"], predictions[:3], references[:3])
