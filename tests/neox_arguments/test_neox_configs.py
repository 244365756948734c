"""GPT-NeoX's own config files (verbatim copies in data/gpt-neox/, see its README) load here
unchanged, merged as GPT-NeoX runs them; one that does not is refused naming the key."""

from __future__ import annotations

import pytest

from neox_args_helpers import DATA

from megatron.neox_arguments import ConfigError, NeoXArgs, deepspeed_config
from megatron.neox_arguments.load import read_yml

NEOX = DATA / "gpt-neox"


def test_cpu_mock_config_states_the_world_size():
    # GPT-NeoX's CPU tests merge it after a model config: one process
    args = NeoXArgs.from_ymls([NEOX / "125M.yml", NEOX / "cpu_mock_config.yml"])
    assert args.launcher.global_num_gpus == 1 and args.derived.world_size == 1
    # 125M.yml names a hostfile, so the launcher counts the world and it is checked then
    assert args.launcher.hostfile == "/mock_path"
    with pytest.raises(ConfigError, match=r"global_num_gpus\(1\) != world_size\(2\): the world "
                                          "size is derived from num_nodes and num_gpus"):
        args.with_world_size(2)


def test_slurm_config_loads_without_the_allocation():
    # the hostfile srun needs is asked for when deepy.py launches (tests/test_launcher.py)
    args = NeoXArgs.from_ymls([NEOX / "slurm_125M.yml"])
    la = args.launcher
    assert (la.launcher, la.deepspeed_slurm, la.comment, la.hostfile) == ("slurm", True, "neox", None)


def test_comet_setup_loads_on_the_125m_model():
    # GPT-NeoX merges local_setup*.yml after a model config; `{"test_others"}` is a YAML
    # mapping whose one key has no value (a run with it: tests/e2e/test_comet.py)
    lg = NeoXArgs.from_ymls([NEOX / "125M.yml", NEOX / "local_setup_comet.yml"]).logging
    assert (lg.use_comet, lg.comet_workspace, lg.comet_project, lg.comet_experiment_name) == (
        True, None, "test_project", "test_experiment")
    assert lg.comet_tags == ["test_tag1", "test_tag2"] and lg.comet_others == {"test_others": None}
    assert (lg.tensorboard_dir, lg.log_dir) == ("tensorboard", "logs")


def test_llemma_7b_is_refused_only_for_keys_gpt_neox_does_not_define():
    with pytest.raises(ConfigError, match="Unknown config key 'decay_lr_to'"):
        NeoXArgs.from_ymls([NEOX / "llemma/7B.yml"])
    # GPT-NeoX refuses them too; without them the file loads, data_types included
    values = read_yml(NEOX / "llemma/7B.yml")
    del values["decay_lr_to"], values["warmup_iters"]
    args = NeoXArgs.from_dict(values, source="llemma/7B.yml")
    ds = deepspeed_config(args)
    assert ds["data_types"] == {"grad_accum_dtype": "fp32"} and ds["bf16"] == {"enabled": True}

    from deepspeed.runtime.config import DeepSpeedConfig  # imports torch: test only

    assert DeepSpeedConfig(ds).grad_accum_dtype == "fp32"


def test_prof_config_turns_on_profiling():
    # it holds no model, so it goes after a model config; trace and memory go to tensorboard/
    args = NeoXArgs.from_ymls([NEOX / "125M.yml", NEOX / "prof.yml"])
    lg = args.logging
    assert (lg.profile, lg.profile_step_start, lg.profile_step_stop) == (True, 10, 12)
    assert (lg.memory_profiling, lg.memory_profiling_path) == (True, "tensorboard")
    assert lg.tensorboard_dir == "tensorboard"
    # its window must fit the run
    beyond = r"profile_step_start\(10\) and profile_step_stop\(12\) reach beyond train_iters\(11\)"
    with pytest.raises(ConfigError, match=beyond):
        args.replace(train_iters=11)


@pytest.mark.parametrize("name, impl, dataset, keys", [
    ("sft", "normal", "gpt2", {"train_label_data_paths":
                               ["data/sft/llama3_train_messages_label_document"]}),
    ("dpo", "dpo", "pairwise", {"dpo_beta": 0.01, "dpo_fp32": True, "allow_chopped": False,
                                "neg_train_label_data_paths":
                                ["data/pairwise/llama3_dpo_train_rejected_label_document"]}),
    ("kto", "kto", "gpt2", {"kto_beta": 0.1, "train_reward_data_paths":
                            ["data/kto/llama3_train_messages_reward_document"]}),
    ("rm", "rm", "pairwise", {"z_loss": 0.0, "pos_test_data_paths":
                              ["data/pairwise/llama3_rm_val_chosen_document"]}),
])
def test_gpt_neox_post_training_configs_load(name, impl, dataset, keys):
    args = NeoXArgs.from_ymls([NEOX / "post-training" / f"llama3-8b-{name}.yml"])
    assert (args.training.train_impl, args.data.dataset_impl, args.data.pack_impl) == (
        impl, dataset, "unpacked")
    assert {k: getattr(args, k) for k in keys} == keys
    assert args.checkpoint.finetune and args.model.use_flashattn_swiglu


def test_gpt_neox_reinforce_config_is_refused_saying_online_training_is_not_supported():
    with pytest.raises(ConfigError, match="'reinforce_leave_one_out' is an option of GPT-NeoX's "
                                          "online REINFORCE training .* use train_impl dpo, kto "
                                          "or rm on offline data"):
        NeoXArgs.from_ymls([NEOX / "post-training" / "llama3-8b-reinforce.yml"])


@pytest.mark.parametrize("size", ["130M", "370M", "790M", "1.4B", "2.8B"])
def test_gpt_neox_mamba_configs_load_with_their_mamba_layers(size):
    """All five: Mamba layers only (no attention: hidden_size need not divide by the 12 heads
    the files name), GPT-NeoX's Mamba initialisation, its fused-kernel flags, d_inner 2h."""
    args = NeoXArgs.from_ymls([NEOX / "mamba" / f"mamba-{size}.yml"], ["num_gpus=1"])
    m, d = args.model, args.derived
    assert set(d.attention_types) == {"mamba"} and len(d.attention_types) == m.num_layers
    assert d.mamba_inner_size == 2 * m.hidden_size
    assert (m.init_method, m.output_layer_init_method) == ("small_init",
                                                            "single_residual_scaled_normal")
    assert m.mamba_selective_scan_fusion and m.mamba_causal_conv_fusion
    assert m.mamba_inner_func_fusion and m.mamba_selective_fp32_params
    assert (m.norm, m.rms_norm_epsilon, m.pos_emb) == ("rmsnorm", 1e-5, "learned")
