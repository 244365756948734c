"""Every YAML under configs/ loads and validates; configs/README.md is current; no torch import."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from neox_args_helpers import REPO, stack

from megatron.neox_arguments import NeoXArgs, deepspeed_config
from megatron.neox_arguments.docs import main as docs_main

CONFIGS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "configs").rglob("*.yml"))


def test_configs_are_found():
    assert "configs/tiny.yml" in CONFIGS and "configs/pythia/70M.yml" in CONFIGS
    assert {"configs/llama/65B.yml", "configs/llama2/codellama_34B.yml", "configs/mistral/7B.yml",
            "configs/llemma/34B.yml", "configs/post-training/tiny_dpo.yml"} <= set(CONFIGS)
    assert len(CONFIGS) == 41


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_config_loads_and_validates(name):
    raw = yaml.safe_load((REPO / name).read_text())
    args = NeoXArgs.from_ymls(stack(name))
    replica = raw.get("model_parallel_size", 1) * max(raw.get("pipe_parallel_size", 0), 1)
    assert args.derived.world_size == (args.num_gpus or replica)
    assert len(args.derived.attention_types) == args.num_layers
    ds = deepspeed_config(args)
    assert ds["train_batch_size"] == args.derived.train_batch_size
    assert "optimizer" not in ds and "scheduler" not in ds


def test_tiny_is_the_make_train_model():
    args = NeoXArgs.from_ymls([REPO / "configs/tiny.yml"])
    m = args.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length) == (4, 128, 4, 128)
    assert (m.pos_emb, m.rotary_pct, m.norm, m.activation) == ("rotary", 0.25, "layernorm", "gelu")
    assert args.derived.world_size == 2 and args.derived.train_batch_size == 16
    assert args.derived.precision == "fp32" and args.derived.warmup_iters == 10
    assert (args.lr, args.betas, args.eps) == (2e-3, (0.9, 0.95), 1e-8)
    assert args.tensorboard_dir is None and args.use_wandb is False
    assert args.derived.save_iters == (100,)


def test_tiny_llama_is_llama_style():
    args = NeoXArgs.from_ymls([REPO / "configs/tiny_llama.yml"])
    m = args.model
    assert (m.norm, m.activation, m.num_kv_heads) == ("rmsnorm", "swiglu", 2)
    assert not (m.use_bias_in_norms or m.use_bias_in_attn_linear or m.use_bias_in_mlp)
    assert args.derived.intermediate_size == 192  # int(512 * 2 / 3) // 2 = 170 -> multiple of 64


def test_gpt_neox_20b_needs_its_eight_ranks():
    from megatron.neox_arguments import ConfigError

    # num_gpus unset: checked against one model replica (2 * 4 ranks) until the launcher counts
    args = NeoXArgs.from_ymls([REPO / "configs/20B.yml"])
    assert args.derived.world_size == 8 and args.derived.train_batch_size == 4 * 32
    assert args.derived.is_pipe_parallel and args.with_world_size(96).derived.data_parallel_size == 12
    with pytest.raises(ConfigError, match=r"model_parallel_size\(2\) \* pipe_parallel_size\(4\) = 8"):
        NeoXArgs.from_ymls([REPO / "configs/20B.yml"], ["num_gpus=4"])
    with pytest.raises(ConfigError, match=r"world_size\(12\) is not divisible"):
        args.with_world_size(12)


def test_readme_is_current(capsys):
    assert docs_main(["--check"]) == 0, "run: python -m megatron.neox_arguments.docs"


def test_docs_check_reports_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "README.md"
    stale.write_text("old\n")
    assert docs_main(["--check", "--output", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err
    assert docs_main(["--output", str(stale)]) == 0
    assert "| `hidden_size` |" in stale.read_text()


def test_import_does_not_import_torch():
    code = (
        "import sys; import megatron.neox_arguments as n; "
        "n.NeoXArgs.from_ymls(['configs/tiny.yml']); "
        "print('torch' in sys.modules, 'deepspeed' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False"]
