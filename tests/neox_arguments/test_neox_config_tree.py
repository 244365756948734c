"""GPT-NeoX's whole configs/ tree (59 files, verbatim in data/gpt-neox/, see its README),
each merged as GPT-NeoX intends: what docs/gpt-neox.md says of each, that it loads unchanged
or is refused naming what it needs, holds file by file."""

from __future__ import annotations

import pytest

from neox_args_helpers import DATA

from megatron.neox_arguments import ConfigError, NeoXArgs

NEOX = DATA / "gpt-neox"
# post-training/ holds the post-training configs, which GPT-NeoX keeps outside configs/
TREE = sorted(p.relative_to(NEOX).as_posix() for p in NEOX.rglob("*.yml")
              if not p.relative_to(NEOX).as_posix().startswith("post-training/"))
# setup files GPT-NeoX merges after a model config
ON_125M = {"local_setup.yml", "local_setup_comet.yml", "local_setup_wandb.yml",
           "text_generation.yml", "slurm_local.yml", "eleutherai_cluster.yml",
           "docker/pythia-paths.yml", "cpu_mock_config.yml", "prof.yml"}
# each refused file, and what its refusal names (docs/gpt-neox.md's table)
REFUSED = {
    "rwkv/170M.yml": "rwkv",
    "gmlp_small.yml": "gmlp",
    "1-3B-transformer-engine.yml": "te_",
    "bnb_125M.yml": "use_bnb_optimizer",
    "sparse.yml": "sparsity_config",
    "llemma/7B.yml": "decay_lr_to",
    "llemma/34B.yml": "attention_type",
}


def merged(name: str) -> list:
    """The files GPT-NeoX runs `name` with, in order (as docs/gpt-neox.md describes)."""
    if name in ON_125M:
        return [NEOX / "125M.yml", NEOX / name]
    if name == "llama/train_config.yml":
        return [NEOX / "llama/7B.yml", NEOX / name]
    if name.split("/")[0] in ("llama", "llama2", "mistral"):
        return [NEOX / name, NEOX / "llama/train_config.yml"]
    return [NEOX / name]


def test_the_tree_is_gpt_neoxs_59_files_and_52_load():
    assert len(TREE) == 59
    assert len([name for name in TREE if name not in REFUSED]) == 52


@pytest.mark.parametrize("name", [n for n in TREE if n not in REFUSED])
def test_a_gpt_neox_config_loads_unchanged(name):
    args = NeoXArgs.from_ymls(merged(name))
    assert args.model.num_layers >= 1


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_gpt_neox_config_needing_what_is_not_here_is_refused_naming_it(name):
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls(merged(name))
    assert REFUSED[name] in str(e.value)
