"""GPT-NeoX's own Pythia-160M config file (its `attention_config` selects flash attention)
trains here on a CPU machine without flash-attn: torch SDPA runs instead and the log says so.
Only what this machine cannot run is overridden: data and tokenizer paths, fp16 (a GPU feature),
and the size of the run."""

import math
from pathlib import Path

import pytest

from tests.runs import explain, launch_in_process, read_metrics, tiny_overrides

PYTHIA = Path(__file__).resolve().parents[1] / "neox_arguments" / "data" / \
    "neox_pythia_160M_flash.yml"


@pytest.mark.slow
def test_gpt_neox_pythia_160m_config_trains_on_cpu(small_data, tmp_path):
    prefix, tok = small_data
    run = tmp_path / "run"
    over = tiny_overrides(prefix, tok, run, num_gpus=1, train_iters=2, log_interval=1,
                          eval_interval=100, checkpoint_factor=100, seq_length=64,
                          train_micro_batch_size_per_gpu=1, tokenizer_type="HFTokenizer",
                          fp16="{enabled: false}", extra_save_iters="null",
                          lr_decay_iters="null")
    proc = launch_in_process("train.py", str(PYTHIA), *over)
    assert proc.returncode == 0, explain(proc)
    assert "attention 'flash': flash-attn is not installed; torch SDPA computes the same " \
           "attention" in proc.stdout + proc.stderr
    train, _ = read_metrics(run / "logs")
    assert [r["iteration"] for r in train] == [1, 2]
    # near ln(2048) at initialisation: the small data's tokenizer has 2048 ids
    assert all(abs(r["lm_loss"] - math.log(2048)) < 1.0 for r in train), train
