"""Malformed checkpoint files are named, never a raw AttributeError, KeyError, TypeError or ValueError.

A checkpoint folder is read by hand-written readers (the safetensors header, `trainer_state.json`)
before transformers loads it. Files that are valid JSON of the wrong shape, or hold a string where
a number belongs, must give an error (or a completeness problem) that names the folder or file,
what is wrong and what to do; `get_last_checkpoint` and `resume_from_checkpoint=True` must skip such
a folder with one warning and use the newest complete one. Every check here is read-only: each test
compares the files before and after it.
"""

from __future__ import annotations

import json
import logging
import typing
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import Trainer, TrainingArguments
from transformers.trainer_callback import TrainerState

from optimum_ipu import IPUConfig
from optimum_ipu.checkpoints import folders
from optimum_ipu.checkpoints.folders import (
    check_resumable,
    checkpoint_problems,
    get_last_checkpoint,
    safetensors_shapes,
)
from optimum_ipu.checkpoints.setup_change import check_same_model, compare_setup
from optimum_ipu.checkpoints.trainer_hooks import AtomicCheckpoints

# -- helpers -----------------------------------------------------------------------------------------------


def complete(path: Path, step: int = 1) -> Path:
    """A folder that holds exactly what `checkpoint_problems` asks for."""
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step, "train_batch_size": 8}))
    save_file({"a.weight": torch.ones(3, 2), "b.bias": torch.zeros(5)}, str(path / "model.safetensors"))
    torch.save({"state": {}}, path / "optimizer.pt")
    torch.save({"last_epoch": step}, path / "scheduler.pt")
    return path


def write_header(file: Path, header, data_bytes: int = 64) -> None:
    """A safetensors file whose header is `header` (any JSON), followed by `data_bytes` zero bytes."""
    raw = json.dumps(header).encode()
    file.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(data_bytes))


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes, to show that a check changed nothing."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


GOOD_ENTRY = {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 24]}

# (header, the problem in brackets after "model.safetensors has a malformed safetensors header")
MALFORMED_HEADERS = {
    "a list": ([GOOD_ENTRY], "the header is a list, not a JSON object"),
    "a string": ("a.weight", "the header is a string, not a JSON object"),
    "an entry that is a string": ({"a.weight": "F32"}, "tensor 'a.weight' is a string, not an object"),
    "an entry that is a list": ({"a.weight": [0, 24]}, "tensor 'a.weight' is a list, not an object"),
    "no data_offsets": (
        {"a.weight": {"dtype": "F32", "shape": [3, 2]}},
        "tensor 'a.weight' has no data_offsets",
    ),
    "no shape": ({"a.weight": {"dtype": "F32", "data_offsets": [0, 24]}}, "tensor 'a.weight' has no shape"),
    "no dtype": ({"a.weight": {"shape": [3, 2], "data_offsets": [0, 24]}}, "tensor 'a.weight' has no dtype"),
    "a dtype that is no string": (
        {"a.weight": {**GOOD_ENTRY, "dtype": 4}},
        "tensor 'a.weight' has dtype 4, not a string",
    ),
    "a shape of strings": (
        {"a.weight": {**GOOD_ENTRY, "shape": ["3", 2]}},
        "tensor 'a.weight' has shape [\"3\", 2], not a list of whole numbers >= 0",
    ),
    "a shape that is a number": (
        {"a.weight": {**GOOD_ENTRY, "shape": 6}},
        "tensor 'a.weight' has shape 6, not a list of whole numbers >= 0",
    ),
    "offsets that are a string": (
        {"a.weight": {**GOOD_ENTRY, "data_offsets": "0-24"}},
        "tensor 'a.weight' has data_offsets \"0-24\", not [begin, end] (whole numbers, begin <= end)",
    ),
    "one offset": (
        {"a.weight": {**GOOD_ENTRY, "data_offsets": [24]}},
        "tensor 'a.weight' has data_offsets [24], not [begin, end] (whole numbers, begin <= end)",
    ),
    "offsets in reverse": (
        {"a.weight": {**GOOD_ENTRY, "data_offsets": [24, 0]}},
        "tensor 'a.weight' has data_offsets [24, 0], not [begin, end] (whole numbers, begin <= end)",
    ),
    "offsets that are booleans": (
        {"a.weight": {**GOOD_ENTRY, "data_offsets": [False, True]}},
        "tensor 'a.weight' has data_offsets [false, true], not [begin, end] (whole numbers, begin <= end)",
    ),
    "metadata that is a list": (
        {"__metadata__": ["pt"], "a.weight": GOOD_ENTRY},
        "__metadata__ is a list, not an object of strings",
    ),
    "metadata with a number": (
        {"__metadata__": {"format": 1}, "a.weight": GOOD_ENTRY},
        "__metadata__ is an object, not an object of strings",
    ),
}


# -- 1. the safetensors header ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", MALFORMED_HEADERS)
def test_a_safetensors_header_of_the_wrong_shape_is_a_named_problem(tmp_path, case):
    header, detail = MALFORMED_HEADERS[case]
    folder = complete(tmp_path / "checkpoint-1")
    write_header(folder / "model.safetensors", header)
    before = snapshot(tmp_path)
    assert checkpoint_problems(folder) == [f"model.safetensors has a malformed safetensors header ({detail})"]
    assert snapshot(tmp_path) == before


def test_a_safetensors_header_that_safetensors_accepts_is_no_problem(tmp_path):
    # null metadata and extra keys in an entry load with the safetensors library, so they pass here too.
    folder = complete(tmp_path / "checkpoint-1")
    header = {"__metadata__": None, "a.weight": {**GOOD_ENTRY, "note": "extra"}}
    write_header(folder / "model.safetensors", header, data_bytes=24)
    assert checkpoint_problems(folder) == []
    assert safetensors_shapes(folder / "model.safetensors") == {"a.weight": [3, 2]}


@pytest.mark.parametrize("case", ["a list", "no data_offsets", "no shape", "an entry that is a string"])
def test_safetensors_shapes_of_a_malformed_header_is_an_error_naming_the_file_and_the_fix(tmp_path, case):
    header, detail = MALFORMED_HEADERS[case]
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    write_header(folder / "model.safetensors", header)
    before = snapshot(tmp_path)
    with pytest.raises(ValueError) as error:
        safetensors_shapes(folder / "model.safetensors")
    assert str(error.value) == (
        f"Cannot resume from {folder}: model.safetensors has a malformed safetensors header ({detail}). "
        "Resume from another checkpoint (resume_from_checkpoint=True takes the newest complete one), "
        "or delete the folder."
    )
    assert snapshot(tmp_path) == before


def test_safetensors_shapes_of_a_truncated_or_unreadable_header_is_an_error_naming_the_file(tmp_path):
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    file = folder / "model.safetensors"
    file.write_bytes(b"\x05\x00")
    with pytest.raises(
        ValueError, match=rf"^Cannot resume from {folder}: model.safetensors is truncated \(2 bytes"
    ):
        safetensors_shapes(file)
    file.write_bytes((4).to_bytes(8, "little") + b"nope")
    with pytest.raises(
        ValueError, match=r": model.safetensors has no readable safetensors header \(.*\)\. Resume"
    ):
        safetensors_shapes(file)


def test_check_same_model_on_a_malformed_header_names_the_checkpoint(tmp_path):
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    write_header(folder / "model.safetensors", {"weight": {"dtype": "F32", "data_offsets": [0, 16]}})
    with pytest.raises(ValueError) as error:
        check_same_model(folder, torch.nn.Linear(2, 2))
    assert str(error.value).startswith(
        f"Cannot resume from {folder}: model.safetensors has a malformed safetensors header "
        "(tensor 'weight' has no shape). Resume from another checkpoint"
    )


# -- 2. trainer_state.json -----------------------------------------------------------------------------------

# (the state, the problem after "trainer_state.json")
BAD_STATES = {
    "a list": ([{"global_step": 10}], "is a list, not a JSON object"),
    "a string naming global_step": ('"global_step"', "is a string, not a JSON object"),
    "a number": (10, "is a number, not a JSON object"),
    "null": (None, "is null, not a JSON object"),
    "a word for the step": ({"global_step": "ten"}, 'has global_step "ten", not a whole number >= 0'),
    "a digit string for the step": ({"global_step": "10"}, 'has global_step "10", not a whole number >= 0'),
    "a fractional step": ({"global_step": 2.5}, "has global_step 2.5, not a whole number >= 0"),
    "a negative step": ({"global_step": -1}, "has global_step -1, not a whole number >= 0"),
    "a boolean step": ({"global_step": True}, "has global_step true, not a whole number >= 0"),
    "a null step": ({"global_step": None}, "has global_step null, not a whole number >= 0"),
    "a string batch size": (
        {"global_step": 4, "train_batch_size": "8"},
        'has train_batch_size "8", not a whole number >= 0 or null',
    ),
    "a string epoch": ({"global_step": 4, "epoch": "1.0"}, 'has epoch "1.0", not a number or null'),
    "a string flop count": ({"global_step": 4, "total_flos": "1e9"}, 'has total_flos "1e9", not a number'),
    "a list of best metrics": (
        {"global_step": 4, "best_metric": [0.5]},
        "has best_metric [0.5], not a number or null",
    ),
}


@pytest.mark.parametrize("case", BAD_STATES)
def test_a_trainer_state_of_the_wrong_shape_or_type_is_a_named_problem(tmp_path, case):
    state, detail = BAD_STATES[case]
    folder = complete(tmp_path / "checkpoint-4")
    (folder / "trainer_state.json").write_text(json.dumps(state))
    before = snapshot(tmp_path)
    assert checkpoint_problems(folder) == [f"trainer_state.json {detail}"]
    with pytest.raises(ValueError) as error:
        folders.read_trainer_state(folder)
    assert str(error.value) == (
        f"Cannot resume from {folder}: trainer_state.json {detail}. Resume from another checkpoint "
        "(resume_from_checkpoint=True takes the newest complete one), or delete the folder."
    )
    assert snapshot(tmp_path) == before


def test_a_trainer_state_as_transformers_writes_it_is_no_problem(tmp_path):
    folder = complete(tmp_path / "checkpoint-4")
    state = TrainerState(epoch=0.5, global_step=4, max_steps=16, train_batch_size=8, best_metric=float("nan"))
    state.save_to_json(str(folder / "trainer_state.json"))
    assert checkpoint_problems(folder) == []
    assert folders.read_trainer_state(folder)["global_step"] == 4


def test_every_number_field_of_transformers_trainer_state_is_checked():
    # A numeric field transformers adds to TrainerState must be added to folders.STATE_NUMBERS too.
    def numeric(hint) -> bool:
        return hint in (int, float) or (
            typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None))
            and {a for a in typing.get_args(hint) if a is not type(None)} <= {int, float}
        )

    hints = typing.get_type_hints(TrainerState)
    assert {name for name, hint in hints.items() if numeric(hint)} == set(folders.STATE_NUMBERS)
    nullable = {name for name, hint in hints.items() if numeric(hint) and type(None) in typing.get_args(hint)}
    assert nullable <= {name for name, (_, may_be_null) in folders.STATE_NUMBERS.items() if may_be_null}


def test_compare_setup_on_a_bad_trainer_state_names_the_file_and_the_fix(tmp_path):
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    IPUConfig(gradient_accumulation_steps=4).save_pretrained(folder)
    for state, detail in [([4], "is a list, not a JSON object"),
                          ({"global_step": "ten"}, 'has global_step "ten", not a whole number >= 0'),
                          ({"global_step": 4, "train_batch_size": "8"},
                           'has train_batch_size "8", not a whole number >= 0 or null')]:  # fmt: skip
        (folder / "trainer_state.json").write_text(json.dumps(state))
        with pytest.raises(ValueError) as error:
            compare_setup(folder, IPUConfig(gradient_accumulation_steps=4), 2)
        assert str(error.value).startswith(
            f"Cannot resume from {folder}: trainer_state.json {detail}. Resume from"
        )


def test_an_ipu_config_that_is_not_a_json_object_is_named_with_the_fix(tmp_path):
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    (folder / "trainer_state.json").write_text('{"global_step": 4}')
    (folder / "ipu_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError) as error:
        compare_setup(folder, IPUConfig(gradient_accumulation_steps=4), 2)
    assert str(error.value) == (
        f"{folder / 'ipu_config.json'} is a list, not a JSON object; restore it from the run's output folder "
        "or delete the checkpoint."
    )


# -- 3. the newest complete checkpoint -----------------------------------------------------------------------


CORRUPTIONS = {
    "a header that is a list": lambda f: write_header(f / "model.safetensors", [GOOD_ENTRY]),
    "a tensor without data_offsets": lambda f: write_header(
        f / "model.safetensors", {"a.weight": {"dtype": "F32", "shape": [3, 2]}}
    ),
    "a step that is a word": lambda f: (f / "trainer_state.json").write_text('{"global_step": "ten"}'),
    "a state that is a number": lambda f: (f / "trainer_state.json").write_text("4"),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_get_last_checkpoint_skips_a_corrupt_newest_checkpoint_with_one_warning(tmp_path, caplog, corruption):
    complete(tmp_path / "checkpoint-2", 2)
    newest = complete(tmp_path / "checkpoint-4", 4)
    CORRUPTIONS[corruption](newest)
    before = snapshot(tmp_path)
    with caplog.at_level(logging.INFO, logger="optimum_ipu"):
        assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith(f"Skipping {newest}: not a complete checkpoint (")
    assert ("model.safetensors has a malformed" in message) or ("trainer_state.json " in message)
    assert snapshot(tmp_path) == before


def test_a_checkpoint_folder_that_cannot_be_read_is_skipped_with_its_error(tmp_path, monkeypatch, caplog):
    complete(tmp_path / "checkpoint-2", 2)
    locked = complete(tmp_path / "checkpoint-4", 4)
    real_is_file = Path.is_file

    def is_file(self):
        if locked in self.parents:
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_file(self)

    monkeypatch.setattr(Path, "is_file", is_file)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    [record] = caplog.records
    assert record.getMessage() == (
        f"Skipping {locked}: not a complete checkpoint (cannot be read: [Errno 13] Permission denied: "
        f"'{locked / 'trainer_state.json'}')."
    )


class RecordsTrain(Trainer):
    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        self.trained = resume_from_checkpoint
        return "result"


class AtomicRecordsTrain(AtomicCheckpoints, RecordsTrain):
    """The mixin in front of a Trainer whose own `train` only records the checkpoint it was given."""


def stand_in(out: Path) -> AtomicRecordsTrain:
    t = AtomicRecordsTrain(model=torch.nn.Linear(2, 2),
                           args=TrainingArguments(output_dir=str(out), report_to="none", use_cpu=True))  # fmt: skip
    t.ipu_config = IPUConfig(gradient_accumulation_steps=4)
    return t


def linear_checkpoint(path: Path, step: int) -> Path:
    """A complete checkpoint of the stand-in's `nn.Linear(2, 2)`."""
    complete(path, step)
    save_file(dict(torch.nn.Linear(2, 2).state_dict()), str(path / "model.safetensors"))
    return path


def test_resume_true_skips_a_corrupt_newest_checkpoint_with_one_warning(tmp_path, caplog):
    linear_checkpoint(tmp_path / "checkpoint-2", 2)
    newest = linear_checkpoint(tmp_path / "checkpoint-4", 4)
    (newest / "trainer_state.json").write_text('{"global_step": "ten"}')
    t = stand_in(tmp_path)
    before = snapshot(tmp_path)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        assert t.train(resume_from_checkpoint=True) == "result"
    assert t.trained == str(tmp_path / "checkpoint-2")
    assert [r.getMessage() for r in caplog.records] == [
        f"Skipping {newest}: not a complete checkpoint "
        '(trainer_state.json has global_step "ten", not a whole number >= 0).'
    ]
    assert snapshot(tmp_path) == before


def test_resume_true_without_a_complete_checkpoint_names_each_folder_and_why(tmp_path, caplog):
    (tmp_path / "checkpoint-2").mkdir()
    newest = linear_checkpoint(tmp_path / "checkpoint-4", 4)
    write_header(newest / "model.safetensors", [GOOD_ENTRY])
    t = stand_in(tmp_path)
    before = snapshot(tmp_path)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"), pytest.raises(ValueError) as error:
        t.train(resume_from_checkpoint=True)
    assert str(error.value) == (
        f"resume_from_checkpoint=True, but {tmp_path} holds no complete checkpoint:\n"
        f"- {newest}: model.safetensors has a malformed safetensors header (the header is a list, not a JSON "
        "object)\n"
        f"- {tmp_path / 'checkpoint-2'}: no trainer_state.json; no weights (model.safetensors); "
        "no optimizer.pt; no scheduler.pt\n"
        "Start without resuming, pass a checkpoint path, or delete these folders."
    )
    assert caplog.records == []  # the error says it all
    assert snapshot(tmp_path) == before


def test_resume_from_a_path_with_a_bad_trainer_state_names_it(tmp_path):
    linear_checkpoint(tmp_path / "checkpoint-2", 2)
    broken = linear_checkpoint(tmp_path / "checkpoint-4", 4)
    (broken / "trainer_state.json").write_text('{"global_step": 4, "train_batch_size": "eight"}')
    t = stand_in(tmp_path)
    with pytest.raises(FileNotFoundError) as error:
        t.train(resume_from_checkpoint=str(broken))
    assert str(error.value).startswith(
        f"Cannot resume from {broken}: it is not a complete checkpoint (trainer_state.json has "
        f'train_batch_size "eight", not a whole number >= 0 or null). '
    )
    assert f"resume from {tmp_path / 'checkpoint-2'} (the newest complete one) instead" in str(error.value)
    assert check_resumable(tmp_path / "checkpoint-2") == str(tmp_path / "checkpoint-2")
