"""Finding the checkpoint to load: each way it can be missing gives a one-line error that says
what to do; a config whose model differs from the checkpoint's is refused by name."""

import dataclasses

import pytest

from megatron.checkpointing.model_shape import check_architecture
from megatron.checkpointing.locate import checkpoint_dir
from tests.text_generation.models import small_config


def test_missing_checkpoints_are_explained(tmp_path):
    with pytest.raises(ValueError, match="'load' is not set; set load to the directory"):
        checkpoint_dir(None, None)
    with pytest.raises(FileNotFoundError, match=r"checkpoint directory .*nowhere \(config key "
                       r"'load'\) does not exist"):
        checkpoint_dir(str(tmp_path / "nowhere"), None)
    (tmp_path / "global_step5").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no checkpoint to load in .*: it has no "
                       r"'latest' file \(checkpoints found: global_step5\); pick one with "
                       r"iteration=<N> \(--iteration in the tools\) or give its global_step<N> "
                       r"directory"):
        checkpoint_dir(str(tmp_path), None)
    assert checkpoint_dir(str(tmp_path), 5) == tmp_path / "global_step5"
    with pytest.raises(FileNotFoundError, match=r"global_step7 \(iteration=7\) does not exist; "
                       r"saved iterations in .*: 5"):
        checkpoint_dir(str(tmp_path), 7)
    (tmp_path / "latest").write_text("global_step5")
    assert checkpoint_dir(str(tmp_path), None) == tmp_path / "global_step5"


def test_a_config_whose_model_differs_from_the_checkpoint_is_refused_by_name(tmp_path):
    saved = small_config()
    check_architecture(dataclasses.replace(saved, seq_length=16, hidden_dropout=0.1), saved,
                       tmp_path)  # inference-time settings may differ
    with pytest.raises(ValueError, match=r"differs from the checkpoint .* \(num_layers: 3 in this "
                       r"run's config vs 2 in the checkpoint's; norm: 'rmsnorm' in this run's "
                       r"config vs 'layernorm' in the checkpoint's\); use the model config"):
        check_architecture(dataclasses.replace(saved, num_layers=3, norm="rmsnorm"), saved,
                           tmp_path)
