"""How checkpoint and model folders reach the disk (yatt.checkpoint.install_folder)."""

import os

from yatt import checkpoint
from yatt.checkpoint import install_folder


def test_a_folder_is_synced_file_by_file_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    """A rename alone survives a crash of the process, not of the machine: after a power loss
    the new folder could stand with empty files while older checkpoints were deleted."""
    staging, final = tmp_path / ".step_000002.tmp", tmp_path / "step_000002"
    (staging / "policy").mkdir(parents=True)
    (staging / "policy" / "model.safetensors").write_bytes(b"w" * 10)
    (staging / "trainer_state.pt").write_bytes(b"s")
    final.mkdir()
    (final / "old").write_text("from an earlier save of this step")
    events: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(descriptor):
        events.append("fsync " + os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    monkeypatch.setattr(
        os, "rename", lambda a, b: (events.append(f"rename {a}"), real_rename(a, b))
    )
    install_folder(staging, final)
    synced = {event.removeprefix("fsync ") for event in events if event.startswith("fsync")}
    assert {str(staging / "policy" / "model.safetensors"), str(staging / "trainer_state.pt"),
            str(staging / "policy"), str(staging), str(tmp_path)} <= synced  # fmt: skip
    renamed = [i for i, event in enumerate(events) if event == f"rename {staging}"]
    last_file_sync = max(i for i, e in enumerate(events) if e.startswith("fsync") and ".tmp" in e)
    assert renamed and last_file_sync < renamed[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000002"]
    assert (final / "trainer_state.pt").read_bytes() == b"s" and not (final / "old").exists()


def test_a_crashed_saves_staging_folder_is_cleared_at_the_next_save(tmp_path):
    from types import SimpleNamespace

    from yatt.config import load_config

    root = tmp_path / "checkpoints"
    (root / ".step_000001.tmp" / "policy").mkdir(parents=True)  # the process died mid-save
    saving = SimpleNamespace(save_pretrained=lambda folder, tokenizer: folder.mkdir(),
                             state_dict=lambda: {})  # fmt: skip
    checkpoint.save_training_checkpoint(
        tmp_path, 2, config=load_config("tiny_test"), policy=saving, tokenizer=None,
        trainer_state={},
    )  # fmt: skip
    assert sorted(p.name for p in root.iterdir()) == ["step_000002"]


def _save(run_dir, step, keep_last=2):
    from types import SimpleNamespace

    from yatt.config import load_config

    saving = SimpleNamespace(save_pretrained=lambda folder, tokenizer: folder.mkdir(),
                             state_dict=lambda: {})  # fmt: skip
    return checkpoint.save_training_checkpoint(
        run_dir, step, config=load_config("tiny_test"), policy=saving, tokenizer=None,
        trainer_state={}, keep_last=keep_last,
    )  # fmt: skip


def test_a_checkpoint_a_crash_left_set_aside_is_put_back_not_deleted(tmp_path):
    # The install sets the old step_1 aside, then renames the new one in: a crash between
    # the two left only .step_000001.old (whole) and the next save deleted it.
    first = _save(tmp_path, 1)
    first.rename(first.with_name(".step_000001.old"))
    _save(tmp_path, 2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_000001", "step_000002"]


def test_retired_checkpoints_are_renamed_aside_before_they_are_deleted(tmp_path, monkeypatch):
    # rmtree deletes in directory order: trainer_state.pt could outlive policy/, and resume=auto
    # then picked a half-deleted checkpoint. Now nothing lists a folder being deleted.
    for step in (1, 2):
        _save(tmp_path, step)
    seen = []
    real_rmtree = checkpoint.shutil.rmtree

    def rmtree(path, *args, **kwargs):
        seen.append(
            (os.path.basename(path), [p.name for p in checkpoint.list_checkpoints(tmp_path)])
        )
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree)
    _save(tmp_path, 3, keep_last=2)
    deleting = [listed for name, listed in seen if name == ".step_000001.del"]
    assert deleting and all("step_000001" not in listed for listed in deleting)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_000002", "step_000003"]
