"""Every bad input gets a clear error: one table, one row per input a user can get wrong.

Each row builds its bad input under `tmp_path`, runs what a user would run (the arguments, the
`optimum-ipu` command, an example script, `IPUTrainer.train`), and asserts three things: the
exception type or exit status, that the message names the input, and that nothing that looks like
a checkpoint or a model was written to the output folder.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import (
    IMAGE_EXAMPLE_DIR,
    QA_EXAMPLE_DIR,
    PatternQA,
    tiny_bert_config,
    tiny_qa_model_dir,
    use_example,
    write_synthetic_chestxray,
    write_synthetic_squad,
)
from PIL import Image
from transformers import BertForQuestionAnswering

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments, cli
from optimum_ipu.configuration import IPUConfigError
from optimum_ipu.training_args import resolve_ipu_config

use_example(QA_EXAMPLE_DIR)
use_example(IMAGE_EXAMPLE_DIR)
import run_image_classification  # noqa: E402  (the example folders are on sys.path only now)
import run_qa  # noqa: E402

PLAN = ["plan", "bert-base-uncased", "--ipu-config", "Graphcore/bert-base-ipu"]


@dataclass
class Case:
    """One bad input: `make(tmp, assets)` returns the call that must fail; `expected` the exception type
    (or an int: the exit status of `optimum-ipu`); `names` what the message must contain."""

    id: str
    make: Callable[[Path, dict], Callable[[], object]]
    expected: type[BaseException] | int
    names: str


# -- builders ----------------------------------------------------------------------------------------


def _args(tmp: Path, **kwargs) -> Callable[[], object]:
    return lambda: IPUTrainingArguments(output_dir=str(tmp / "out"), use_cpu=True, report_to="none", **kwargs)


def _ipu_config(name: str, overrides: str | None = None) -> Callable[[], object]:
    def call():
        args = IPUTrainingArguments(output_dir="unused", ipu_config_name=name, ipu_config_overrides=overrides,
                                    use_cpu=True, report_to="none")  # fmt: skip
        return resolve_ipu_config(args)

    return call


def _config_file(tmp: Path, text: str) -> str:
    path = tmp / "cfg" / "ipu_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def _plan(tmp: Path, *flags: str) -> Callable[[], object]:
    return lambda: cli.main([*PLAN, *flags, "--json", str(tmp / "out" / "plan.json")])


def _qa(tmp: Path, assets: dict, *flags: str, model: str | None = None) -> Callable[[], object]:
    argv = ["--model_name_or_path", model or str(assets["qa_model"]), "--do_train", "--output_dir",
            str(tmp / "out"), "--max_seq_length", "64", "--doc_stride", "16", "--use_cpu", "--report_to", "none",
            "--ipu_config_name", "Graphcore/bert-base-ipu"]  # fmt: skip
    if "--train_file" not in flags and "--dataset_name" not in flags:
        argv += ["--train_file", str(assets["squad"]["train"])]
    return lambda: run_qa.main([*argv, *flags])


def _qa_file(tmp: Path, records) -> str:
    path = tmp / "bad.json"
    path.write_text(records if isinstance(records, str) else json.dumps({"data": records}))
    return str(path)


def _xray(tmp: Path, assets: dict, damage: Callable[[Path], None]) -> Callable[[], object]:
    folder = tmp / "xray"
    shutil.copytree(assets["xray"], folder)
    first = sorted((folder / "images").glob("*.png"))[0]
    damage(first)
    argv = ["--chestxray_dir", str(folder), "--model_type", "vit", "--do_train", "--output_dir", str(tmp / "out"),
            "--use_cpu", "--report_to", "none"]  # fmt: skip
    return lambda: run_image_classification.main(argv)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-40])


def _sixteen_bit(path: Path) -> None:
    Image.fromarray(np.full((32, 32), 40000, dtype=np.uint16)).save(path)


def _no_labels(tmp: Path, assets: dict) -> Callable[[], object]:
    folder = tmp / "flat"
    folder.mkdir()
    for i in range(4):
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / f"{i}.png")
    argv = ["--train_dir", str(folder), "--model_type", "vit", "--do_train", "--output_dir", str(tmp / "out"),
            "--use_cpu", "--report_to", "none"]  # fmt: skip
    return lambda: run_image_classification.main(argv)


def _resume(tmp: Path, assets: dict, damage: Callable[[Path], None], **model_config) -> Callable[[], object]:
    checkpoint = tmp / "out" / "checkpoint-2"
    shutil.copytree(assets["checkpoint"], checkpoint)
    damage(checkpoint)
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny_bert_config(num_hidden_layers=2, **model_config))
    args = IPUTrainingArguments(output_dir=str(tmp / "out"), per_device_train_batch_size=2, max_steps=4,
                                save_steps=1, fp32=True, use_cpu=True, report_to="none", disable_tqdm=True)  # fmt: skip
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=4)
    trainer = IPUTrainer(model, config, args, train_dataset=PatternQA(32))
    return lambda: trainer.train(resume_from_checkpoint=str(checkpoint))


CASES = [
    # IPU config files and overrides
    Case("ipu-config-missing-file", lambda t, a: _ipu_config(str(t / "nowhere" / "ipu_config.json")), OSError, "nowhere"),
    Case("ipu-config-not-json", lambda t, a: _ipu_config(_config_file(t, "{layers_per_ipu: [")), IPUConfigError, "ipu_config.json"),
    Case("ipu-config-empty-file", lambda t, a: _ipu_config(_config_file(t, "")), IPUConfigError, "ipu_config.json"),
    Case("ipu-config-bad-value", lambda t, a: _ipu_config(_config_file(t, '{"layers_per_ipu": "four"}')), IPUConfigError, "layers_per_ipu"),
    Case("override-bad-list", lambda t, a: _ipu_config("Graphcore/bert-base-ipu", "layers_per_ipu=[0 x]"), IPUConfigError, "layers_per_ipu"),
    Case("override-unknown-key", lambda t, a: _ipu_config("Graphcore/bert-base-ipu", "layer_per_ipu=[0 4 4 4]"), IPUConfigError, "layer_per_ipu"),
    Case("override-breaks-a-rule", lambda t, a: _ipu_config("Graphcore/bert-base-ipu", "matmul_proportion=[0.2 0.2]"), IPUConfigError, "matmul_proportion"),
    # training arguments
    Case("loss-scaling-negative", lambda t, a: _args(t, loss_scaling=-5.0), ValueError, "--loss_scaling"),
    Case("loss-scaling-zero", lambda t, a: _args(t, loss_scaling=0.0), ValueError, "--loss_scaling"),
    Case("loss-scaling-inf", lambda t, a: _args(t, loss_scaling=float("inf")), ValueError, "--loss_scaling"),
    Case("ga-zero", lambda t, a: _args(t, gradient_accumulation_steps=0), ValueError, "--gradient_accumulation_steps"),
    Case("micro-batch-zero", lambda t, a: _args(t, per_device_train_batch_size=0), ValueError, "--per_device_train_batch_size"),
    Case("n-ipu-zero", lambda t, a: _args(t, n_ipu=0), ValueError, "--n_ipu"),
    Case("pod-type-not-a-power-of-two", lambda t, a: _args(t, pod_type="pod3"), ValueError, "pod3"),
    Case("bf16", lambda t, a: _args(t, bf16=True), ValueError, "--bf16"),
    Case("warmup-ratio-above-1", lambda t, a: _args(t, warmup_ratio=1.5), ValueError, "--warmup_ratio"),
    # optimum-ipu plan flags (exit status 2, checked when parsed)
    Case("plan-seq-len-negative", lambda t, a: _plan(t, "--seq-len", "-5"), 2, "--seq-len"),
    Case("plan-seq-len-zero", lambda t, a: _plan(t, "--seq-len", "0"), 2, "--seq-len"),
    Case("plan-micro-batch-zero", lambda t, a: _plan(t, "--micro-batch", "0"), 2, "--micro-batch"),
    Case("plan-n-ipu-zero", lambda t, a: _plan(t, "--n-ipu", "0"), 2, "--n-ipu"),
    Case("plan-pod-not-a-number", lambda t, a: _plan(t, "--pod", "big"), 2, "--pod"),
    Case("plan-image-size-zero", lambda t, a: _plan(t, "--image-size", "0"), 2, "--image-size"),
    Case("plan-unknown-ipu-config", lambda t, a: lambda: cli.main(["plan", "bert-base-uncased", "--ipu-config", "Graphcore/no-such-ipu"]), 2, "Graphcore/no-such-ipu"),
    # question-answering data files
    Case("qa-missing-file", lambda t, a: _qa(t, a, "--train_file", str(t / "missing.json")), FileNotFoundError, "missing.json"),
    Case("qa-empty-file", lambda t, a: _qa(t, a, "--train_file", _qa_file(t, "")), ValueError, "bad.json"),
    Case("qa-wrong-columns", lambda t, a: _qa(t, a, "--train_file", _qa_file(t, [{"id": "1", "context": "x"}])), ValueError, "question"),
    Case("qa-answer-outside-context", lambda t, a: _qa(t, a, "--train_file", _qa_file(
        t, [{"id": "q1", "context": "alice lives in paris", "question": "where?",
             "answers": {"text": ["rome"], "answer_start": [15]}}])), ValueError, "'q1'"),  # fmt: skip
    Case("qa-no-answers-to-train-on", lambda t, a: _qa(t, a, "--train_file", _qa_file(
        t, [{"id": "q1", "context": "alice lives in paris", "question": "where?",
             "answers": {"text": [], "answer_start": []}}])), ValueError, "--version_2_with_negative"),  # fmt: skip
    Case("qa-max-seq-length-zero", lambda t, a: _qa(t, a, "--max_seq_length", "0"), ValueError, "--max_seq_length"),
    # images
    Case("image-truncated-png", lambda t, a: _xray(t, a, _truncate), ValueError, "truncated PNG"),
    Case("image-zero-size", lambda t, a: _xray(t, a, lambda p: p.write_bytes(b"")), ValueError, "empty file"),
    Case("image-16-bit-mode", lambda t, a: _xray(t, a, _sixteen_bit), ValueError, "pixel mode I;16"),
    Case("image-csv-names-a-missing-image", lambda t, a: _xray(t, a, os.remove), FileNotFoundError, "are not in"),
    Case("image-folder-without-labels", _no_labels, ValueError, "'label'"),
    Case("image-missing-folder", lambda t, a: lambda: run_image_classification.main(
        ["--chestxray_dir", str(t / "nope"), "--output_dir", str(t / "out")]), FileNotFoundError, "nope"),  # fmt: skip
    # checkpoints
    Case("checkpoint-truncated-weights", lambda t, a: _resume(t, a, lambda c: _truncate(c / "model.safetensors")),
         FileNotFoundError, "model.safetensors is truncated"),
    Case("checkpoint-missing-trainer-state", lambda t, a: _resume(t, a, lambda c: os.remove(c / "trainer_state.json")),
         FileNotFoundError, "no trainer_state.json"),
    Case("checkpoint-of-another-model", lambda t, a: _resume(t, a, lambda c: None, hidden_size=48),
         ValueError, "holds the weights of another model"),
    # Hub names
    Case("hub-unknown-ipu-config-offline", lambda t, a: _ipu_config("Graphcore/no-such-ipu"), OSError, "Graphcore/no-such-ipu"),
    Case("hub-unknown-model-offline", lambda t, a: _qa(t, a, model="no-such-org/no-such-model"), OSError, "no-such-org/no-such-model"),
    Case("hub-data-set-offline", lambda t, a: _qa(t, a, "--dataset_name", "no_such_dataset_xyz"), Exception, "no_such_dataset_xyz"),
]  # fmt: skip


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict:
    """A tiny QA model and SQuAD files, a ChestX-ray14-shaped folder, and a checkpoint at step 2."""
    root = tmp_path_factory.mktemp("bad-input-assets")
    out = root / "run"
    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny_bert_config(num_hidden_layers=2))
    args = IPUTrainingArguments(output_dir=str(out), per_device_train_batch_size=2, max_steps=2, save_steps=2,
                                fp32=True, use_cpu=True, report_to="none", disable_tqdm=True)  # fmt: skip
    config = IPUConfig(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=4)
    IPUTrainer(model, config, args, train_dataset=PatternQA(32)).train()
    return {
        "qa_model": tiny_qa_model_dir(root / "qa-model", num_hidden_layers=2),
        "squad": write_synthetic_squad(root / "squad", 12, 4),
        "xray": write_synthetic_chestxray(root / "xray", patients=6, max_images_per_patient=2),
        "checkpoint": out / "checkpoint-2",
    }


def _written(out: Path) -> list[str]:
    """Files under the output folder that look like a checkpoint or a saved model."""
    if not out.exists():
        return []
    looks_saved = ("checkpoint-", "model.safetensors", "trainer_state.json", "optimizer.pt", "config.json")
    return [str(p.relative_to(out)) for p in out.rglob("*") if any(p.name.startswith(k) for k in looks_saved)]


def test_the_table_is_large_enough():
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_a_clear_error_and_writes_nothing(case: Case, assets, tmp_path, capsys):
    out = tmp_path / "out"
    preexisting = set(_written(out))
    call = case.make(tmp_path, assets)
    preexisting |= set(_written(out))  # the row's own inputs (a copied checkpoint)
    if isinstance(case.expected, int):
        assert call() == case.expected
        err = capsys.readouterr().err
        assert case.names in err, err
        assert "Traceback" not in err
    else:
        with pytest.raises(case.expected) as raised:
            call()
        assert case.names in str(raised.value), str(raised.value)
    assert set(_written(out)) == preexisting
