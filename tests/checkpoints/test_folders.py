"""What a checkpoint folder is, found by number, written and rotated so that it is complete or absent.

Unit tests of optimum_ipu/checkpoints/folders.py on tiny files in tmp_path (no training): the
completeness rule file by file, `get_last_checkpoint` against transformers' own, the flush before the
rename, `publish` interrupted at each of its steps, and `rotate` against transformers'
`rotate_checkpoints` over every small case. The end-to-end runs (a trainer saving, kill -9) are in
tests/test_checkpoints.py.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import trainer_utils as hf_trainer_utils

from optimum_ipu.checkpoints import folders
from optimum_ipu.checkpoints.folders import (
    STAGING_PREFIX,
    WEIGHT_FILES,
    check_resumable,
    checkpoint_problems,
    flush_tree,
    get_last_checkpoint,
    is_complete_checkpoint,
    publish,
    remove_leftover_staging,
    rotate,
    safetensors_shapes,
    staging_folder,
)


def weights(path: Path, metadata: dict | None = None) -> Path:
    """A real safetensors file of two tensors (and a `__metadata__` entry when given)."""
    save_file({"a.weight": torch.ones(3, 2), "b.bias": torch.zeros(5)}, str(path), metadata=metadata)
    return path


def complete(path: Path, step: int = 1, save_only_model: bool = False) -> Path:
    """A folder that holds exactly what `checkpoint_problems` asks for."""
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    weights(path / "model.safetensors")
    if not save_only_model:
        torch.save({"state": {}}, path / "optimizer.pt")
        torch.save({"last_epoch": step}, path / "scheduler.pt")
    return path


def truncate(path: Path, by: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - by])


# -- the safetensors header ----------------------------------------------------------------------------


def test_a_whole_safetensors_file_passes_with_and_without_metadata(tmp_path):
    assert checkpoint_problems(complete(tmp_path / "plain")) == []
    metadata = complete(tmp_path / "meta")
    weights(metadata / "model.safetensors", metadata={"format": "pt"})  # a header entry without data_offsets
    assert checkpoint_problems(metadata) == []


def test_a_safetensors_file_without_tensors_is_whole(tmp_path):
    # Its header ends the file exactly and no tensor ends beyond it.
    folder = complete(tmp_path / "c")
    save_file({}, str(folder / "model.safetensors"))
    assert checkpoint_problems(folder) == []


def test_a_safetensors_file_one_byte_short_is_truncated_with_both_sizes(tmp_path):
    folder = complete(tmp_path / "c")
    file = folder / "model.safetensors"
    size = file.stat().st_size
    truncate(file, 1)
    assert checkpoint_problems(folder) == [f"model.safetensors is truncated ({size - 1} of {size} bytes)"]


def test_a_safetensors_file_cut_inside_its_header_is_truncated(tmp_path):
    folder = complete(tmp_path / "c")
    file = folder / "model.safetensors"
    file.write_bytes(file.read_bytes()[:20])
    assert checkpoint_problems(folder) == [
        "model.safetensors is truncated (20 bytes, shorter than its own header)"
    ]
    file.write_bytes(b"\x05\x00\x00")  # shorter than the 8-byte length itself
    assert checkpoint_problems(folder) == [
        "model.safetensors is truncated (3 bytes, shorter than its own header)"
    ]
    file.write_bytes(b"")
    assert checkpoint_problems(folder) == [
        "model.safetensors is truncated (0 bytes, shorter than its own header)"
    ]


def test_a_safetensors_header_of_exactly_8_bytes_is_read(tmp_path):
    # 8 bytes: the length says 0, so the header is the empty string, which is not JSON.
    folder = complete(tmp_path / "c")
    (folder / "model.safetensors").write_bytes(bytes(8))
    [problem] = checkpoint_problems(folder)
    assert problem.startswith("model.safetensors has no readable safetensors header (")


def test_a_safetensors_header_that_is_not_json_is_named(tmp_path):
    folder = complete(tmp_path / "c")
    (folder / "model.safetensors").write_bytes((10).to_bytes(8, "little") + b"not json!!" + bytes(4))
    [problem] = checkpoint_problems(folder)
    assert problem.startswith("model.safetensors has no readable safetensors header (") and problem.endswith(
        ")"
    )


def test_safetensors_shapes_match_the_library_reading_the_same_file(tmp_path):
    file = weights(tmp_path / "w.safetensors", metadata={"format": "pt"})
    with safe_open(str(file), framework="pt") as handle:
        reference = {name: list(handle.get_slice(name).get_shape()) for name in handle.keys()}
    assert safetensors_shapes(file) == reference == {"a.weight": [3, 2], "b.bias": [5]}


# -- the completeness rule --------------------------------------------------------------------------------


def test_a_path_that_is_no_folder_is_not_a_checkpoint(tmp_path):
    file = tmp_path / "checkpoint-1"
    file.write_text("")
    assert checkpoint_problems(file) == [f"{file} is not a folder"]
    assert checkpoint_problems(tmp_path / "absent") == [f"{tmp_path / 'absent'} is not a folder"]
    assert not is_complete_checkpoint(tmp_path / "absent")


def test_each_missing_part_is_named_in_order(tmp_path):
    empty = tmp_path / "c"
    empty.mkdir()
    (empty / "trainer_state.json").mkdir()  # a folder where the file should be is no state
    expected = [
        "no trainer_state.json",
        "no weights (model.safetensors)",
        "no optimizer.pt",
        "no scheduler.pt",
    ]
    assert checkpoint_problems(empty) == expected
    assert checkpoint_problems(empty, save_only_model=True) == expected[:2]
    assert not is_complete_checkpoint(empty, save_only_model=True)


def test_the_trainer_state_needs_a_global_step_and_valid_json(tmp_path):
    folder = complete(tmp_path / "c")
    (folder / "trainer_state.json").write_text('{"epoch": 1.0}')
    assert checkpoint_problems(folder) == ["trainer_state.json has no global_step"]
    (folder / "trainer_state.json").write_text('{"global_step": 3')  # cut by a kill
    [problem] = checkpoint_problems(folder)
    assert problem.startswith("trainer_state.json is not valid JSON (") and problem.endswith(")")


@pytest.mark.parametrize("name", WEIGHT_FILES)
def test_each_weight_format_transformers_writes_counts_as_weights(tmp_path, name):
    folder = complete(tmp_path / "c")
    os.remove(folder / "model.safetensors")
    if name.endswith(".safetensors"):
        weights(folder / name)
    else:
        (folder / name).write_text("{}")
    assert checkpoint_problems(folder) == []


def test_truncated_adapter_weights_are_found_like_model_weights(tmp_path):
    folder = complete(tmp_path / "c")
    os.remove(folder / "model.safetensors")
    truncate(weights(folder / "adapter_model.safetensors"), 1)
    [problem] = checkpoint_problems(folder)
    assert problem.startswith("adapter_model.safetensors is truncated (")


def test_the_safetensors_weights_are_checked_even_beside_a_torch_file(tmp_path):
    folder = complete(tmp_path / "c")
    (folder / "pytorch_model.bin").write_text("")
    truncate(folder / "model.safetensors", 1)
    [problem] = checkpoint_problems(folder)
    assert problem.startswith("model.safetensors is truncated (")


def test_optimizer_and_scheduler_must_be_torch_files_unless_saving_only_the_model(tmp_path):
    folder = complete(tmp_path / "c")
    truncate(folder / "optimizer.pt", 30)
    (folder / "scheduler.pt").write_text("not a zip")
    expected = [
        "optimizer.pt is truncated or not a torch file",
        "scheduler.pt is truncated or not a torch file",
    ]
    assert checkpoint_problems(folder) == expected
    assert checkpoint_problems(folder, save_only_model=True) == []
    assert is_complete_checkpoint(folder, save_only_model=True) and not is_complete_checkpoint(folder)
    assert (
        checkpoint_problems(complete(tmp_path / "model_only", save_only_model=True), save_only_model=True)
        == []
    )


def test_a_damaged_random_state_or_config_makes_the_checkpoint_incomplete(tmp_path):
    """The resume reads them too: a truncated rng_state.pth or config.json stopped it inside transformers with
    an error naming no file, and resume_from_checkpoint=True did not fall back to the older checkpoint."""
    folder = complete(tmp_path / "c")
    (folder / "rng_state_1.pth").write_bytes(b"PK\x03\x04 cut short")
    (folder / "config.json").write_text('{"model_type": "bert"')
    (folder / "ipu_config.json").write_text("{}")  # present and valid: fine
    problems = checkpoint_problems(folder)
    assert problems[0] == "rng_state_1.pth is truncated or not a torch file"
    assert problems[1].startswith("config.json is not valid JSON (JSONDecodeError")
    assert len(problems) == 2


# -- finding the newest complete checkpoint ---------------------------------------------------------------


def test_get_last_checkpoint_agrees_with_transformers_when_every_folder_is_complete(tmp_path):
    for step in (2, 9, 10, 100):
        complete(tmp_path / f"checkpoint-{step}", step)
    (tmp_path / "checkpoint-200").write_text("")  # a file with the name: not a checkpoint for either
    complete(tmp_path / "checkpoint-300x")
    complete(tmp_path / "xcheckpoint-400")
    complete(tmp_path / f"{STAGING_PREFIX}500")
    reference = hf_trainer_utils.get_last_checkpoint(str(tmp_path))
    assert get_last_checkpoint(tmp_path) == reference == str(tmp_path / "checkpoint-100")
    assert get_last_checkpoint(str(tmp_path)) == reference


def test_get_last_checkpoint_skips_incomplete_ones_newest_first_and_says_why(tmp_path, caplog):
    complete(tmp_path / "checkpoint-9")
    (tmp_path / "checkpoint-10").mkdir()
    (tmp_path / "checkpoint-11").mkdir()
    (tmp_path / "checkpoint-11" / "trainer_state.json").write_text('{"global_step": 11}')
    with caplog.at_level(logging.INFO, logger="optimum_ipu"):
        assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-9")
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.WARNING]
    assert [r.getMessage() for r in caplog.records] == [
        f"Skipping {tmp_path / 'checkpoint-11'}: not a complete checkpoint "
        "(no weights (model.safetensors); no optimizer.pt; no scheduler.pt).",
        f"Skipping {tmp_path / 'checkpoint-10'}: not a complete checkpoint "
        "(no trainer_state.json; no weights (model.safetensors); no optimizer.pt; no scheduler.pt).",
    ]


def test_get_last_checkpoint_passes_save_only_model_on(tmp_path):
    complete(tmp_path / "checkpoint-1")
    complete(tmp_path / "checkpoint-2", save_only_model=True)
    assert get_last_checkpoint(tmp_path, save_only_model=True) == str(tmp_path / "checkpoint-2")
    assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-1")


def test_get_last_checkpoint_of_nothing_is_none(tmp_path, caplog):
    assert get_last_checkpoint(tmp_path / "absent") is None
    (tmp_path / "file").write_text("")
    assert get_last_checkpoint(tmp_path / "file") is None
    (tmp_path / "checkpoint-1").mkdir()
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        assert get_last_checkpoint(tmp_path) is None
    assert len(caplog.records) == 1


def test_check_resumable_returns_a_complete_path_as_a_string(tmp_path):
    folder = complete(tmp_path / "checkpoint-3")
    assert check_resumable(folder) == str(folder)
    model_only = complete(tmp_path / "checkpoint-4", save_only_model=True)
    assert check_resumable(model_only, save_only_model=True) == str(model_only)


def test_check_resumable_names_what_is_missing_and_the_newest_complete_checkpoint(tmp_path):
    complete(tmp_path / "checkpoint-2")
    complete(tmp_path / "checkpoint-5", save_only_model=True)
    broken = complete(tmp_path / "checkpoint-7", save_only_model=True)
    with pytest.raises(FileNotFoundError) as error:
        check_resumable(broken)
    assert str(error.value) == (
        f"Cannot resume from {broken}: it is not a complete checkpoint (no optimizer.pt; no scheduler.pt). It was "
        f"probably written by a run that was killed while saving; resume from {tmp_path / 'checkpoint-2'} (the "
        "newest complete one) instead, or delete the folder."
    )
    os.remove(broken / "trainer_state.json")
    with pytest.raises(
        FileNotFoundError, match=r"\(no trainer_state.json\).*resume from .*checkpoint-5 \(the newest"
    ):
        check_resumable(broken, save_only_model=True)


def test_check_resumable_without_a_complete_sibling_says_start_without_resuming(tmp_path):
    broken = tmp_path / "out" / "checkpoint-7"
    broken.mkdir(parents=True)
    with pytest.raises(
        FileNotFoundError, match=r"killed while saving; start without --resume_from_checkpoint, or "
    ):
        check_resumable(broken)
    with pytest.raises(FileNotFoundError, match=r"there is no such folder; start without --resume_from_checkpoint\.$"):
        check_resumable(tmp_path / "absent" / "checkpoint-1")


def test_resuming_from_a_checkpoint_that_was_never_written_names_the_newest_there_is(tmp_path):
    """The external_model notebook resumes from `checkpoint-500`, which a shorter run never wrote: no
    talk of a run killed while saving, and the checkpoint the run did write is named."""
    complete(tmp_path / "checkpoint-10")
    with pytest.raises(FileNotFoundError) as error:
        check_resumable(tmp_path / "checkpoint-500")
    assert str(error.value) == (
        f"Cannot resume from {tmp_path / 'checkpoint-500'}: there is no such folder; resume from "
        f"{tmp_path / 'checkpoint-10'} (the newest complete one) instead."
    )


# -- flushing, staging and publishing ---------------------------------------------------------------------


def _tree(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    for name in ("a", "sub/b", "sub/deeper/c"):
        (root / name).write_text(name)
    return root


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_flush_tree_syncs_every_file_and_each_folder_after_its_contents(tmp_path, monkeypatch):
    root = _tree(tmp_path / "t")
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
    before = _open_descriptors()
    flush_tree(root)
    assert _open_descriptors() == before  # every descriptor opened is closed
    expected = {str(root), str(root / "sub"), str(root / "sub" / "deeper"), str(root / "a"), str(root / "sub" / "b"),
                str(root / "sub" / "deeper" / "c")}  # fmt: skip
    assert sorted(synced) == sorted(expected)
    for path in synced:  # a folder's entries are flushed only after what they point to
        assert all(
            synced.index(inside) < synced.index(path) for inside in synced if inside.startswith(path + "/")
        )


def test_flush_tree_goes_on_where_the_file_system_refuses_fsync(tmp_path, monkeypatch):
    root = _tree(tmp_path / "t")
    calls = []

    def refuse(fd):
        calls.append(fd)
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "fsync", refuse)
    before = _open_descriptors()
    flush_tree(root)
    assert len(calls) == 6 and _open_descriptors() == before


def test_staging_folders_are_outside_both_checkpoint_name_patterns(tmp_path):
    staged = staging_folder(tmp_path, 12)
    assert staged == tmp_path / ".incomplete-checkpoint-12"
    assert staging_folder(str(tmp_path), 12) == staged
    staged.mkdir()
    (staged / "checkpoint-12").mkdir()
    assert hf_trainer_utils.get_last_checkpoint(str(tmp_path)) is None  # transformers' search ignores it
    assert hf_trainer_utils.sort_checkpoints(str(tmp_path)) == []  # and so does its rotation glob


def test_leftover_staging_folders_are_removed_with_one_log_line(tmp_path, caplog):
    for name in (f"{STAGING_PREFIX}5", f"{STAGING_PREFIX}3", f"{STAGING_PREFIX}checkpoint-2-rotated"):
        _tree(tmp_path / name)
    complete(tmp_path / "checkpoint-4")
    (tmp_path / f"{STAGING_PREFIX}9").write_text("a file, not a staging folder")
    with caplog.at_level(logging.INFO, logger="optimum_ipu"):
        removed = remove_leftover_staging(tmp_path)
    names = [f"{STAGING_PREFIX}3", f"{STAGING_PREFIX}5", f"{STAGING_PREFIX}checkpoint-2-rotated"]
    assert removed == [tmp_path / n for n in names]
    assert sorted(os.listdir(tmp_path)) == [f"{STAGING_PREFIX}9", "checkpoint-4"]
    assert [r.getMessage() for r in caplog.records] == [
        f"Removed 3 incomplete checkpoint(s) left by an interrupted run: {', '.join(names)}"
    ]
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    caplog.clear()
    assert remove_leftover_staging(tmp_path) == [] and caplog.records == []
    assert remove_leftover_staging(tmp_path / "absent") == []


def test_a_leftover_that_cannot_be_deleted_does_not_stop_the_save(tmp_path, monkeypatch):
    stuck = _tree(tmp_path / f"{STAGING_PREFIX}3")
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path) == "a":  # shutil.rmtree unlinks by name inside the folder
            raise PermissionError(13, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    assert remove_leftover_staging(tmp_path) == [stuck]


def test_publish_flushes_the_staged_folder_before_renaming_it(tmp_path, monkeypatch):
    staged = _tree(tmp_path / ".incomplete-checkpoint-4" / "checkpoint-4")
    final = tmp_path / "checkpoint-4"
    seen = []
    monkeypatch.setattr(folders, "flush_tree", lambda path: seen.append((Path(path), final.exists())))
    synced = []
    monkeypatch.setattr(folders, "_fsync", lambda path: synced.append((path, final.is_dir())))
    publish(staged, final)
    assert seen == [(staged, False)]
    assert synced == [(tmp_path, True)]  # the run folder's new entry is flushed after the rename
    assert (final / "sub" / "deeper" / "c").read_text() == "sub/deeper/c"
    assert not staged.exists()


def test_publishing_a_step_again_replaces_it_and_leaves_no_old_copy(tmp_path):
    final = tmp_path / "checkpoint-4"
    final.mkdir()
    (final / "old").write_text("old")
    leftover = tmp_path / f"{STAGING_PREFIX}checkpoint-4-replaced"  # left by a kill during an earlier replace
    _tree(leftover)
    staged = _tree(tmp_path / ".incomplete-checkpoint-4" / "checkpoint-4")
    publish(str(staged), str(final))
    assert sorted(os.listdir(final)) == ["a", "sub"]
    assert sorted(os.listdir(tmp_path)) == [".incomplete-checkpoint-4", "checkpoint-4"]


def test_an_old_copy_that_cannot_be_deleted_does_not_stop_the_publish(tmp_path, monkeypatch):
    final = tmp_path / "checkpoint-4"
    final.mkdir()
    (final / "old").write_text("old")
    staged = _tree(tmp_path / ".incomplete-checkpoint-4" / "checkpoint-4")
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path) == "old":
            raise PermissionError(13, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    publish(staged, final)
    monkeypatch.undo()
    assert sorted(os.listdir(final)) == ["a", "sub"]
    replaced = tmp_path / f"{STAGING_PREFIX}checkpoint-4-replaced"
    assert remove_leftover_staging(tmp_path) == [tmp_path / ".incomplete-checkpoint-4", replaced]


@pytest.mark.parametrize("fail_at", range(4))
def test_publish_interrupted_at_any_step_leaves_the_old_or_the_new_checkpoint_or_none(
    tmp_path, monkeypatch, fail_at
):
    """A kill between any two file operations: `checkpoint-4` is the old complete one, the new one, or absent."""
    old = complete(tmp_path / "checkpoint-4", step=4)
    (old / "which").write_text("old")
    staged = complete(tmp_path / ".incomplete-checkpoint-4" / "checkpoint-4", step=4)
    (staged / "which").write_text("new")
    calls = {"n": 0}

    def interrupt(real):
        def wrapped(*args, **kwargs):
            if calls["n"] == fail_at:
                raise KeyboardInterrupt
            calls["n"] += 1
            return real(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(os, "replace", interrupt(os.replace))
    monkeypatch.setattr(shutil, "rmtree", interrupt(shutil.rmtree))
    with pytest.raises(KeyboardInterrupt):
        publish(staged, old)
    monkeypatch.undo()
    final = tmp_path / "checkpoint-4"
    if final.exists():
        assert checkpoint_problems(final) == [] and (final / "which").read_text() in ("old", "new")
    assert get_last_checkpoint(tmp_path) in (None, str(final))
    remove_leftover_staging(tmp_path)  # the next save clears what the kill left
    assert [n for n in os.listdir(tmp_path) if n.startswith(STAGING_PREFIX)] == []


# -- rotation ------------------------------------------------------------------------------------------------


def _saves(folder: Path, steps) -> None:
    folder.mkdir(exist_ok=True)
    for step in steps:
        (folder / f"checkpoint-{step}").mkdir(parents=True)
        (folder / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))


CASES = [(n, limit, best) for n in range(0, 6) for limit in range(1, 5) for best in [None, *range(n)]]


@pytest.mark.parametrize("n, limit, best", CASES)
def test_rotation_keeps_what_transformers_rotation_keeps(tmp_path, n, limit, best):
    """transformers' rotate_checkpoints (ordered by step) is the reference: newest and best kept, then the newest."""
    steps = [2 * (i + 1) for i in range(n)]  # 2, 4, ..., some of them above 9 (ordered as numbers)
    steps = [s if s < 8 else s + 2 for s in steps]
    ours, reference = tmp_path / "ours", tmp_path / "reference"
    _saves(ours, steps)
    _saves(reference, steps)
    best_name = f"checkpoint-{steps[best]}" if best is not None else None
    newest = [str(ours / f"checkpoint-{steps[-1]}")] if steps else []
    removed = rotate(ours, limit, [*newest, str(ours / best_name) if best_name else None])
    hf_trainer_utils.rotate_checkpoints(
        str(reference), limit, str(reference / best_name) if best_name else None
    )
    assert sorted(os.listdir(ours), key=lambda n: int(n.split("-")[1])) == \
        sorted(os.listdir(reference), key=lambda n: int(n.split("-")[1]))  # fmt: skip
    gone = [f"checkpoint-{s}" for s in steps if not (ours / f"checkpoint-{s}").exists()]
    assert [p.name for p in removed] == gone  # oldest first


@pytest.mark.parametrize("limit", [None, 0, -1])
def test_no_rotation_without_a_positive_limit(tmp_path, limit):
    _saves(tmp_path, [1, 2, 3])
    assert rotate(tmp_path, limit, [str(tmp_path / "checkpoint-3")]) == []
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]


def test_rotation_keeps_every_protected_checkpoint_even_beyond_the_limit(tmp_path):
    _saves(tmp_path, [1, 2, 3, 4])
    best = tmp_path / "checkpoint-2"
    removed = rotate(str(tmp_path), 1, [str(tmp_path / "checkpoint-4"), str(best), None])
    assert [p.name for p in removed] == ["checkpoint-1", "checkpoint-3"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-4"]


def test_rotation_recognises_a_protected_folder_by_another_spelling_of_its_path(tmp_path, monkeypatch):
    _saves(tmp_path, [1, 2, 3])
    monkeypatch.chdir(tmp_path)
    rotate(tmp_path, 1, [str(tmp_path / "checkpoint-3"), "checkpoint-1"])  # a relative best path
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1", "checkpoint-3"]


def test_rotation_renames_a_checkpoint_away_before_deleting_it(tmp_path, monkeypatch, caplog):
    _saves(tmp_path, [1, 2, 3])
    deleted = []
    real = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        deleted.append((Path(path).name, sorted(os.listdir(tmp_path))))
        real(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    with caplog.at_level(logging.INFO, logger="optimum_ipu"):
        rotate(tmp_path, 1, [str(tmp_path / "checkpoint-3")])
    first, second = f"{STAGING_PREFIX}checkpoint-1-rotated", f"{STAGING_PREFIX}checkpoint-2-rotated"
    assert deleted == [(first, [first, "checkpoint-2", "checkpoint-3"]), (second, [second, "checkpoint-3"])]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-3"]
    assert [r.getMessage() for r in caplog.records] == [
        "Deleted checkpoint-1, checkpoint-2 (save_total_limit=1)."
    ]


def test_a_rotated_checkpoint_that_cannot_be_deleted_does_not_stop_the_save(tmp_path, monkeypatch):
    _saves(tmp_path, [1, 2])
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path) == "trainer_state.json":
            raise PermissionError(13, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    assert [p.name for p in rotate(tmp_path, 1, [str(tmp_path / "checkpoint-2")])] == ["checkpoint-1"]
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == [f"{STAGING_PREFIX}checkpoint-1-rotated", "checkpoint-2"]
    assert remove_leftover_staging(tmp_path) == [tmp_path / f"{STAGING_PREFIX}checkpoint-1-rotated"]


def test_rotation_with_nothing_to_delete_logs_nothing(tmp_path, caplog):
    _saves(tmp_path, [1, 2])
    with caplog.at_level(logging.INFO, logger="optimum_ipu"):
        assert rotate(tmp_path, 3, [str(tmp_path / "checkpoint-2")]) == []
    assert caplog.records == []
