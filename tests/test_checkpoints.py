"""Checkpoints are complete or absent; resuming takes the newest complete one; a changed setup is named.

Covers optimum_ipu/checkpoints/: the completeness rule, `get_last_checkpoint`, atomic saves with
rotation after the rename, a kill -9 at 20+ random moments of a run that saves every step, the setup
comparison on resume, and the transformers contract of the private Trainer methods it wraps.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from fixtures import PatternQA, tiny_bert_config
from safetensors.torch import load_file
from transformers import BertForQuestionAnswering, Trainer
from transformers import trainer_utils as hf_trainer_utils

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments, get_last_checkpoint
from optimum_ipu.checkpoints import CHECKPOINT_RE, STAGING_PREFIX, checkpoint_problems, staging_folder

TESTS = Path(__file__).resolve().parent


def tiny_qa(seed: int = 0, layers: int = 2) -> BertForQuestionAnswering:
    torch.manual_seed(seed)
    return BertForQuestionAnswering(tiny_bert_config(num_hidden_layers=layers))


def args_for(output_dir, **kwargs) -> IPUTrainingArguments:
    values = dict(
        output_dir=str(output_dir), per_device_train_batch_size=2, learning_rate=1e-3, num_train_epochs=1,
        logging_steps=1, save_strategy="steps", save_steps=2, report_to="none", seed=7, use_cpu=True,
        fp32=True, dataloader_num_workers=0, disable_tqdm=True, lr_scheduler_type="linear",
    )  # fmt: skip
    values.update(kwargs)
    return IPUTrainingArguments(**values)


def config(ga: int = 4, **kwargs) -> IPUConfig:
    values = dict(layers_per_ipu=[-1], ipus_per_replica=2, gradient_accumulation_steps=ga)
    return IPUConfig(**{**values, **kwargs})


def numbered(folder: Path) -> list[str]:
    return sorted(
        (n for n in os.listdir(folder) if CHECKPOINT_RE.match(n)), key=lambda n: int(n.split("-")[1])
    )


class Records(logging.Handler):
    """Collect records of the optimum_ipu and transformers loggers (transformers does not propagate)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def messages(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@pytest.fixture
def records():
    handler = Records()
    loggers = [logging.getLogger("optimum_ipu"), logging.getLogger("transformers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    logging.Logger.warning_once.cache_clear()  # transformers warns once per process; each test must see it
    yield handler
    for lg, level in zip(loggers, levels):
        lg.removeHandler(handler)
        lg.setLevel(level)


# -- the completeness rule and get_last_checkpoint ----------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 4-step run (GA 4, micro-batch 2: combined batch 8) with checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("trained") / "out"
    trainer = IPUTrainer(tiny_qa(), config(), args_for(out, max_steps=4), train_dataset=PatternQA(64))
    trainer.train()
    return out


def test_a_complete_checkpoint_has_state_weights_optimizer_and_scheduler(trained, tmp_path):
    good = trained / "checkpoint-4"
    assert checkpoint_problems(good) == []
    only_config = tmp_path / "checkpoint-9"
    only_config.mkdir()
    (only_config / "config.json").write_text("{}")
    assert checkpoint_problems(only_config) == [
        "no trainer_state.json",
        "no weights (model.safetensors)",
        "no optimizer.pt",
        "no scheduler.pt",
    ]
    assert checkpoint_problems(only_config, save_only_model=True)[:2] == [
        "no trainer_state.json",
        "no weights (model.safetensors)",
    ]


def test_get_last_checkpoint_skips_incomplete_folders_and_says_why(trained, tmp_path, records):
    out = tmp_path / "out"
    out.mkdir()
    for step in (2, 4):
        os.symlink(trained / f"checkpoint-{step}", out / f"checkpoint-{step}")
    (out / "checkpoint-6").mkdir()
    (out / "checkpoint-6" / "config.json").write_text("{}")
    (out / "checkpoint-10").mkdir()
    (out / "checkpoint-10" / "trainer_state.json").write_text('{"global_step": 10}')
    assert hf_trainer_utils.get_last_checkpoint(str(out)).endswith(
        "checkpoint-10"
    )  # the anchor trusts any name
    assert get_last_checkpoint(out) == str(out / "checkpoint-4")
    skipped = records.messages(logging.WARNING)
    assert len(skipped) == 2 and "checkpoint-10" in skipped[0] and "no weights" in skipped[0]
    assert "checkpoint-6" in skipped[1] and "no trainer_state.json" in skipped[1]
    assert get_last_checkpoint(tmp_path / "absent") is None


def test_saves_are_renamed_into_place_and_rotation_runs_after_the_rename(tmp_path, records):
    out = tmp_path / "out"
    leftover = staging_folder(out, 3) / "checkpoint-3"
    leftover.mkdir(parents=True)
    (leftover / "config.json").write_text("{}")  # what a run killed while saving step 3 leaves behind
    args = args_for(out, max_steps=5, save_steps=1, save_total_limit=2)
    IPUTrainer(tiny_qa(), config(), args, train_dataset=PatternQA(64)).train()
    assert numbered(out) == ["checkpoint-4", "checkpoint-5"]
    assert not [n for n in os.listdir(out) if n.startswith(STAGING_PREFIX)]
    assert all(checkpoint_problems(out / name) == [] for name in numbered(out))
    removed = [m for m in records.messages(logging.INFO) if "left by an interrupted run" in m]
    assert len(removed) == 1 and f"{STAGING_PREFIX}3" in removed[0]


def test_resume_true_takes_the_newest_complete_checkpoint(trained, tmp_path, records):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(trained / "checkpoint-2", out / "checkpoint-2")
    (out / "checkpoint-3").mkdir()
    (out / "checkpoint-3" / "config.json").write_text("{}")
    trainer = IPUTrainer(tiny_qa(seed=1), config(), args_for(out, max_steps=4, save_strategy="no"),
                         train_dataset=PatternQA(64))  # fmt: skip
    result = trainer.train(resume_from_checkpoint=True)
    assert result.global_step == 4
    assert any("checkpoint-3" in m and "config.json" not in m for m in records.messages(logging.WARNING))
    assert [e["step"] for e in trainer.state.log_history if "loss" in e] == [1, 2, 3, 4]  # 1, 2 restored


def test_resuming_from_an_incomplete_checkpoint_names_it_and_the_complete_one(trained, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(trained / "checkpoint-2", out / "checkpoint-2")
    broken = out / "checkpoint-3"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    trainer = IPUTrainer(tiny_qa(), config(), args_for(out, max_steps=4), train_dataset=PatternQA(64))
    with pytest.raises(FileNotFoundError, match=r"checkpoint-3: it is not a complete checkpoint \(no trainer_state"
                       r".*resume from .*checkpoint-2 \(the newest complete one\)"):  # fmt: skip
        trainer.train(resume_from_checkpoint=str(broken))


# -- kill -9 at random moments -----------------------------------------------------------------------


def _read(worker: subprocess.Popen, key: str, log: Path) -> dict:
    """The worker's next message with `key`; a child that ended before it fails the test with its log."""
    while True:
        line = worker.stdout.readline()
        if not line:
            raise AssertionError(f"the kill worker ended (rc={worker.poll()}):\n{log.read_text()[-3000:]}")
        message = json.loads(line)
        if key in message:
            return message
        if "exit" in message:
            raise AssertionError(f"the training child ended before {key!r}:\n{log.read_text()[-3000:]}")


def _assert_latest_loads(out: Path) -> int:
    """Every checkpoint-N is complete; the newest loads (weights, optimizer, trainer state); its step."""
    names = numbered(out)
    for name in names:
        assert checkpoint_problems(out / name) == [], (name, os.listdir(out / name))
    latest = get_last_checkpoint(out)
    if not names:
        assert latest is None
        return 0
    assert latest == str(out / names[-1])
    weights = load_file(os.path.join(latest, "model.safetensors"))
    assert "qa_outputs.weight" in weights
    optimizer = torch.load(os.path.join(latest, "optimizer.pt"), weights_only=True)
    assert optimizer["state"]
    state = json.loads(Path(latest, "trainer_state.json").read_text())
    assert int(latest.rsplit("-", 1)[1]) == state["global_step"]
    return state["global_step"]


def test_kill_9_at_random_moments_never_leaves_an_incomplete_checkpoint(tmp_path):
    """A run saving every step is killed 22 times, 5 of them inside a checkpoint write; each time, resuming works."""
    out = tmp_path / "out"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=os.pathsep.join(sys.path))
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen([sys.executable, str(TESTS / "_kill_worker.py")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log, text=True, env=env)  # fmt: skip
    rng = random.Random(14)
    steps, killed_while_saving, deliberate = [], 0, 0
    try:
        for kill in range(22):
            in_save = kill % 4 == 3  # every 4th kill lands inside a checkpoint write, on purpose
            request = {"output_dir": str(out), "max_steps": 10_000, "pause_in_save": in_save}
            worker.stdin.write(json.dumps(request) + "\n")
            worker.stdin.flush()
            pid = _read(worker, "pid", log_path)["pid"]
            _read(worker, "training", log_path)
            if in_save:
                _read(worker, "saving", log_path)
            else:
                time.sleep(rng.uniform(0.0, 0.3))
            os.kill(pid, signal.SIGKILL)
            _read(worker, "exit", log_path)
            staging = any(n.startswith(STAGING_PREFIX) for n in os.listdir(out))
            assert staging or not in_save, "a kill inside a save left no staging folder"
            deliberate += in_save
            killed_while_saving += staging
            steps.append(_assert_latest_loads(out))
        worker.stdin.write(json.dumps({"output_dir": str(out), "max_steps": steps[-1] + 2}) + "\n")
        worker.stdin.flush()
        _read(worker, "pid", log_path)
        assert _read(worker, "exit", log_path)["exit"] == 0, log_path.read_text()[-3000:]
    finally:
        worker.stdin.close()
        worker.wait(timeout=60)
    assert _assert_latest_loads(out) == steps[-1] + 2
    assert steps == sorted(steps) and steps[-1] > 0, steps  # every resume went on from where the last stopped
    assert killed_while_saving >= deliberate == 5
    print(f"kill -9 x22: steps at each kill {steps}; {killed_while_saving} kills left a staging folder")


# -- resuming with a different setup -------------------------------------------------------------------


def _resume(out, records, ipu_config, **kwargs):
    trainer = IPUTrainer(tiny_qa(seed=1), ipu_config, args_for(out, save_strategy="no", **kwargs),
                         train_dataset=PatternQA(64))  # fmt: skip
    records.records.clear()
    trainer.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    return trainer


@pytest.fixture
def saved_at_step_2(trained, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(trained / "checkpoint-2", out / "checkpoint-2")
    return out


def test_same_setup_resumes_without_a_warning(saved_at_step_2, records):
    trainer = _resume(saved_at_step_2, records, config(), max_steps=4)
    assert trainer.state.global_step == 4
    assert (
        records.messages(logging.WARNING) == []
    )  # transformers' "per_device_train_batch_size 2 != 8" is gone
    assert not [m for m in records.messages(logging.INFO) if "layout" in m]


def test_a_layout_change_is_one_info_line(saved_at_step_2, records):
    changed = config(layers_per_ipu=[1, 1], matmul_proportion=0.3, recompute_checkpoint_every_layer=True)
    trainer = _resume(saved_at_step_2, records, changed, max_steps=4)
    assert trainer.state.global_step == 4
    assert records.messages(logging.WARNING) == []
    lines = [m for m in records.messages(logging.INFO) if "different layout" in m]
    assert len(lines) == 1
    for field in (
        "layers_per_ipu [-1] -> [1, 1]",
        "matmul_proportion 0.2 -> 0.3",
        "recompute_checkpoint_every_layer",
    ):
        assert field in lines[0]


def test_a_batch_change_is_an_error_naming_the_fields_and_the_flag(saved_at_step_2, records):
    before = sorted(os.listdir(saved_at_step_2))
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps 4 -> 8, replication_factor 1 -> 2\)"
                       r".*--allow_batch_change_on_resume"):  # fmt: skip
        _resume(saved_at_step_2, records, config(ga=8, replication_factor=2), max_steps=6)
    assert sorted(os.listdir(saved_at_step_2)) == before


def test_an_accepted_change_of_replicas_continues_with_the_kept_replicas_streams(saved_at_step_2, records):
    """1 replica saved, 2 now, accepted: replica 0 carries its dropout stream on, replica 1 starts its own."""
    trainer = _resume(saved_at_step_2, records, config(replication_factor=2), allow_batch_change_on_resume=True)
    assert "replication_factor 1 -> 2" in records.messages(logging.WARNING)[0]
    assert trainer.state.global_step > 2


def test_an_accepted_batch_change_continues_from_the_same_samples(saved_at_step_2, records):
    """Saved: 2 steps of 8 samples. Now micro-batch 1 (combined batch 4): step 4 of the 16 in the epoch."""
    trainer = _resume(saved_at_step_2, records, config(), per_device_train_batch_size=1,
                      allow_batch_change_on_resume=True)  # fmt: skip
    warnings = records.messages(logging.WARNING)
    assert len(warnings) == 1 and "per_device_train_batch_size 2 -> 1" in warnings[0], warnings
    assert "continues at step 4" in warnings[0]
    logged = [e for e in trainer.state.log_history if "loss" in e][2:]  # after the 2 restored entries
    assert [e["step"] for e in logged] == list(range(5, 17))
    # linear decay over 16 steps: step s trains at 1e-3 * (17 - s) / 16 (unconverted, step 5 would get 14/16)
    assert [e["learning_rate"] for e in logged[:2]] == pytest.approx([1e-3 * 12 / 16, 1e-3 * 11 / 16])
    assert trainer.state.epoch == pytest.approx(1.0)


# -- the transformers contract this relies on -------------------------------------------------------


def test_the_private_trainer_save_wrapped_keeps_its_contract():
    """If this fails, transformers changed `Trainer._save`, which AtomicCheckpoints wraps: update it."""
    assert list(inspect.signature(Trainer._save).parameters) == ["self", "output_dir", "state_dict"]
    assert inspect.signature(Trainer._save).parameters["output_dir"].default is None


def test_the_private_trainer_methods_wrapped_keep_their_contract():
    """If this fails, transformers changed a private method optimum_ipu/checkpoints/trainer_hooks.py wraps: update it."""
    expected = {
        "_save_checkpoint": ["self", "model", "trial"],
        "_get_output_dir": ["self", "trial"],
        "_init_training_state": ["self", "max_steps", "num_update_steps_per_epoch", "num_train_epochs",
                                 "resume_from_checkpoint", "trial"],
        "_load_optimizer_and_scheduler": ["self", "checkpoint"],
    }  # fmt: skip
    for name, parameters in expected.items():
        assert list(inspect.signature(getattr(Trainer, name)).parameters) == parameters, name
    save = inspect.getsource(Trainer._save_checkpoint)
    assert "self._get_output_dir(trial=trial)" in save  # where the checkpoint is written
    assert (
        "save_total_limit=self.args.save_total_limit" in save
    )  # its own rotation is switched off through args
    assert "compare_trainer_and_checkpoint_args(self.args, self.state)" in inspect.getsource(
        Trainer._init_training_state
    )
