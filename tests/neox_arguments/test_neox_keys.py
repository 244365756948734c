"""GPT-NeoX keys that are not fields here: accepted at GPT-NeoX's default, refused otherwise."""

from __future__ import annotations

import pytest

from neox_args_helpers import REPO

from megatron.neox_arguments import ConfigError, NeoXArgs
from megatron.neox_arguments.neox_keys import (
    NEOX_DEFAULTS, NOT_YET_IMPLEMENTED, RUNTIME_KEYS, same_value,
)

TINY = REPO / "configs/tiny.yml"


@pytest.fixture(scope="module")
def tiny():
    """configs/tiny.yml with no overrides."""
    return NeoXArgs.from_ymls([TINY])


def test_every_listed_key_has_a_recorded_default():
    assert set(NEOX_DEFAULTS) == (NOT_YET_IMPLEMENTED | set(RUNTIME_KEYS)) - {"git_hash"}


@pytest.mark.parametrize("key", sorted(NEOX_DEFAULTS))
def test_key_at_neox_default_is_accepted_and_changes_nothing(key, tiny, config_log):
    args = NeoXArgs.from_ymls([TINY], {key: NEOX_DEFAULTS[key]})
    assert args == tiny and args.to_dict() == tiny.to_dict()
    assert args.overrides_log == tiny.overrides_log and not config_log


@pytest.mark.parametrize("key, value, default", [
    ("rpe_max_distance", 64, "128"),
    ("use_shared_fs", False, "true"),
    ("mup_width_scale", 4, "2"),
])
def test_not_implemented_key_off_its_default_is_refused(key, value, default):
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([TINY], {key: value})
    msg = str(e.value)
    assert f"'{key}' is a GPT-NeoX option this project does not implement yet" in msg
    shown = f'"{value}"' if isinstance(value, str) else str(value).lower()
    assert f"it is set to {shown}" in msg
    assert f"only GPT-NeoX's default ({default}, which changes nothing) is accepted" in msg
    assert msg.startswith(f"command-line override `{key}={shown}`: ")


def test_runtime_key_off_its_default_is_refused():
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([TINY], {"curriculum_seqlen": 64})
    msg = str(e.value)
    assert ("'curriculum_seqlen' in command-line override `curriculum_seqlen=64` is not a config "
            "option here") in msg
    assert "it is set to 64, and only GPT-NeoX's default (0, which changes nothing)" in msg
    with pytest.raises(ConfigError, match="'deepspeed' .* set to false.* default \\(true"):
        NeoXArgs.from_ymls([TINY], {"deepspeed": False})
    with pytest.raises(ConfigError, match="'git_hash' .* no value is accepted"):
        NeoXArgs.from_ymls([TINY], {"git_hash": "abc123"})


def test_a_key_read_from_another_place_says_the_override_to_write_instead():
    """GPT-NeoX's top-level `lr` is filled from optimizer.params.lr: the message gives the
    override that sets it (docs/finetune.md's advice to set the learning rate)."""
    with pytest.raises(ConfigError, match=r"'lr' in command-line override `lr=0.001` is not a "
                       r"config option here: it "
                       r"is read from optimizer.params.lr; .* Set optimizer.params.lr=0.001 "
                       r"instead\.$"):
        NeoXArgs.from_ymls([TINY], ["lr=0.001"])
    assert NeoXArgs.from_ymls([TINY], ["optimizer.params.lr=0.001"]).lr == 0.001
    with pytest.raises(ConfigError, match=r"'world_size' .* derived from .* Remove it\.$"):
        NeoXArgs.from_ymls([TINY], ["world_size=4"])


def test_deepspeed_entry_off_its_default_points_to_deepspeed_extra_args():
    with pytest.raises(ConfigError, match="default \\(null.*inside deepspeed_extra_args"):
        NeoXArgs.from_ymls([TINY], {"flops_profiler": {"enabled": True}})
    with pytest.raises(ConfigError, match="'amp' .* set to {\"enabled\": false}"):
        NeoXArgs.from_ymls([TINY], ["amp.enabled=false"])


def test_switches_accept_either_spelling_of_off(tiny):
    assert NeoXArgs.from_ymls([TINY], {"use_mup": None, "use_bnb_optimizer": False}) == tiny
    with pytest.raises(ConfigError, match="'use_shared_fs' .* set to null"):
        NeoXArgs.from_ymls([TINY], {"use_shared_fs": None})


def test_defaults_compare_by_value(tiny):
    assert same_value(0, 0.0) and same_value("1e-1", 0.1) and same_value([1, 2], (1, 2))
    assert not same_value(True, 1) and not same_value(0, None) and not same_value("0", "0.0")
    overrides = ["z_loss=0", "mup_width_scale=2.0", "kl_div_beta=1e-1"]
    assert NeoXArgs.from_ymls([TINY], overrides) == tiny


def test_recorded_defaults_match_neox():
    """A spot check of well-known GPT-NeoX defaults (neox_args.py)."""
    expected = {"rpe_max_distance": 128, "kl_impl": "mse", "kl_div_beta": 0.1,
                "mup_width_scale": 2}
    assert {k: NEOX_DEFAULTS[k] for k in expected} == expected


def test_moe_keys_are_fields_with_neox_defaults(tiny):
    """GPT-NeoX's MoE keys (neox_args.py) with its defaults: no experts unless asked for;
    the two loss coefficients are this project's, 0 as GPT-NeoX trains without them."""
    m = tiny.model
    assert (m.moe_num_experts, m.moe_expert_interval, m.moe_top_k, m.moe_router_type,
            m.moe_jitter_eps, m.moe_lbl_in_fp32) == (1, 1, 1, "sinkhorn", None, False)
    assert (m.moe_aux_loss_coeff, m.moe_z_loss_coeff, m.moe_normalize_topk) == (0.0, 0.0, False)
    with pytest.raises(ConfigError, match="moe_router_type 'hash'"):
        NeoXArgs.from_ymls([TINY], {"moe_num_experts": 4, "moe_router_type": "hash"})


def test_post_training_keys_are_fields_with_neox_defaults(tiny):
    """train_impl, the DPO/KTO/RM coefficients and the dataset keys are config fields with
    GPT-NeoX's defaults (neox_args.py)."""
    t, d = tiny.training, tiny.data
    assert (t.train_impl, t.dpo_beta, t.dpo_fp32, t.dpo_reference_free) == ("normal", 0.1, True,
                                                                              False)
    assert (t.kto_beta, t.kto_fp32, t.kto_desirable_weight, t.kto_undesirable_weight,
            t.z_loss) == (0.1, True, 1.0, 1.0, 0.0)
    assert (d.dataset_impl, d.pack_impl, d.allow_chopped) == ("gpt2", "packed", True)
    with pytest.raises(ConfigError, match="train_impl 'reinforce' .* does not support yet"):
        NeoXArgs.from_ymls([TINY], {"train_impl": "reinforce"})


def test_neox_logging_keys_are_fields_with_neox_defaults(tiny):
    """peak_theoretical_tflops, log_grad_norm and wandb_host work as in GPT-NeoX (see
    tests/training/test_grad_norms.py, tests/monitoring and tests/e2e/test_train.py)."""
    lg = tiny.logging
    assert (lg.peak_theoretical_tflops, lg.log_grad_norm, lg.wandb_host) == (
        None, False, "https://api.wandb.ai")
    set_ = NeoXArgs.from_ymls([TINY], ["peak-theoretical-tflops=989", "log_grad_norm=true",
                                       "wandb_host=https://wandb.example.test"]).logging
    assert (set_.peak_theoretical_tflops, set_.log_grad_norm, set_.wandb_host) == (
        989.0, True, "https://wandb.example.test")
    assert not {"peak_theoretical_tflops", "log_grad_norm", "wandb_host"} & (
        NOT_YET_IMPLEMENTED | set(NEOX_DEFAULTS))


def test_comet_keys_are_fields_and_the_experiment_object_is_not_config(tiny):
    """GPT-NeoX's comet keys are logging fields, at its defaults (off); `comet_experiment` is
    the object GPT-NeoX creates during training, so only its default (null) is accepted."""
    keys = ("use_comet", "comet_workspace", "comet_project", "comet_experiment_name",
            "comet_tags", "comet_others")
    assert [getattr(tiny.logging, k) for k in keys] == [None] * len(keys)
    assert not set(keys) & (NOT_YET_IMPLEMENTED | set(NEOX_DEFAULTS))
    lg = NeoXArgs.from_ymls([TINY], ["use_comet=true", "comet-tags=one"]).logging
    assert lg.use_comet is True and lg.comet_tags == ["one"]
    with pytest.raises(ConfigError, match="'comet_experiment' .* only GPT-NeoX's default "
                                          "\\(null"):
        NeoXArgs.from_ymls([TINY], {"comet_experiment": "abc"})
