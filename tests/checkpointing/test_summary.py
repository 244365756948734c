"""tools/ckpts/inspect_checkpoint.py: a checkpoint described without loading it, and damage
found file by file (exit status 1)."""

from __future__ import annotations

import sys

import pytest

from megatron.checkpointing.weights_only import write_weights_checkpoint
from megatron.model.config import model_config_from_args
from megatron.neox_arguments import NeoXArgs
from tests.runs import ROOT
from tests.text_generation.models import random_weights

sys.path.insert(0, str(ROOT / "tools" / "ckpts"))
import inspect_checkpoint  # noqa: E402


@pytest.fixture
def save_dir(tmp_path):
    args = NeoXArgs.from_ymls([ROOT / "configs" / "tiny.yml"], ["vocab_file=unused",
                                                                 "data_path=unused"])
    config = model_config_from_args(args, 256)
    write_weights_checkpoint(tmp_path / "ckpt", 3, random_weights(config), args, tp=2)
    return tmp_path / "ckpt"


def test_a_checkpoint_is_described_from_its_manifest(save_dir, capsys):
    assert inspect_checkpoint.main([str(save_dir), "--verify"]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint {save_dir / 'global_step3'} (format 1)" in out
    # written from weights alone: no data-parallel layout, no data position to report
    assert "\niteration 3\nlayout: tp 2, pp 1, precision fp32\n" in out
    model = next(line for line in out.splitlines() if line.startswith("model: "))
    assert model.startswith("model: num_layers 4, hidden_size 128, num_attention_heads 4")
    assert "mamba" not in model and "moe" not in model  # a dense transformer's unused keys
    assert "holds: weights\n" in out
    assert "verified: every file matches its size and sha256" in out


def test_damage_is_named_file_by_file(save_dir, capsys):
    step = save_dir / "global_step3"
    flipped = step / "layer_01-model_01-model_states.pt"
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    truncated = step / "layer_00-model_00-model_states.pt"
    lost = truncated.stat().st_size - 100
    truncated.write_bytes(truncated.read_bytes()[:100])
    assert inspect_checkpoint.main([str(step)]) == 1  # sizes only: the truncation
    out = capsys.readouterr().out
    assert f"{truncated}: 100 bytes" in out and str(flipped) not in out
    files = next(line for line in out.splitlines() if line.startswith("files: "))
    assert files.endswith(f" MiB on disk ({-lost:+,} bytes)"), files  # not only the recorded
    assert inspect_checkpoint.main([str(save_dir), "--iteration", "3", "--verify"]) == 1
    out = capsys.readouterr().out
    assert "2 problem(s)" in out and f"{flipped}: sha256" in out


def test_a_missing_iteration_names_the_saved_ones(save_dir, capsys):
    assert inspect_checkpoint.main([str(save_dir), "--iteration", "9"]) == 2
    assert f"{save_dir / 'global_step9'} (iteration=9) does not exist; saved iterations in " \
        f"{save_dir}: 3" in (
        capsys.readouterr().err)


def test_a_checkpoint_given_with_another_iteration_and_an_empty_latest_are_named(save_dir,
                                                                                  capsys):
    step = save_dir / "global_step3"
    assert inspect_checkpoint.main([str(step), "--iteration", "3"]) == 0
    assert inspect_checkpoint.main([str(step), "--iteration", "4"]) == 2
    assert capsys.readouterr().err == (
        f"error: {step} is one checkpoint (iteration 3), but iteration=4 asks for another: give "
        f"the directory that holds them ({save_dir}) with iteration=4, or this one without "
        "iteration\n")
    (save_dir / "latest").write_text("")
    assert inspect_checkpoint.main([str(save_dir)]) == 2
    assert f"no checkpoint to load in {save_dir}: it has an empty 'latest' file (checkpoints " \
           "found: global_step3); pick one with iteration=<N>" in capsys.readouterr().err
