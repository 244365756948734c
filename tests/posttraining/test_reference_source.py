"""Where a DPO/KTO run reads its reference model: the checkpoint it started from, recorded with
its manifest's digest, and read from `reference_load` once that checkpoint has moved - only if
it is the same checkpoint."""

from __future__ import annotations

import logging
import shutil

import pytest

from megatron.checkpointing.load import LOADED_FROM
from megatron.neox_arguments import NeoXArgs
from megatron.checkpointing.layout import manifest_digest
from megatron.training.reference_source import SOURCE_KEY, reference_source
from tests.runs import ROOT

PAIRS = {"dataset_impl": "pairwise", "pack_impl": "unpacked", "data_path": None,
         "train_impl": "dpo",
         **{f"{side}_{split}_data_paths": [f"{side}_{split}"] for side in ("pos", "neg")
            for split in ("train", "valid", "test")}}


def dpo_args(reference_load=None) -> NeoXArgs:
    return NeoXArgs.from_ymls([ROOT / "configs" / "tiny.yml"],
                              {**PAIRS, "reference_load": reference_load})


@pytest.fixture
def recorded(tmp_path):
    """A starting checkpoint's step directory (a manifest and a weights file) and the source a
    run that started from it records."""
    step = tmp_path / "sft" / "global_step60"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text('{"files": {"model.pt": {"size": 3}}}')
    (step / "model.pt").write_bytes(b"abc")
    source = reference_source(dpo_args(), {LOADED_FROM: str(step)})
    return step, source


def test_a_starting_run_records_the_checkpoint_it_loads_and_its_manifest_digest(recorded):
    step, source = recorded
    assert source == {"path": str(step), "iteration": 60,
                      "manifest_sha256": manifest_digest(step)}
    assert len(source["manifest_sha256"]) == 64
    # resumed without reference_load: the recorded source, as it is
    assert reference_source(dpo_args(), {SOURCE_KEY: source, LOADED_FROM: "x"}) == source


@pytest.mark.parametrize("point_at", ["root", "step"])
def test_a_moved_reference_is_read_from_reference_load(recorded, tmp_path, caplog, point_at):
    step, source = recorded
    moved = tmp_path / "elsewhere"
    shutil.move(str(step.parent), moved)
    target = moved if point_at == "root" else moved / "global_step60"
    with caplog.at_level(logging.INFO, logger="megatron.training.reference"):
        got = reference_source(dpo_args(str(target)), {SOURCE_KEY: source})
    assert got == {**source, "path": str((moved / "global_step60").absolute())}
    assert f"reference model moved: recorded {step}, read from {moved / 'global_step60'}" \
        in caplog.text


def test_a_renamed_step_directory_is_known_by_its_manifest(recorded, tmp_path):
    step, source = recorded
    renamed = tmp_path / "sft-start"
    shutil.move(str(step), renamed)
    assert reference_source(dpo_args(str(renamed)), {SOURCE_KEY: source})["path"] == \
        str(renamed.absolute())
    bare = tmp_path / "bare" / "global_step60"
    shutil.copytree(renamed, bare)
    (bare / "manifest.json").unlink()
    with pytest.raises(ValueError) as err:
        reference_source(dpo_args(str(bare.parent)), {SOURCE_KEY: source})
    assert str(err.value) == (f"reference_load({bare.parent}): {bare} has no manifest.json, so "
                              f"it cannot be compared with the reference checkpoint this run "
                              f"recorded, {step} (iteration 60)")


def test_another_checkpoint_at_reference_load_is_refused_naming_both(recorded, tmp_path):
    step, source = recorded
    recorded_as = f"the reference checkpoint this run recorded, {step} (iteration 60)"
    other = tmp_path / "other"
    shutil.copytree(step, other / "global_step60")
    (other / "global_step60" / "manifest.json").write_text('{"files": {"model.pt": {"size": 4}}}')
    with pytest.raises(ValueError) as err:
        reference_source(dpo_args(str(other)), {SOURCE_KEY: source})
    assert str(err.value).startswith(f"reference_load({other}): {other / 'global_step60'} is "
                                     f"another checkpoint than {recorded_as}: its manifest "
                                     "differs (sha256 ")
    shutil.copytree(step, other / "global_step59")
    with pytest.raises(ValueError) as err:
        reference_source(dpo_args(str(other / "global_step59")), {SOURCE_KEY: source})
    assert str(err.value) == (f"reference_load({other / 'global_step59'}): "
                              f"{other / 'global_step59'} is iteration 59, not {recorded_as}")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as err:
        reference_source(dpo_args(str(empty)), {SOURCE_KEY: source})
    assert str(err.value) == (f"reference_load({empty}): {empty / 'global_step60'} is not a "
                              f"directory; it should hold {recorded_as}")


def test_a_record_without_a_digest_is_matched_by_iteration_with_a_warning(recorded, tmp_path,
                                                                          caplog):
    step, source = recorded
    older = {"path": source["path"], "iteration": 60}  # what checkpoints recorded before
    with caplog.at_level(logging.WARNING, logger="megatron.training.reference"):
        got = reference_source(dpo_args(str(step.parent)), {SOURCE_KEY: older})
    assert got == {**older, "path": str(step.absolute()), "manifest_sha256":
                   manifest_digest(step)}
    assert "recorded no manifest digest to compare" in caplog.text
    renamed = tmp_path / "renamed"  # without a digest, only the name tells the iteration
    shutil.copytree(step, renamed)
    with pytest.raises(ValueError, match=r"recorded no manifest digest of its reference, so "
                                         r".*renamed must be named global_step60 to be taken"):
        reference_source(dpo_args(str(renamed)), {SOURCE_KEY: older})


def test_reference_load_on_a_run_that_starts_is_refused(recorded):
    step, _ = recorded
    with pytest.raises(ValueError) as err:
        reference_source(dpo_args(str(step)), {LOADED_FROM: str(step)})
    assert str(err.value) == (
        f"reference_load({step}) points to where a resumed run's reference checkpoint has "
        "moved, but this run records none: it starts, and its reference model is the "
        "checkpoint `load` names. Remove reference_load.")
