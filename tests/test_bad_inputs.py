"""Every bad input gets a clear error: one table, one row per input a user can get wrong.

Each row builds its bad input under `tmp_path`, runs what a user would run (the arguments, the
`optimum-ipu` command, an example script, `IPUTrainer.train`), and asserts three things: the
exception type or exit status; that the message names what is wrong (the attribute, flag, file or
column), the bad value, and the rule or the fix; and that nothing that looks like a checkpoint or a
model was written to the output folder.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import zlib
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
    tiny_vit_model_dir,
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
    (or an int: the exit status of `optimum-ipu`). The message must name three things, as the README
    promises: `what` is wrong (the attribute, flag, file or column), the bad `value`, and the `fix` (the
    rule or the way out). Each is a literal substring, or a compiled regular expression."""

    id: str
    make: Callable[[Path, dict], Callable[[], object]]
    expected: type[BaseException] | int
    what: str | re.Pattern
    value: str | re.Pattern
    fix: str | re.Pattern


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


def _config_bytes(tmp: Path, data: bytes) -> str:
    path = tmp / "cfg" / "ipu_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
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


# A 4-layer ViT on Graphcore/vit-base-ipu, 8 images per step: runs that reach training stay tiny.
VIT_FLAGS = ["--ipu_config_name", "Graphcore/vit-base-ipu", "--ipu_config_overrides", "layers_per_ipu=[1 1 1 1]",
             "--gradient_accumulation_steps", "8", "--per_device_train_batch_size", "1", "--max_steps", "1",
             "--fp32", "--dataloader_num_workers", "0", "--save_steps", "1"]  # fmt: skip


def _image_run(tmp: Path, assets: dict, *flags: str) -> Callable[[], object]:
    argv = ["--model_name_or_path", str(assets["vit"]), *VIT_FLAGS, "--do_train", "--output_dir", str(tmp / "out"),
            "--use_cpu", "--report_to", "none", "--cache_dir", str(tmp / "cache"), *flags]  # fmt: skip
    return lambda: run_image_classification.main(argv)


def _png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def _folder(
    tmp: Path,
    assets: dict,
    damage: Callable[[Path], None] | None,
    *flags: str,
    which: str = "a/0.png",
    per_class: int = 6,
) -> Callable[[], object]:
    """Imagefolders (`--train_dir`, `--validation_dir`) of two classes; `damage` is applied to the training
    images `which` names ("a/*.png": every image of class a)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("val", 1)):
        for label in ("a", "b"):
            (tmp / split / label).mkdir(parents=True)
            for n in range(count):
                pixels = rng.integers(0, 255, (16, 16), np.uint8)
                (tmp / split / label / f"{n}.png").write_bytes(_png_bytes(pixels))
    for path in sorted((tmp / "train").glob(which)):
        damage(path)
    return _image_run(
        tmp, assets, "--train_dir", str(tmp / "train"), "--validation_dir", str(tmp / "val"), *flags
    )


def _cut_jpeg(path: Path) -> None:
    """A JPEG (under the .png name: PIL reads the content) cut in half: the header is whole, the scan is not."""
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64, 3), np.uint8)).save(buffer, "JPEG")
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])


def _sixteen_bit_rgb(path: Path) -> None:
    """A 16-bit RGB PNG, written by hand (PIL writes none): PIL reads it as its top 8 bits, silently."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + struct.pack(">HHH", 4095, 2048, 0) * 8 for _ in range(8))  # 12-bit data
    header = struct.pack(">IIBBBBB", 8, 8, 16, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _corrupt_inside(path: Path) -> None:
    """Image data cut out of the middle, the file's end intact: passes the quick check, fails to decode."""
    data = path.read_bytes()
    path.write_bytes(data[:80] + data[-12:])


def _hub_images(
    tmp: Path,
    assets: dict,
    labels: list[int] | None = None,
    *flags: str,
    damage_bytes: Callable[[bytes], bytes] | None = None,
    rows: int = 12,
) -> Callable[[], object]:
    """A Hub-layout data set folder (`--dataset_name DIR`): parquet train/validation splits, images as bytes."""
    import datasets

    rng = np.random.default_rng(0)
    folder = tmp / "hub-images" / "data"
    folder.mkdir(parents=True)
    for split, count in (("train", rows), ("validation", 4)):
        images = [_png_bytes(rng.integers(0, 255, (16, 16), np.uint8)) for _ in range(count)]
        split_labels = [n % 2 for n in range(count)]
        if split == "train" and damage_bytes:
            images[3] = damage_bytes(images[3])
        if split == "train" and labels is not None:
            split_labels[: len(labels)] = labels
        table = datasets.Dataset.from_dict(
            {"image": [{"bytes": b, "path": None} for b in images], "label": split_labels},
            features=datasets.Features(image=datasets.Image(), label=datasets.Value("int64")),
        ).cast_column("label", datasets.ClassLabel(names=["a", "b"]))  # a cast keeps out-of-range labels
        table.to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))
    return _image_run(tmp, assets, "--dataset_name", str(folder.parent), *flags)


def _hub_qa(tmp: Path, assets: dict, records: list[dict]) -> Callable[[], object]:
    """A Hub-layout QA data set folder (`--dataset_name DIR`) with a train.jsonl."""
    folder = tmp / "hub-qa"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return _qa(tmp, assets, "--dataset_name", str(folder), "--cache_dir", str(tmp / "cache"))


def _qa_record(
    qid: str = "q1", context: object = "alice lives in paris", question: object = "where?"
) -> dict:
    return {
        "id": qid,
        "context": context,
        "question": question,
        "answers": {"text": ["paris"], "answer_start": [15]},
    }


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
    Case("ipu-config-missing-file", lambda t, a: _ipu_config(str(t / "nowhere" / "ipu_config.json")), OSError,
         "No ipu_config.json", "nowhere/ipu_config.json", "Give a folder holding ipu_config.json"),
    Case("ipu-config-not-json", lambda t, a: _ipu_config(_config_file(t, "{layers_per_ipu: [")), IPUConfigError,
         "cfg/ipu_config.json", "line 1 column 2", "keys and strings in double quotes"),
    Case("ipu-config-empty-file", lambda t, a: _ipu_config(_config_file(t, "")), IPUConfigError,
         "cfg/ipu_config.json", "line 1 column 1", "Fix the file"),
    Case("ipu-config-bad-value", lambda t, a: _ipu_config(_config_file(t, '{"layers_per_ipu": "four"}')), IPUConfigError,
         "`layers_per_ipu`", "got 'four'", "a list of layer counts, one integer per IPU"),
    Case("ipu-config-utf16", lambda t, a: _ipu_config(_config_bytes(t, '{"layers_per_ipu": [-1]}'.encode("utf-16"))),
         IPUConfigError, "cfg/ipu_config.json", "UTF-16", "save it as UTF-8"),
    Case("ipu-config-binary", lambda t, a: _ipu_config(_config_bytes(t, bytes(range(256)))), IPUConfigError,
         "cfg/ipu_config.json", "not text", "give the ipu_config.json"),
    Case("ipu-config-is-a-model-config", lambda t, a: _ipu_config(_config_file(t, json.dumps(
        {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 768}))), IPUConfigError,
         "cfg/ipu_config.json", "model_type 'bert'", "Graphcore/bert-base-ipu"),
    Case("matmul-proportion-infinite", lambda t, a: _ipu_config(_config_file(t, '{"matmul_proportion": Infinity}')),
         IPUConfigError, "`matmul_proportion`", "got inf", "in (0, 1]"),
    Case("matmul-proportion-above-1", lambda t, a: _ipu_config("Graphcore/bert-base-ipu", "matmul_proportion=5"),
         IPUConfigError, "`matmul_proportion`", "got 5", "in (0, 1]"),
    Case("long-list-cut-in-the-message", lambda t, a: lambda: IPUConfig(layers_per_ipu=[1] * 100_000 + ["x"]),
         IPUConfigError, "`layers_per_ipu`", "100,001 entries", re.compile(r"^.{0,600}$", re.S)),
    Case("override-long-value-cut-in-the-message",
         lambda t, a: _ipu_config("Graphcore/bert-base-ipu", "device_iterations=" + "x" * 300_000), IPUConfigError,
         "`device_iterations=xxxx", "... (300,000 characters)`", re.compile(r"^.{0,600}expected an integer", re.S)),
    Case("override-bad-list", lambda t, a: _ipu_config("Graphcore/bert-base-ipu", "layers_per_ipu=[0 x]"), IPUConfigError,
         "layers_per_ipu", "[0 x]", "lists in brackets"),
    Case("override-unknown-key", lambda t, a: _ipu_config("Graphcore/bert-base-ipu", "layer_per_ipu=[0 4 4 4]"),
         IPUConfigError, "not an `IPUConfig` attribute", "`layer_per_ipu`", "did you mean `layers_per_ipu`"),
    Case("override-breaks-a-rule", lambda t, a: _ipu_config("Graphcore/bert-base-ipu", "matmul_proportion=[0.2 0.2]"),
         IPUConfigError, "`matmul_proportion`", "[0.2, 0.2]", "give one value per IPU"),
    # training arguments
    Case("loss-scaling-negative", lambda t, a: _args(t, loss_scaling=-5.0), ValueError,
         "--loss_scaling", "got -5.0", "leave it out"),
    Case("loss-scaling-zero", lambda t, a: _args(t, loss_scaling=0.0), ValueError,
         "--loss_scaling", "got 0.0", "finite number > 0"),
    Case("loss-scaling-inf", lambda t, a: _args(t, loss_scaling=float("inf")), ValueError,
         "--loss_scaling", "got inf", "--auto_loss_scaling"),
    Case("ga-zero", lambda t, a: _args(t, gradient_accumulation_steps=0), ValueError,
         "--gradient_accumulation_steps", "got 0", "must be an integer >= 1"),
    Case("micro-batch-zero", lambda t, a: _args(t, per_device_train_batch_size=0), ValueError,
         "--per_device_train_batch_size", "got 0", "must be an integer >= 1"),
    Case("n-ipu-zero", lambda t, a: _args(t, n_ipu=0), ValueError, "--n_ipu", "got 0", "must be an integer >= 1"),
    Case("pod-type-not-a-power-of-two", lambda t, a: _args(t, pod_type="pod3"), ValueError,
         "pod_type", "'pod3'", "N a power of two"),
    Case("bf16", lambda t, a: _args(t, bf16=True), ValueError, "--bf16", "is not supported", "Drop --bf16"),
    Case("warmup-ratio-above-1", lambda t, a: _args(t, warmup_ratio=1.5), ValueError,
         "--warmup_ratio", "got 1.5", "must be in [0, 1)"),
    # optimum-ipu plan flags (exit status 2, checked when parsed)
    Case("plan-seq-len-negative", lambda t, a: _plan(t, "--seq-len", "-5"), 2, "--seq-len", "got -5", "integer >= 1"),
    Case("plan-seq-len-zero", lambda t, a: _plan(t, "--seq-len", "0"), 2, "--seq-len", "got 0", "integer >= 1"),
    Case("plan-micro-batch-zero", lambda t, a: _plan(t, "--micro-batch", "0"), 2, "--micro-batch", "got 0", "integer >= 1"),
    Case("plan-n-ipu-zero", lambda t, a: _plan(t, "--n-ipu", "0"), 2, "--n-ipu", "got 0", "integer >= 1"),
    Case("plan-pod-not-a-number", lambda t, a: _plan(t, "--pod", "big"), 2, "--pod", "'big' is not a pod", "give a power of two"),
    Case("plan-image-size-zero", lambda t, a: _plan(t, "--image-size", "0"), 2, "--image-size", "got 0", "integer >= 1"),
    Case("plan-unknown-ipu-config", lambda t, a: lambda: cli.main(["plan", "bert-base-uncased", "--ipu-config", "Graphcore/no-such-ipu"]), 2,
         "No ipu_config.json", "'Graphcore/no-such-ipu'", "one of the bundled configs"),
    # question-answering data files
    Case("qa-missing-file", lambda t, a: _qa(t, a, "--train_file", str(t / "missing.json")), FileNotFoundError,
         "--train_file", "missing.json", "Give the path of a SQuAD-format JSON file"),
    Case("qa-empty-file", lambda t, a: _qa(t, a, "--train_file", _qa_file(t, "")), ValueError,
         "bad.json", "0 records", "at least one question"),
    Case("qa-wrong-columns", lambda t, a: _qa(t, a, "--train_file", _qa_file(t, [{"id": "1", "context": "x"}])), ValueError,
         "bad.json: record 0 lacks the column(s) ['question']", "it has ['context', 'id']", "every record needs"),
    Case("qa-answer-outside-context", lambda t, a: _qa(t, a, "--train_file", _qa_file(
        t, [{"id": "q1", "context": "alice lives in paris", "question": "where?",
             "answers": {"text": ["rome"], "answer_start": [15]}}])), ValueError,
         "bad.json", "id 'q1': answer 'rome' is not at answer_start=15", "must be the character offset"),
    Case("qa-no-answers-to-train-on", lambda t, a: _qa(t, a, "--train_file", _qa_file(
        t, [{"id": "q1", "context": "alice lives in paris", "question": "where?",
             "answers": {"text": [], "answer_start": []}}])), ValueError,
         "bad.json", "id 'q1'", "--version_2_with_negative"),
    Case("qa-empty-context", lambda t, a: _qa(t, a, "--train_file", _qa_file(t, [_qa_record(), _qa_record("q2", context="  ")])),
         ValueError, "bad.json", "id 'q2': context is '  '", "non-empty `question` and `context`"),
    Case("qa-question-not-text", lambda t, a: _qa(t, a, "--train_file", _qa_file(t, [_qa_record(question=None)])),
         ValueError, "bad.json", "id 'q1': question is None", "fill them in or delete those records"),
    Case("qa-hub-data-set-without-context", lambda t, a: _hub_qa(t, a, [{k: v for k, v in _qa_record().items() if k != "context"}]),
         ValueError, "lacks the column(s) ['context']", "it has ['id', 'question', 'answers']", "rename its columns"),
    Case("qa-hub-split-empty-after-dropping-empty-text", lambda t, a: _hub_qa(t, a, [_qa_record(context=""), _qa_record("q2", context="")]),
         ValueError, "the train split of --dataset_name", "empty (0 questions)", "drop --do_train"),
    Case("qa-max-seq-length-zero", lambda t, a: _qa(t, a, "--max_seq_length", "0"), ValueError,
         "--max_seq_length", "got 0", "must be >= 1"),
    # images: ChestX-ray14 folders (every listed image is checked when the folder is prepared)
    Case("image-truncated-png", lambda t, a: _xray(t, a, _truncate), ValueError,
         "00000001_000.png", "truncated PNG", "--skip_bad_images"),
    Case("image-zero-size", lambda t, a: _xray(t, a, lambda p: p.write_bytes(b"")), ValueError,
         "00000001_000.png", "empty file", "Replace or delete the broken files"),
    Case("image-16-bit-mode", lambda t, a: _xray(t, a, _sixteen_bit), ValueError,
         "00000001_000.png", "pixel mode I;16", "value >> 8"),
    Case("image-csv-names-a-missing-image", lambda t, a: _xray(t, a, os.remove), FileNotFoundError,
         "images listed in the CSV are not in", "00000001_000.png", "--skip_missing_images"),
    Case("image-missing-folder", lambda t, a: lambda: run_image_classification.main(
        ["--chestxray_dir", str(t / "nope"), "--output_dir", str(t / "out")]), FileNotFoundError,
         "--chestxray_dir", "nope", "images/ and Data_Entry_2017_v2020.csv"),
    # images: imagefolders (--train_dir) and Hub-layout data sets (--dataset_name), checked before the model loads
    Case("image-folder-truncated-png", lambda t, a: _folder(t, a, _truncate), ValueError,
         "train/a/0.png", "truncated PNG", "--skip_bad_images"),
    Case("image-folder-truncated-jpeg", lambda t, a: _folder(t, a, _cut_jpeg), ValueError,
         "train/a/0.png", "truncated JPEG", "Replace or delete the broken files"),
    Case("image-folder-not-an-image", lambda t, a: _folder(t, a, lambda p: p.write_text("<html>404</html>")), ValueError,
         "train/a/0.png", "not an image", "--skip_bad_images"),
    Case("image-folder-16-bit-gray", lambda t, a: _folder(t, a, _sixteen_bit), ValueError,
         "train/a/0.png", "pixel mode I;16", "value >> 4"),
    Case("image-folder-16-bit-rgb", lambda t, a: _folder(t, a, _sixteen_bit_rgb), ValueError,
         "train/a/0.png", "pixel mode RGB (16 bits per channel)", "8 bits per channel"),
    Case("image-folder-every-image-skipped", lambda t, a: _folder(t, a, _truncate, "--skip_bad_images", which="*/*.png"),
         ValueError, "train split of --train_dir", "empty (0 images)", "replace or convert them"),
    Case("image-folder-corrupt-inside-named-when-decoded", lambda t, a: _folder(t, a, _corrupt_inside, which="a/*.png"),
         ValueError, re.compile(r"Image \S+/train/a/\d\.png cannot be decoded"), "(image file is truncated)", "Replace or delete the file"),
    Case("image-folder-empty", lambda t, a: _image_run(t, a, "--train_dir", str(t)), FileNotFoundError,
         "--train_dir", "holds no images", "one sub-folder per class"),
    Case("image-folder-without-labels", _no_labels, ValueError,
         "no column 'label'", "it has ['image']", "one sub-folder per class"),
    Case("image-hub-unlabelled-train-row", lambda t, a: _hub_images(t, a, [0, 1, -1]), ValueError,
         "column 'label' of the train split", "row 2: -1", "train and evaluate on labelled images only"),
    Case("image-hub-label-outside-the-label-set", lambda t, a: _hub_images(t, a, [5]), ValueError,
         "outside the label set 0..1 ['a', 'b']", "row 0: 5", "list every class in the label column's ClassLabel"),
    Case("image-hub-truncated-bytes", lambda t, a: _hub_images(t, a, damage_bytes=lambda b: b[:-40]), ValueError,
         "train row 3", "truncated PNG", "--skip_bad_images"),
    Case("image-hub-no-such-image-column", lambda t, a: _hub_images(t, a, None, "--image_column_name", "img"), ValueError,
         "no column 'img'", "it has ['image', 'label']", "name the column with --image_column_name"),
    Case("image-hub-label-column-not-a-class-label", lambda t, a: _hub_images(t, a, None, "--label_column_name", "image"),
         ValueError, "Column 'image'", "not a class label", "give --label_column_name of one"),
    # checkpoints
    Case("checkpoint-truncated-weights", lambda t, a: _resume(t, a, lambda c: _truncate(c / "model.safetensors")),
         FileNotFoundError, "checkpoint-2", re.compile(r"model\.safetensors is truncated \(\d+ of \d+ bytes\)"),
         "start without --resume_from_checkpoint"),
    Case("checkpoint-missing-trainer-state", lambda t, a: _resume(t, a, lambda c: os.remove(c / "trainer_state.json")),
         FileNotFoundError, "checkpoint-2", "no trainer_state.json", "delete the folder"),
    Case("checkpoint-of-another-model", lambda t, a: _resume(t, a, lambda c: None, hidden_size=48),
         ValueError, "checkpoint-2 holds the weights of another model", "[32] in the checkpoint vs [48] in the model",
         "Resume from a checkpoint of this model"),
    # Hub names
    Case("hub-unknown-ipu-config-offline", lambda t, a: _ipu_config("Graphcore/no-such-ipu"), OSError,
         "No ipu_config.json", "'Graphcore/no-such-ipu'", "one of the bundled configs"),
    Case("hub-unknown-model-offline", lambda t, a: _qa(t, a, model="no-such-org/no-such-model"), OSError,
         "Cannot load the config", "'no-such-org/no-such-model'", "Give a local folder or an existing Hub id"),
    Case("hub-data-set-offline", lambda t, a: _qa(t, a, "--dataset_name", "no_such_dataset_xyz"), OSError,
         "--dataset_name", "'no_such_dataset_xyz'", "must already be in the Hugging Face cache"),
    Case("hub-image-data-set-offline", lambda t, a: _image_run(t, a, "--dataset_name", "no_such_dataset_xyz"), OSError,
         "--dataset_name", "'no_such_dataset_xyz'", "must already be in the Hugging Face cache"),
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
        "vit": tiny_vit_model_dir(root / "vit", num_labels=2),
    }


def _written(out: Path) -> list[str]:
    """Files under the output folder that look like a checkpoint or a saved model."""
    if not out.exists():
        return []
    looks_saved = ("checkpoint-", "model.safetensors", "trainer_state.json", "optimizer.pt", "config.json")
    return [str(p.relative_to(out)) for p in out.rglob("*") if any(p.name.startswith(k) for k in looks_saved)]


def test_the_table_is_large_enough():
    assert len(CASES) >= 55 and len({c.id for c in CASES}) == len(CASES)


def _names(message: str, expected: str | re.Pattern) -> bool:
    return bool(expected.search(message)) if isinstance(expected, re.Pattern) else expected in message


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_a_clear_error_and_writes_nothing(case: Case, assets, tmp_path, capsys):
    out = tmp_path / "out"
    preexisting = set(_written(out))
    call = case.make(tmp_path, assets)
    preexisting |= set(_written(out))  # the row's own inputs (a copied checkpoint)
    if isinstance(case.expected, int):
        assert call() == case.expected
        message = capsys.readouterr().err
        assert "Traceback" not in message
    else:
        with pytest.raises(case.expected) as raised:
            call()
        message = str(raised.value)
    for part in ("what", "value", "fix"):
        assert _names(message, getattr(case, part)), f"the message does not name the {part}: {message}"
    assert set(_written(out)) == preexisting
