"""When to save and what to delete: GPT-NeoX's checkpoint_factor rule, keep_last_n, leftovers."""

from megatron.checkpointing import should_save
from megatron.checkpointing.layout import leftovers, saved_iterations
from megatron.checkpointing.retention import apply_retention, remove_leftovers, to_delete


def test_linear_and_log_spacing_and_extra_iterations():
    assert [i for i in range(1, 31) if should_save(i, 10, "linear", None)] == [10, 20, 30]
    assert [i for i in range(1, 100) if should_save(i, 2, "log", None)] == [1, 2, 4, 8, 16, 32, 64]
    assert [i for i in range(1, 12) if should_save(i, None, "linear", [3, 7])] == [3, 7]
    assert not any(should_save(i, 0, "linear", None) for i in range(1, 10))


def test_to_delete_keeps_the_newest_and_never_a_protected_one():
    assert to_delete([10, 20, 30, 40], 2, protect={40}) == [10, 20]
    assert to_delete([10, 20, 30, 40], 2, protect={20}) == [10]
    assert to_delete([10, 20], None, protect=set()) == []


def test_apply_retention_never_deletes_the_checkpoint_latest_names(tmp_path):
    for i in (2, 4, 6, 8):
        (tmp_path / f"global_step{i}").mkdir()
    # the run resumed from 4 and re-saved it: 6 and 8 are newer but not current
    assert apply_retention(tmp_path, 1, "global_step4") == [2, 6]
    assert saved_iterations(tmp_path) == [4, 8]
    assert not leftovers(tmp_path)
    for i in (10, 12):
        (tmp_path / f"global_step{i}").mkdir()
    assert apply_retention(tmp_path, 1, "global_step12", in_use=("global_step4",)) == [8, 10]
    assert saved_iterations(tmp_path) == [4, 12]


def test_leftovers_of_interrupted_saves_are_removed_and_checkpoints_kept(tmp_path):
    for name in (".staging-global_step6", ".replaced-global_step4", ".deleting-global_step2",
                 "global_step4"):
        (tmp_path / name).mkdir()
    (tmp_path / ".staging-global_step6" / "mp_rank_00_model_states.pt").write_bytes(b"partial")
    (tmp_path / "latest.tmp.123").write_text("global_step6")
    (tmp_path / "latest").write_text("global_step4")
    assert len(remove_leftovers(tmp_path)) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step4", "latest"]


def _with_loss(root, iteration: int, loss) -> None:
    from megatron.checkpointing.manifest import Manifest, write_manifest

    step = root / f"global_step{iteration}"
    step.mkdir()
    write_manifest(step, Manifest(iteration=iteration, tag=step.name, run={}, contents={},
                                  client_state={"iteration": iteration, "last_loss": loss},
                                  config={}, files={}))


def test_the_newest_checkpoint_with_a_finite_loss_is_never_deleted(tmp_path):
    """A checkpoint whose recorded loss is not finite (written before the guard existed) never
    costs the run its last good one: a rollback returns there."""
    from megatron.checkpointing.locate import newest_good_iteration

    for i, loss in ((2, 5.0), (4, 4.0), (6, float("nan")), (8, float("inf"))):
        _with_loss(tmp_path, i, loss)
    assert newest_good_iteration(tmp_path) == 4
    assert apply_retention(tmp_path, 1, "global_step8") == [2, 6]
    assert saved_iterations(tmp_path) == [4, 8]
