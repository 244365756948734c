"""A24 in one process: which checkpoint is tried first, what counts as damaged, and the error
when nothing verifies. The checkpoints are written by our manifest code without DeepSpeed."""

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from megatron.checkpointing import NoValidCheckpointError, load_checkpoint
from megatron.checkpointing.durable import write_bytes
from megatron.checkpointing.locate import find_candidates, verify_checkpoint
from megatron.checkpointing.manifest import FileEntry, Manifest, write_manifest
from megatron.mpu.topology import Topology
from megatron.neox_arguments import NeoXArgs
from tests.runs import ROOT


ENGINE = SimpleNamespace(topology=Topology(1, 1, 1),
                         engine=SimpleNamespace(module=torch.nn.Linear(2, 2)))


def fabricate(root: Path, iteration: int) -> Path:
    directory = root / f"global_step{iteration}"
    (directory / "rng").mkdir(parents=True)
    files = {}
    for name, data in (("mp_rank_00_model_states.pt", bytes(range(256)) * 4),
                       ("rng/rank_0.pt", b"rng" * 10)):
        rec = write_bytes(data, directory / name)
        files[name] = FileEntry(rec.size, rec.sha256, 0)
    write_manifest(directory, Manifest(iteration=iteration, tag=directory.name, run={},
                                       contents={}, client_state={"iteration": iteration},
                                       config={}, files=files))
    (root / "latest").write_text(directory.name)
    return directory


@pytest.fixture
def ckpts(tmp_path):
    root = tmp_path / "ckpt"
    for i in (2, 4, 6):
        fabricate(root, i)
    return root


def test_latest_first_then_newest_first(ckpts):
    (ckpts / "latest").write_text("global_step4")
    assert find_candidates(ckpts, None) == (["global_step4", "global_step6", "global_step2"], [])


def test_latest_naming_nothing_is_reported_and_all_checkpoints_are_candidates(ckpts):
    (ckpts / "latest").write_text("global_step8")
    tags, notes = find_candidates(ckpts, None)
    assert tags == ["global_step6", "global_step4", "global_step2"]
    assert notes == [f"{ckpts / 'latest'} names 'global_step8' but {ckpts / 'global_step8'} does "
                     "not exist; loading the newest checkpoint that verifies instead"]


def test_a_chosen_iteration_that_does_not_exist_lists_the_saved_ones(ckpts):
    with pytest.raises(FileNotFoundError, match=r"iteration=5\) does not exist; saved iterations "
                                                r".*: 2, 4, 6"):
        find_candidates(ckpts, 5)


def test_nothing_saved_means_a_fresh_start(tmp_path):
    assert find_candidates(tmp_path / "none", None) == ([], [])


def test_a_load_directory_without_checkpoints_starts_fresh(tmp_path, caplog):
    args = NeoXArgs.from_ymls([ROOT / "configs" / "tiny.yml"], {
        "load": str(tmp_path / "none"), "save": None, "num_gpus": 1})
    with caplog.at_level("INFO", logger="megatron"):
        assert load_checkpoint(ENGINE, args.checkpoint) == {}
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert f"no checkpoint in {tmp_path / 'none'}: starting from iteration 0" in caplog.text
    # a load that does not exist, apart from save: mistyped or moved, said as a warning
    caplog.clear()
    with caplog.at_level("INFO", logger="megatron"):
        assert load_checkpoint(ENGINE, args.replace(save=str(tmp_path / "out")).checkpoint) == {}
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"load {tmp_path / 'none'} does not exist (save is {tmp_path / 'out'}): starting from "
        "iteration 0; fix load if this run should go on from a checkpoint"]


@pytest.mark.parametrize("exists", [False, True])
def test_a_fine_tune_from_no_checkpoint_is_refused_before_the_workers(small_data, tmp_path,
                                                                      exists):
    """GPT-NeoX would train from random weights; a fine-tune from nothing is a wrong path."""
    from megatron.preflight import preflight

    if exists:
        (tmp_path / "none").mkdir()
    prefix, tok = small_data
    args = NeoXArgs.from_ymls([ROOT / "configs" / "tiny.yml"], {
        "load": str(tmp_path / "none"), "save": str(tmp_path / "out"), "num_gpus": 1,
        "finetune": True, "log_dir": str(tmp_path / "logs"), "data_path": prefix,
        "vocab_file": tok})
    state = "holds no checkpoint" if exists else "does not exist"
    expected = (f"finetune is true but load {tmp_path / 'none'} {state}: a fine-tune starts "
                "from the weights there")
    with pytest.raises(FileNotFoundError, match=re.escape(expected)):
        preflight(args, "train.py")
    with pytest.raises(FileNotFoundError, match=re.escape(expected)):  # the workers, too
        load_checkpoint(ENGINE, args.checkpoint)
    assert not (tmp_path / "out").exists()
    unset = args.replace(load=None)  # no load at all (a setup file left out)
    with pytest.raises(FileNotFoundError, match="finetune is true but load is not set: "):
        preflight(unset, "train.py")
    with pytest.raises(FileNotFoundError, match="finetune is true but load is not set: "):
        load_checkpoint(ENGINE, unset.checkpoint)


@pytest.mark.parametrize("damage, expected", [
    ("truncate", "bytes but the manifest recorded 1024 (truncated)"),
    ("flip", "differs from the manifest's"),
    ("manifest", "manifest.json: missing"),
    ("delete", "missing (the manifest lists it with 1024 bytes)"),
])
def test_damage_is_found_and_named(ckpts, damage, expected):
    directory = ckpts / "global_step6"
    shard = directory / "mp_rank_00_model_states.pt"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        shard.write_bytes(data[:100])
    elif damage == "flip":
        data[500] ^= 0x10
        shard.write_bytes(bytes(data))
    elif damage == "manifest":
        (directory / "manifest.json").unlink()
    else:
        shard.unlink()
    manifest, problems = verify_checkpoint(directory)
    assert manifest is None and len(problems) == 1 and expected in problems[0]
    assert verify_checkpoint(ckpts / "global_step4")[1] == []


def test_when_nothing_verifies_the_error_lists_every_checkpoint_and_what_is_wrong(ckpts, caplog):
    for i in (2, 4, 6):
        (ckpts / f"global_step{i}" / "rng" / "rank_0.pt").write_bytes(b"x")
    args = NeoXArgs.from_ymls([ROOT / "configs" / "tiny.yml"],
                              {"load": str(ckpts), "save": None, "num_gpus": 1})
    engine = SimpleNamespace(topology=Topology(1, 1, 1),
                             engine=SimpleNamespace(module=torch.nn.Linear(2, 2)))
    with pytest.raises(NoValidCheckpointError) as err, caplog.at_level(logging.WARNING):
        load_checkpoint(engine, args.checkpoint)
    text = str(err.value)
    assert f"no checkpoint in {ckpts} can be loaded" in text
    assert "damaged" not in caplog.text  # each problem is said once, in the error
    for i in (2, 4, 6):
        assert f"{ckpts / f'global_step{i}' / 'rng' / 'rank_0.pt'}: 1 bytes" in text
