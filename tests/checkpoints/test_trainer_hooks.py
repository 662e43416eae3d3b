"""The Trainer side of checkpoints: atomic saves, the checkpoint to resume, the setup check, the resumed step.

Unit tests of optimum_ipu/checkpoints/trainer_hooks.py without training: `AtomicCheckpoints` is put
in front of a plain transformers `Trainer` of one `nn.Linear`, whose `_save_checkpoint` is called at
chosen steps, and compared with the same plain `Trainer` saving into another folder (the files, the
rotation, the best checkpoint). Where a rule is about what the mixin hands transformers (the
staging folder, the batch size during the state restore), a small stand-in for the Trainer records
it. End-to-end runs (training, resuming, kill -9) are in tests/test_checkpoints.py.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import Trainer, TrainingArguments
from transformers.trainer_callback import TrainerState

from optimum_ipu import IPUConfig
from optimum_ipu.checkpoints import (
    STAGING_PREFIX,
    SetupChange,
    checkpoint_problems,
    staging_folder,
    trainer_hooks,
)
from optimum_ipu.checkpoints.trainer_hooks import AtomicCheckpoints


class AtomicTrainer(AtomicCheckpoints, Trainer):
    """The mixin in front of a plain transformers Trainer, as IPUTrainer has it."""


def trainer(out: Path, cls=AtomicTrainer, steps: int = 16, **kwargs) -> Trainer:
    torch.manual_seed(0)
    values = dict(output_dir=str(out), report_to="none", use_cpu=True, save_strategy="steps", learning_rate=1e-3,
                  lr_scheduler_type="linear", per_device_train_batch_size=2, disable_tqdm=True)  # fmt: skip
    t = cls(model=torch.nn.Linear(2, 2), args=TrainingArguments(**{**values, **kwargs}))
    t.create_optimizer_and_scheduler(num_training_steps=steps)
    t.ipu_config = IPUConfig(gradient_accumulation_steps=4)
    return t


def save(t: Trainer, step: int) -> None:
    t.state.global_step = step
    t._save_checkpoint(t.model, None)


def listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


class Records(logging.Handler):
    """Records of optimum_ipu's and transformers' loggers (transformers' does not propagate)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def messages(self, level: int, source: str = "optimum_ipu") -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level and r.name.startswith(source)]


@pytest.fixture
def records():
    handler = Records()
    loggers = [logging.getLogger("optimum_ipu"), logging.getLogger("transformers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    logging.Logger.warning_once.cache_clear()
    yield handler
    for lg, level in zip(loggers, levels):
        lg.removeHandler(handler)
        lg.setLevel(level)


# -- saving ---------------------------------------------------------------------------------------------------


def test_a_checkpoint_holds_what_plain_transformers_writes(tmp_path):
    ours, plain = trainer(tmp_path / "ours"), trainer(tmp_path / "plain", cls=Trainer)
    save(ours, 3)
    save(plain, 3)
    assert listing(tmp_path / "ours") == listing(tmp_path / "plain") == ["checkpoint-3"]
    assert listing(tmp_path / "ours" / "checkpoint-3") == listing(tmp_path / "plain" / "checkpoint-3")
    assert checkpoint_problems(tmp_path / "ours" / "checkpoint-3") == []
    for name, tensor in load_file(tmp_path / "plain" / "checkpoint-3" / "model.safetensors").items():
        assert torch.equal(load_file(tmp_path / "ours" / "checkpoint-3" / "model.safetensors")[name], tensor)
    state = json.loads((tmp_path / "ours" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state == json.loads((tmp_path / "plain" / "checkpoint-3" / "trainer_state.json").read_text())


def test_the_checkpoint_is_renamed_into_place_only_when_complete(tmp_path, monkeypatch):
    t = trainer(tmp_path)
    seen = []
    real = trainer_hooks.publish

    def publish(staged, final):
        seen.append((Path(staged), Path(final), checkpoint_problems(staged), Path(final).exists()))
        real(staged, final)

    monkeypatch.setattr(trainer_hooks, "publish", publish)
    save(t, 4)
    staged = staging_folder(tmp_path, 4) / "checkpoint-4"
    assert seen == [(staged, tmp_path / "checkpoint-4", [], False)]
    assert listing(tmp_path) == ["checkpoint-4"]  # the staging folder is gone too


def test_every_process_waits_before_the_staging_folder_is_written_and_before_it_is_published(tmp_path):
    """Barrier 1: leftovers removed, nothing written; 2: every part written, nothing published; 3: published."""
    t = trainer(tmp_path)
    leftover = staging_folder(tmp_path, 5) / "checkpoint-5"
    leftover.mkdir(parents=True)
    (leftover / "partial").write_text("")
    at_barrier = []
    t.accelerator.wait_for_everyone = lambda: at_barrier.append(listing(tmp_path))
    save(t, 5)
    assert at_barrier == [[], [f"{STAGING_PREFIX}5"], ["checkpoint-5"]]
    assert "partial" not in listing(tmp_path / "checkpoint-5")


def test_a_staging_folder_left_by_a_killed_run_is_removed_at_the_next_save(tmp_path, records):
    t = trainer(tmp_path)
    (staging_folder(tmp_path, 2) / "checkpoint-2").mkdir(parents=True)
    save(t, 3)
    assert listing(tmp_path) == ["checkpoint-3"]
    assert records.messages(logging.INFO) == [
        f"Removed 1 incomplete checkpoint(s) left by an interrupted run: {STAGING_PREFIX}2"
    ]


def test_saving_a_step_again_replaces_it(tmp_path):
    t = trainer(tmp_path)
    save(t, 2)
    with torch.no_grad():
        t.model.weight.fill_(7.0)
    save(t, 2)
    assert listing(tmp_path) == ["checkpoint-2"]
    assert torch.equal(
        load_file(tmp_path / "checkpoint-2" / "model.safetensors")["weight"], torch.full((2, 2), 7.0)
    )


class Recording(Trainer):
    """A Trainer whose hyperparameter-search trials save into their own run folders, recording its save calls."""

    def _get_output_dir(self, trial):
        return (
            os.path.join(self.args.output_dir, f"run-{trial}") if trial is not None else self.args.output_dir
        )

    def _save_checkpoint(self, model, trial):
        self.seen = (model, trial, self._get_output_dir(trial=trial), self.args.save_total_limit)
        super()._save_checkpoint(model, trial)


class AtomicRecording(AtomicCheckpoints, Recording):
    pass


def test_transformers_writes_into_the_staging_folder_with_its_own_rotation_off(tmp_path):
    t = trainer(tmp_path, cls=AtomicRecording, save_total_limit=2)
    save(t, 6)
    assert t.seen == (t.model, None, str(staging_folder(tmp_path, 6)), None)
    assert t.args.save_total_limit == 2 and "_get_output_dir" not in vars(t)  # both restored
    assert t._get_output_dir(trial=None) == str(tmp_path)
    assert listing(tmp_path) == ["checkpoint-6"]


def test_a_trials_checkpoint_is_published_in_the_trials_run_folder(tmp_path):
    t = trainer(tmp_path, cls=AtomicRecording)
    other = torch.nn.Linear(2, 2)
    t.state.global_step = 3
    t._save_checkpoint(other, "7")
    run = tmp_path / "run-7"
    assert t.seen == (other, "7", str(staging_folder(run, 3)), None)  # model and trial handed on unchanged
    assert listing(tmp_path) == ["run-7"] and listing(run) == ["checkpoint-3"]
    assert checkpoint_problems(run / "checkpoint-3") == []


def test_a_staging_folder_that_cannot_be_removed_after_the_publish_does_not_fail_the_save(
    tmp_path, monkeypatch
):
    # On NFS an emptied folder can refuse rmdir for a moment (a .nfs file); the checkpoint is in place already.
    t = trainer(tmp_path)
    real_rmdir = os.rmdir

    def rmdir(path, *args, **kwargs):
        if Path(path).name == f"{STAGING_PREFIX}2":
            raise OSError(39, "Directory not empty", str(path))
        return real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", rmdir)
    save(t, 2)
    monkeypatch.undo()
    assert listing(tmp_path) == [f"{STAGING_PREFIX}2", "checkpoint-2"]
    assert checkpoint_problems(tmp_path / "checkpoint-2") == []
    save(t, 3)  # the next save clears it
    assert listing(tmp_path) == ["checkpoint-2", "checkpoint-3"]


def test_the_checkpoint_just_saved_survives_rotation_below_a_newer_number_like_plain_transformers(tmp_path):
    """A run resumed from checkpoint-2 with checkpoint-6 still there saves checkpoint-4: that one is kept.

    transformers orders by modification time here (saves a minute apart; under 1 s apart it falls back
    to the step number and would delete the checkpoint it has just written).
    """
    ours, plain = trainer(tmp_path / "ours"), trainer(tmp_path / "plain", cls=Trainer)
    now = time.time()
    for t in (ours, plain):
        save(t, 2)
        save(t, 6)
        for step, age in ((2, 120), (6, 60)):
            os.utime(Path(t.args.output_dir) / f"checkpoint-{step}", (now - age, now - age))
        t.args.save_total_limit = 1
        save(t, 4)
    assert listing(tmp_path / "ours") == listing(tmp_path / "plain") == ["checkpoint-4"]


def test_a_transformers_that_writes_elsewhere_is_an_error_naming_the_contract(tmp_path):
    class WritesElsewhere(Trainer):
        def _save_checkpoint(self, model, trial):
            self.save_model(os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}"))

    class Atomic(AtomicCheckpoints, WritesElsewhere):
        pass

    t = trainer(tmp_path, cls=Atomic)
    with pytest.raises(RuntimeError) as error:
        save(t, 2)
    staged = staging_folder(tmp_path, 2) / "checkpoint-2"
    assert str(error.value) == (
        f"transformers' Trainer._save_checkpoint did not write into {staged}: its contract with "
        "_get_output_dir() changed. optimum-ipu's atomic checkpoints need an update for this "
        "transformers version (see tests/test_checkpoints.py)."
    )


def test_a_process_that_does_not_save_neither_clears_nor_publishes(tmp_path, monkeypatch):
    leftover = staging_folder(tmp_path, 1)
    leftover.mkdir(parents=True)
    t = trainer(tmp_path)
    monkeypatch.setattr(TrainingArguments, "should_save", False)  # a process other than the saving one
    save(t, 2)
    assert not (tmp_path / "checkpoint-2").exists()
    assert leftover.is_dir()  # removed by the saving process only


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_rotation_after_the_rename_keeps_what_plain_transformers_keeps(tmp_path, limit):
    ours = trainer(tmp_path / "ours", save_total_limit=limit)
    plain = trainer(tmp_path / "plain", cls=Trainer, save_total_limit=limit)
    for step in (1, 2, 3, 10, 11):  # 10 and 11 sort after 3 by number
        save(ours, step)
        save(plain, step)
        assert listing(tmp_path / "ours") == listing(tmp_path / "plain"), step


def test_the_best_checkpoint_is_kept_and_named_by_its_final_path_like_plain_transformers(tmp_path):
    ours = trainer(tmp_path / "ours", save_total_limit=1)
    plain = trainer(tmp_path / "plain", cls=Trainer, save_total_limit=1)
    for t in (ours, plain):
        t.state.best_global_step = 2  # what an evaluation with metric_for_best_model sets
    for step in (1, 2, 3, 4):
        save(ours, step)
        save(plain, step)
    assert listing(tmp_path / "ours") == listing(tmp_path / "plain") == ["checkpoint-2", "checkpoint-4"]
    assert ours.state.best_model_checkpoint == str(tmp_path / "ours" / "checkpoint-2")
    assert plain.state.best_model_checkpoint == str(tmp_path / "plain" / "checkpoint-2")
    for name in ("checkpoint-2", "checkpoint-4"):  # the saved state names the best one where it is now
        saved = json.loads((tmp_path / "ours" / name / "trainer_state.json").read_text())
        reference = json.loads((tmp_path / "plain" / name / "trainer_state.json").read_text())
        assert saved["best_model_checkpoint"] == str(tmp_path / "ours" / "checkpoint-2")
        assert reference["best_model_checkpoint"] == str(tmp_path / "plain" / "checkpoint-2")


def test_without_a_best_checkpoint_none_is_named(tmp_path):
    t = trainer(tmp_path, save_total_limit=1)
    save(t, 1)
    save(t, 2)
    assert t.state.best_model_checkpoint is None
    assert (
        json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())["best_model_checkpoint"]
        is None
    )
    assert listing(tmp_path) == ["checkpoint-2"]


# -- which checkpoint a run resumes from ---------------------------------------------------------------------


class RecordsTrain(Trainer):
    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        self.trained = (resume_from_checkpoint, trial, ignore_keys_for_eval, kwargs)
        return "result"


class AtomicRecordsTrain(AtomicCheckpoints, RecordsTrain):
    pass


@pytest.fixture
def run_with_checkpoints(tmp_path):
    """checkpoint-2 and checkpoint-4 complete, checkpoint-6 without its optimizer (a save_only_model one)."""
    t = trainer(tmp_path, cls=AtomicRecordsTrain)
    for step in (2, 4, 6):
        save(t, step)
    for name in ("optimizer.pt", "scheduler.pt"):
        os.remove(tmp_path / "checkpoint-6" / name)
    return t


@pytest.mark.parametrize("value", [None, False])
def test_no_resume_trains_from_scratch(run_with_checkpoints, value):
    t = run_with_checkpoints
    t._resume_change = SetupChange("stale")
    assert (
        t.train(resume_from_checkpoint=value, trial="trial", ignore_keys_for_eval=["k"], extra=1) == "result"
    )
    assert t.trained == (None, "trial", ["k"], {"extra": 1})
    assert t._resume_change is None


def test_resume_true_takes_the_newest_complete_checkpoint(run_with_checkpoints, tmp_path, records):
    t = run_with_checkpoints
    t.train(resume_from_checkpoint=True)
    assert t.trained[0] == str(tmp_path / "checkpoint-4")
    assert any("checkpoint-6" in m and "no optimizer.pt" in m for m in records.messages(logging.WARNING))
    t.args.save_only_model = True
    t.train(resume_from_checkpoint=True)
    assert t.trained[0] == str(tmp_path / "checkpoint-6")


def test_resume_true_without_a_complete_checkpoint_is_an_error(tmp_path):
    t = trainer(tmp_path, cls=AtomicRecordsTrain)
    with pytest.raises(ValueError) as error:
        t.train(resume_from_checkpoint=True)
    assert str(error.value) == (
        f"resume_from_checkpoint=True, but {tmp_path} holds no checkpoint (no checkpoint-N folder). "
        "Start without resuming, or pass a checkpoint path."
    )


def test_resume_from_a_path_checks_that_it_is_complete(run_with_checkpoints, tmp_path):
    t = run_with_checkpoints
    t.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert t.trained[0] == str(tmp_path / "checkpoint-2")
    with pytest.raises(
        FileNotFoundError, match=r"checkpoint-6: it is not a complete checkpoint \(no optimizer.pt"
    ):
        t.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    t.args.save_only_model = True
    t.train(resume_from_checkpoint=tmp_path / "checkpoint-6")
    assert t.trained[0] == str(tmp_path / "checkpoint-6")


def test_resuming_keeps_the_setup_change_for_the_state_restore(run_with_checkpoints, tmp_path):
    t = run_with_checkpoints
    checkpoint = tmp_path / "checkpoint-4"
    IPUConfig(gradient_accumulation_steps=4, matmul_proportion=0.3).save_pretrained(checkpoint)
    t.train(resume_from_checkpoint=str(checkpoint))
    assert t._resume_change.layout == {"matmul_proportion": (0.3, 0.2)}
    assert t._resume_change.checkpoint == str(checkpoint)


# -- the setup check ---------------------------------------------------------------------------------------------


@pytest.fixture
def checkpoint_4(tmp_path):
    """A checkpoint of 4 steps at combined batch 8 (micro-batch 2 x GA 4), with its ipu_config.json."""
    t = trainer(tmp_path)
    save(t, 4)
    folder = tmp_path / "checkpoint-4"
    state = json.loads((folder / "trainer_state.json").read_text())
    (folder / "trainer_state.json").write_text(json.dumps({**state, "train_batch_size": 8}))
    IPUConfig(gradient_accumulation_steps=4).save_pretrained(folder)
    return folder


def test_the_same_setup_is_silent(checkpoint_4, tmp_path, records):
    t = trainer(tmp_path / "new")
    change = t._check_setup(str(checkpoint_4))
    assert (change.batch, change.layout) == ({}, {})
    assert [r for r in records.records if r.name.startswith("optimum_ipu")] == []


def test_a_checkpoint_without_an_ipu_config_is_not_compared(tmp_path, records):
    t = trainer(tmp_path)
    save(t, 1)
    assert t._check_setup(str(tmp_path / "checkpoint-1")) is None


def test_another_models_checkpoint_is_refused_before_loading(checkpoint_4, tmp_path):
    t = trainer(tmp_path / "new")
    t.model = torch.nn.Linear(3, 2)
    with pytest.raises(
        ValueError, match=r"holds the weights of another model: weight \[2, 2\] in the checkpoint"
    ):
        t._check_setup(str(checkpoint_4))


def test_a_layout_change_is_one_info_line(checkpoint_4, tmp_path, records):
    t = trainer(tmp_path / "new")
    t.ipu_config = IPUConfig(gradient_accumulation_steps=4, layers_per_ipu=[1, 1]).eval()
    change = t._check_setup(str(checkpoint_4))
    assert change.layout == {"layers_per_ipu": ([-1], [1, 1]), "ipus_per_replica": (1, 2)}
    assert records.messages(logging.INFO) == [
        f"Resuming from {checkpoint_4} with a different layout (layers_per_ipu [-1] -> [1, 1], ipus_per_replica "
        "1 -> 2); the weights do not depend on the layout."
    ]
    assert records.messages(logging.WARNING) == []
    assert t.ipu_config.mode == "inference"  # the trainer's own config is left in its mode


def test_a_batch_change_without_the_flag_is_an_error_naming_fields_samples_and_flag(checkpoint_4, tmp_path):
    t = trainer(tmp_path / "new", per_device_train_batch_size=1)  # plain arguments have no flag at all
    with pytest.raises(ValueError) as error:
        t._check_setup(str(checkpoint_4))
    assert str(error.value) == (
        f"Cannot resume from {checkpoint_4} unchanged: the batch arithmetic differs (per_device_train_batch_size "
        "2 -> 1), so a step no longer means the same number of samples. Resume with the checkpoint's values, or "
        "pass --allow_batch_change_on_resume to continue from the same number of samples (32) with the new "
        "combined batch 4."
    )
    t.args.allow_batch_change_on_resume = False
    with pytest.raises(ValueError, match="--allow_batch_change_on_resume"):
        t._check_setup(str(checkpoint_4))


def test_an_accepted_batch_change_is_one_warning(checkpoint_4, tmp_path, records):
    t = trainer(tmp_path / "new", per_device_train_batch_size=1)
    t.args.allow_batch_change_on_resume = True
    t.ipu_config = IPUConfig(gradient_accumulation_steps=4, matmul_proportion=0.3)
    change = t._check_setup(str(checkpoint_4))
    assert (change.resumed_step, change.batch) == (8, {"per_device_train_batch_size": (2, 1)})
    assert records.messages(logging.WARNING) == [change.batch_message() + "."]
    assert len(records.messages(logging.INFO)) == 1


# -- the state restore and the schedule ----------------------------------------------------------------------------


def _train_batch_warnings(records) -> list[str]:
    return [
        m for m in records.messages(logging.WARNING, "transformers") if "per_device_train_batch_size" in m
    ]


def test_resuming_does_not_warn_that_the_micro_batch_differs_from_the_combined_batch(
    checkpoint_4, tmp_path, records
):
    plain = trainer(tmp_path / "plain", cls=Trainer)
    plain._init_training_state(16, 16, 1, str(checkpoint_4), None)
    assert _train_batch_warnings(records)  # plain transformers compares the micro-batch 2 with the saved 8
    logging.Logger.warning_once.cache_clear()
    records.records.clear()
    t = trainer(tmp_path / "new")
    assert t._init_training_state(16, 16, 1, str(checkpoint_4), None) == (0, 4)
    assert _train_batch_warnings(records) == []
    assert t.args.per_device_train_batch_size == 2 and t.state.global_step == 4
    assert t._init_training_state(16, 3, 1, str(checkpoint_4), None) == (1, 1)  # transformers' own arithmetic


class RecordsStateRestore:
    """Stands in for the Trainer's state restore: records its arguments and the batch size it sees."""

    def _init_training_state(self, *args):
        self.seen = (self.args.per_device_train_batch_size, args)
        return 0, 0


class AtomicRecordsStateRestore(AtomicCheckpoints, RecordsStateRestore):
    pass


@pytest.mark.parametrize("saved, n_gpu, expected", [(8, 0, 8), (8, 1, 8), (8, 2, 4), (9, 2, 4), (7, 4, 1)])
def test_the_saved_batch_is_divided_over_gpus_as_transformers_divides_it(tmp_path, saved, n_gpu, expected):
    # transformers compares per_device_train_batch_size with train_batch_size // max(1, n_gpu): the same value.
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 1, "train_batch_size": saved}))
    stub = AtomicRecordsStateRestore()
    stub.args = SimpleNamespace(n_gpu=n_gpu, per_device_train_batch_size=2, ignore_data_skip=False)
    assert stub._init_training_state(16, 8, 2, str(tmp_path), "trial") == (0, 0)
    per_device, args = stub.seen
    assert per_device == expected == saved // max(1, n_gpu) and type(per_device) is int
    assert args == (16, 8, 2, str(tmp_path), "trial")  # handed on unchanged
    assert stub.args.per_device_train_batch_size == 2


def test_a_state_without_a_batch_size_leaves_the_arguments_alone(checkpoint_4, tmp_path, records):
    state = json.loads((checkpoint_4 / "trainer_state.json").read_text())
    del state["train_batch_size"]
    (checkpoint_4 / "trainer_state.json").write_text(json.dumps(state))

    class Base:
        def _init_training_state(self, *args):
            self.seen = self.args.per_device_train_batch_size
            return 0, 4

    class Stub(AtomicCheckpoints, Base):
        pass

    stub = Stub()
    stub.args = SimpleNamespace(n_gpu=0, per_device_train_batch_size=2, ignore_data_skip=False)
    assert stub._init_training_state(16, 16, 1, str(checkpoint_4), None) == (0, 4)
    assert stub.seen == 2


@pytest.mark.parametrize("result", [[0, 4], (0, 4, 0), 4])
def test_a_transformers_whose_state_restore_returns_something_else_is_an_error(result):
    class Base:
        def _init_training_state(self, *args):
            return result

    class Stub(AtomicCheckpoints, Base):
        pass

    stub = Stub()
    stub.args = SimpleNamespace(n_gpu=0, per_device_train_batch_size=2, ignore_data_skip=False)
    with pytest.raises(RuntimeError) as error:
        stub._init_training_state(16, 16, 1, None, None)
    assert str(error.value) == (
        "transformers' Trainer._init_training_state no longer returns (epochs, steps); "
        "optimum_ipu.checkpoints needs an update for this transformers version."
    )


# Saved: 4 steps of 8 samples = 32 samples; now micro-batch 1 x GA 4 = combined batch 4: step 8.
BATCH_CHANGE = SetupChange("c", batch={"per_device_train_batch_size": (2, 1)}, saved_step=4, saved_combined_batch=8,
                           combined_batch=4)  # fmt: skip


@pytest.mark.parametrize("per_epoch, ignore_data_skip, expected", [(16, False, (0, 8)), (3, False, (2, 2)),
                                                                   (3, True, (2, 0)), (8, False, (1, 0))])  # fmt: skip
def test_after_a_batch_change_the_state_continues_from_the_same_samples(
    checkpoint_4, tmp_path, per_epoch, ignore_data_skip, expected
):
    t = trainer(tmp_path / "new", per_device_train_batch_size=1, ignore_data_skip=ignore_data_skip)
    t._resume_change = BATCH_CHANGE
    assert (
        t._init_training_state(32, per_epoch, 1, str(checkpoint_4), None) == expected
    )  # epochs, steps in it
    assert (t.state.global_step, t.state.train_batch_size) == (8, 4)


def test_a_layout_change_or_a_fresh_start_keeps_transformers_state(checkpoint_4, tmp_path):
    t = trainer(tmp_path / "new")
    t._resume_change = SetupChange("c", layout={"matmul_proportion": (0.2, 0.3)}, saved_step=4,
                                   saved_combined_batch=8, combined_batch=8)  # fmt: skip
    assert t._init_training_state(16, 16, 1, str(checkpoint_4), None) == (0, 4)
    assert (t.state.global_step, t.state.train_batch_size) == (4, 8)
    t._resume_change = (
        BATCH_CHANGE  # left from an earlier train() call: a run that does not resume ignores it
    )
    assert t._init_training_state(16, 16, 1, None, None) == (0, 0)
    assert t.state.global_step == 0


def _linear_lr_after(steps: int, total: int = 16) -> float:
    """The reference: a fresh torch LambdaLR (linear decay, no warm-up) stepped `steps` times."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, (total - s) / total))
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
    return scheduler.get_last_lr()[0]


def _scheduler_saved_at_step_4(tmp_path) -> Path:
    t = trainer(tmp_path / "saved")
    for _ in range(4):
        t.optimizer.step()
        t.lr_scheduler.step()
    save(t, 4)
    return tmp_path / "saved" / "checkpoint-4"


def test_after_a_batch_change_the_schedule_moves_to_the_resumed_step(tmp_path):
    checkpoint = _scheduler_saved_at_step_4(tmp_path)
    t = trainer(tmp_path / "new", per_device_train_batch_size=1)
    t._resume_change = BATCH_CHANGE
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the deliberate scheduler.step() before optimizer.step() is silent
        t._load_optimizer_and_scheduler(str(checkpoint))
    assert t.lr_scheduler.last_epoch == 8
    assert t.lr_scheduler.get_last_lr() == pytest.approx([_linear_lr_after(8)] * 2)  # two parameter groups
    assert _linear_lr_after(8) == pytest.approx(1e-3 * 8 / 16)


def test_without_a_batch_change_the_schedule_is_the_saved_one(tmp_path):
    checkpoint = _scheduler_saved_at_step_4(tmp_path)
    for change in (None, SetupChange("c", layout={"matmul_proportion": (0.2, 0.3)})):
        t = trainer(tmp_path / "new")
        t._resume_change = change
        t._load_optimizer_and_scheduler(str(checkpoint))
        assert t.lr_scheduler.last_epoch == 4
        assert t.lr_scheduler.get_last_lr() == pytest.approx([_linear_lr_after(4)] * 2)
    t._resume_change = BATCH_CHANGE
    t._load_optimizer_and_scheduler(None)  # no checkpoint: nothing loaded, nothing moved
    assert t.lr_scheduler.last_epoch == 4


def test_the_schedule_inside_accelerates_wrapper_is_the_one_moved():
    class Base:
        def _load_optimizer_and_scheduler(self, checkpoint):
            self.loaded = checkpoint

    class Stub(AtomicCheckpoints, Base):
        pass

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    inner = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, (16 - s) / 16))
    stub = Stub()
    stub._resume_change = BATCH_CHANGE
    stub.lr_scheduler = SimpleNamespace(scheduler=inner)  # accelerate's AcceleratedScheduler keeps it here
    stub._load_optimizer_and_scheduler("ckpt")
    assert stub.loaded == "ckpt"
    assert inner.last_epoch == 8 and inner.get_last_lr() == [pytest.approx(1e-3 * 8 / 16)]
    stub.lr_scheduler = None  # a run without a scheduler: nothing to move
    stub._load_optimizer_and_scheduler("ckpt")
    assert stub.loaded == "ckpt"


def test_the_state_restore_and_train_see_transformers_state_class(tmp_path):
    # The stand-ins above assume the Trainer keeps its state in a TrainerState with these fields.
    t = trainer(tmp_path)
    assert isinstance(t.state, TrainerState)
    assert {"global_step", "train_batch_size", "best_model_checkpoint", "best_global_step"} <= set(
        vars(t.state)
    )
