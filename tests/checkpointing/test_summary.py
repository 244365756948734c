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
    assert "layout: tp 2, pp 1, dp None, zero_stage None, precision fp32" in out
    assert "model: num_layers 4, hidden_size 128, num_attention_heads 4" in out
    assert "holds: weights\n" in out
    assert "verified: every file matches its size and sha256" in out


def test_damage_is_named_file_by_file(save_dir, capsys):
    step = save_dir / "global_step3"
    flipped = step / "layer_01-model_01-model_states.pt"
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    truncated = step / "layer_00-model_00-model_states.pt"
    truncated.write_bytes(truncated.read_bytes()[:100])
    assert inspect_checkpoint.main([str(step)]) == 1  # sizes only: the truncation
    out = capsys.readouterr().out
    assert f"{truncated}: 100 bytes" in out and str(flipped) not in out
    assert inspect_checkpoint.main([str(save_dir), "--iteration", "3", "--verify"]) == 1
    out = capsys.readouterr().out
    assert "2 problem(s)" in out and f"{flipped}: sha256" in out


def test_a_missing_iteration_names_the_saved_ones(save_dir, capsys):
    assert inspect_checkpoint.main([str(save_dir), "--iteration", "9"]) == 2
    assert f"{save_dir / 'global_step9'} (iteration=9) does not exist; saved iterations in " \
        f"{save_dir}: 3" in (
        capsys.readouterr().err)
