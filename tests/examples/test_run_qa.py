"""examples/question-answering/run_qa.py end to end, on a tiny BERT and generated SQuAD files.

The first test runs seed 001's command line in a subprocess, flag for flag, with local paths for the
model and data and tiny sizes; the others call `run_qa.main` in-process for the SQuAD v2 path and
for the errors a user can hit.
"""

import json
import os
import subprocess
import sys

import pytest
from fixtures import QA_EXAMPLE_DIR, tiny_qa_model_dir, use_example, write_synthetic_squad

use_example(QA_EXAMPLE_DIR)
import run_qa  # noqa: E402  (on sys.path only now)

# Seed 001 (Graphcore/bert-base-uncased-squad model card), model and data replaced by local paths.
SEED_FLAGS = [
    "--ipu_config_name", "Graphcore/bert-base-ipu", "--do_train", "--do_eval", "--num_train_epochs", "3",
    "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2",
    "--gradient_accumulation_steps", "16", "--pod_type", "pod16", "--learning_rate", "9e-5",
    "--max_seq_length", "384", "--doc_stride", "128", "--seed", "42", "--lr_scheduler_type", "linear",
    "--loss_scaling", "64", "--weight_decay", "0.01", "--warmup_ratio", "0.2", "--logging_steps", "1",
    "--save_steps", "50", "--dataloader_num_workers", "64",
    "--ipu_config_overrides", "embedding_serialization_factor=2",
]  # fmt: skip


def with_flag(flags: list[str], name: str, value: str) -> list[str]:
    """Replace the value of `name` in a flag list (the seed's sizes become tiny ones)."""
    out = list(flags)
    out[out.index(name) + 1] = value
    return out


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa_assets")
    # 12 layers so that bert-base-ipu's published layout [0,4,4,4] fits as is.
    model = tiny_qa_model_dir(root / "model", num_hidden_layers=12)
    data = write_synthetic_squad(root / "data", train_questions=150, validation_questions=20)
    return model, data


def tiny_seed_command(model, data, output_dir) -> list[str]:
    flags = SEED_FLAGS
    for name, value in (
        ("--max_seq_length", "64"),
        ("--doc_stride", "32"),
        ("--dataloader_num_workers", "0"),
    ):
        flags = with_flag(flags, name, value)
    return ["--model_name_or_path", str(model), "--train_file", str(data["train"]),
            "--validation_file", str(data["validation"]), *flags, "--max_steps", "1",
            "--output_dir", str(output_dir), "--overwrite_output_dir"]  # fmt: skip


def test_seed_command_line_parses_into_the_ipu_settings(assets, tmp_path):
    from optimum_ipu.training_args import resolve_ipu_config

    model, data = assets
    model_args, data_args, args = run_qa.parse_arguments(tiny_seed_command(model, data, tmp_path))
    assert data_args.max_seq_length == 64 and data_args.doc_stride == 32 and data_args.pad_to_max_length
    assert args.warmup_steps == 0.2 and args.n_ipu == 16 and args.loss_scaling == 64
    config = resolve_ipu_config(args, model_args.model_name_or_path)
    assert config.replication_factor == 4 and config.gradient_accumulation_steps == 16
    assert config.embedding_serialization_factor == 2
    assert args.per_device_train_batch_size * config.batch_size_factor() == 128  # one combined batch


def test_seed_command_line_trains_and_scores_end_to_end(assets, tmp_path):
    model, data = assets
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, str(QA_EXAMPLE_DIR / "run_qa.py"), *tiny_seed_command(model, data, tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    results = json.loads((tmp_path / "all_results.json").read_text())
    assert results["train_steps"] == 1 and results["train_samples"] >= 128
    assert 0 <= results["eval_exact_match"] <= 100 and 0 <= results["eval_f1"] <= 100
    predictions = json.loads((tmp_path / "eval_predictions.json").read_text())
    assert len(predictions) == results["eval_samples"] >= 20
    assert (tmp_path / "eval_nbest_predictions.json").is_file()
    saved = json.loads((tmp_path / "ipu_config.json").read_text())
    assert saved["embedding_serialization_factor"] == 2 and saved["replication_factor"] == 4


def test_squad_v2_flat_files_and_predict(tmp_path, assets):
    model, _ = assets
    data = write_synthetic_squad(
        tmp_path / "v2", train_questions=40, validation_questions=12, layout="flat", unanswerable_fraction=0.3
    )
    metrics = run_qa.main([
        "--model_name_or_path", str(model), "--ipu_config_name", "Graphcore/bert-base-ipu",
        "--train_file", str(data["train"]), "--validation_file", str(data["validation"]),
        "--test_file", str(data["validation"]), "--version_2_with_negative",
        "--do_train", "--do_eval", "--do_predict", "--max_steps", "1", "--fp32",
        "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "8",
        "--per_device_eval_batch_size", "4", "--max_seq_length", "48", "--doc_stride", "16",
        "--save_strategy", "no", "--report_to", "none", "--output_dir", str(tmp_path / "out"),
        "--evaluate_before_training",
    ])  # fmt: skip
    assert {"eval_exact", "eval_HasAns_f1", "eval_NoAns_exact", "eval_best_f1"} <= metrics.keys()
    assert {"untrained_exact", "untrained_f1"} <= metrics.keys()  # scored before training as well
    assert "predict_f1" in metrics
    for name in ("eval_predictions.json", "eval_null_odds.json", "predict_predictions.json"):
        assert (tmp_path / "out" / name).is_file(), name


def test_a_training_set_smaller_than_one_combined_batch_is_a_clear_error(assets, tmp_path):
    model, data = assets
    flags = tiny_seed_command(model, data, tmp_path) + ["--max_train_samples", "100"]  # < 2 x 16 x 4 = 128
    with pytest.raises(ValueError, match=r"100 samples, fewer than one combined batch of 128"):
        run_qa.main(flags)


def test_answers_outside_their_context_fail_before_training(tmp_path, assets):
    model, data = assets
    document = json.loads(data["train"].read_text())
    qa = document["data"][0]["paragraphs"][0]["qas"][0]
    qa["answers"][0]["answer_start"] += 3
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=rf"id '{qa['id']}'.*\n.*Fix: `answer_start` must be"):
        run_qa.main(
            [
                "--model_name_or_path",
                str(model),
                "--train_file",
                str(broken),
                "--do_train",
                "--ipu_config_name",
                "Graphcore/bert-base-ipu",
                "--output_dir",
                str(tmp_path / "out"),
            ]
        )


def test_unanswerable_training_questions_need_the_v2_flag(tmp_path, assets):
    model, _ = assets
    data = write_synthetic_squad(tmp_path / "v2", 20, 5, unanswerable_fraction=0.3)
    with pytest.raises(ValueError, match="have no answer.*--version_2_with_negative"):
        run_qa.main(
            [
                "--model_name_or_path",
                str(model),
                "--train_file",
                str(data["train"]),
                "--do_train",
                "--ipu_config_name",
                "Graphcore/bert-base-ipu",
                "--output_dir",
                str(tmp_path / "out"),
            ]
        )


def test_no_data_source_is_an_error():
    with pytest.raises(ValueError, match="--dataset_name .* or --train_file"):
        run_qa.parse_arguments(["--model_name_or_path", "m", "--output_dir", "o"])


def test_a_hub_data_set_loses_only_its_records_with_empty_text_with_a_warning(tmp_path, caplog):
    # A Hub data set cannot be edited, so its blank records are dropped (local files are an error instead).
    records = [{"id": f"q{n}", "context": "alice lives in paris", "question": "where?",
                "answers": {"text": ["paris"], "answer_start": [15]}} for n in range(5)]  # fmt: skip
    records[1]["context"], records[3]["question"] = "", "   "
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    model_args, data_args, _ = run_qa.parse_arguments(["--model_name_or_path", "m", "--output_dir", "o",
                                                       "--dataset_name", str(folder), "--cache_dir", str(tmp_path / "c")])  # fmt: skip
    with caplog.at_level("WARNING", logger="run_qa"):
        raw = run_qa.load_raw_datasets(data_args, model_args)
    assert raw["train"]["id"] == ["q0", "q2", "q4"]
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert (
        "Dropping 2 of 5 records" in warning and "id 'q1': context is ''" in warning and "id 'q3'" in warning
    )
