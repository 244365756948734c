"""A bad value names where it was set: the config file, or the command-line override as typed.

Each case is written once in a file and once as an override; the message is the rule's sentence
after its origin ("<file>: ...", "command-line override `key=value`: ..."), or for a value of
the wrong type "'key' in <origin> must be ...".
"""

from __future__ import annotations

import pytest

from neox_args_helpers import BASE

from megatron.neox_arguments import ConfigError, NeoXArgs

BASE_YML = "".join(f"{k}: {v}\n" for k, v in BASE.items())

# (file text, the same as an override, the message after the origin ({} is the origin))
CASES = [
    ("split: 98:2", "split=98:2",
     "'split' in {} must be str, but it is 5882 (int). Quote it if it is text: YAML reads "
     "unquoted digits as a number, and digits with colons as base 60 (98:2 is 5882); split "
     "takes comma-separated proportions, e.g. 98,2."),
    ("train_iters: lots", "train_iters=lots",
     "'train_iters' in {} must be int or null, but it is \"lots\" (str)."),
    ("no_weight_tying: maybe", "no_weight_tying=maybe",
     "'no_weight_tying' in {} must be bool (true or false), but it is \"maybe\" (str)."),
    ("optimizer: {type: Adam, params: {lr: fast}}", "optimizer={type: Adam, params: {lr: fast}}",
     "{}: optimizer.params.lr('fast') must be a number greater than 0."),
    ("optimizer: {type: Adam, params: {lr: fast}}", "optimizer.params.lr=fast",
     "{}: optimizer.params.lr('fast') must be a number greater than 0."),
    ("optimizer: {type: Adam, params: {lr: 0.01, adam_w_mode: maybe}}",
     "optimizer.params.adam_w_mode=maybe",
     "{}: optimizer.params.adam_w_mode('maybe') must be true or false."),
    ("optimizer: {type: Adamm, params: {lr: 0.01}}", "optimizer.type=Adamm",
     "{}: optimizer.type 'Adamm' is not a valid choice; choose one of: Adam, AdamW, SGD."),
    ("zero_optimization: {stage: 7}", "zero_optimization.stage=7",
     "{}: zero_optimization.stage(7) must be 0, 1, 2 or 3."),
    ("zero_optimization: {stage: 1, overlap_com: true}",
     "zero_optimization={stage: 1, overlap_com: true}",
     "{}: zero_optimization.overlap_com is not a DeepSpeed ZeRO option (did you mean: "
     "overlap_comm?); see DeepSpeed's ZeRO configuration for the valid keys."),
    ("lr_decay_style: exp", "lr_decay_style=exp",
     "{}: lr_decay_style 'exp' is not a valid choice; choose one of: constant, linear, cosine, "
     "exponential."),
    ("warmup: 1.5", "warmup=1.5",
     "{}: warmup(1.5) is a fraction of lr_decay_iters and must be in [0, 1]."),
    ("norm: batchnorm", "norm=batchnorm",
     "{}: norm 'batchnorm' is not a valid choice; choose one of: layernorm, rmsnorm, scalenorm."),
    ("fp16: {enabled: maybe}", "fp16.enabled=maybe",
     "{}: fp16.enabled must be true or false, but it is 'maybe' (str); write it without quotes."),
    ("hidden_dropout: 1.5", "hidden_dropout=1.5", "{}: hidden_dropout(1.5) must be in [0, 1)."),
    ("train_iters: 0", "train_iters=0", "{}: train_iters(0) must be at least 1."),
    ("moe_num_experts: 0", "moe_num_experts=0",
     "{}: moe_num_experts(0) must be at least 1 (1: no experts)."),
    ("seed: -1", "seed=-1", "{}: seed(-1) must be in [0, 2**32)."),
]


@pytest.mark.parametrize("text,override,expected", CASES, ids=[c[1] for c in CASES])
def test_a_bad_value_names_the_file_that_set_it(write, text, override, expected):
    path = write("bad.yml", text + "\n")
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([write("base.yml", BASE_YML), path])
    assert str(e.value) == expected.format(path)


@pytest.mark.parametrize("text,override,expected", CASES, ids=[c[1] for c in CASES])
def test_a_bad_value_names_the_override_that_set_it(write, text, override, expected):
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([write("base.yml", BASE_YML)], [override])
    assert str(e.value) == expected.format(f"command-line override `{override}`")


def test_the_last_source_of_a_nested_value_is_named(write):
    base = write("base.yml", BASE_YML)
    a = write("a.yml", "optimizer: {type: Adam, params: {lr: fast}}\n")
    b = write("b.yml", "optimizer: {type: Adam, params: {lr: slow}}\n")
    with pytest.raises(ConfigError) as e:  # b replaces a's optimizer whole
        NeoXArgs.from_ymls([base, a, b])
    assert str(e.value) == f"{b}: optimizer.params.lr('slow') must be a number greater than 0."
    betas = write("betas.yml", "optimizer: {type: Adam, params: {lr: 0.1, betas: [0.9, 2]}}\n")
    with pytest.raises(ConfigError) as e:  # an override of lr leaves the file's betas its own
        NeoXArgs.from_ymls([base, betas], ["optimizer.params.lr=0.01"])
    assert str(e.value) == (f"{betas}: optimizer.params.betas([0.9, 2]) must be two numbers in "
                            "[0, 1).")
    with pytest.raises(ConfigError) as e:  # a whole optimizer set after the file's lr is named
        NeoXArgs.from_ymls([base, betas], ["optimizer={type: Adam, params: {lr: 0}}"])
    assert str(e.value) == ("command-line override `optimizer={type: Adam, params: {lr: 0}}`: "
                            "optimizer.params.lr(0) must be a number greater than 0.")


def test_a_rule_over_a_whole_mapping_names_every_source_of_its_keys(write):
    """The shape of `optimizer` is judged as a whole: the file that set it and the override that
    changed a key inside are both named; unknown params are one problem each, each with its own
    source."""
    base = write("base.yml", BASE_YML)
    opt = write("opt.yml", "optimizer: {type: Adam, params: {lr: 0.01, zzz: 1}}\n")
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([base, opt], ["optimizer.type=5"])
    assert str(e.value) == (
        f"{opt} and command-line override `optimizer.type=5`: optimizer must look like {{type: "
        "Adam, params: {lr: 0.0006, betas: [0.9, 0.95], eps: 1.0e-8}}; got {'type': 5, "
        "'params': {'lr': 0.01, 'zzz': 1}}.")
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([base, opt], ["optimizer.params.aaa=1"])
    valid = "valid: lr, betas, eps, adam_w_mode, bias_correction, amsgrad, set_grad_none."
    assert str(e.value) == (
        "The config has 2 problems:\n"
        "  - command-line override `optimizer.params.aaa=1`: optimizer.params has aaa, which "
        f"optimizer type Adam does not take; {valid}\n"
        f"  - {opt}: optimizer.params has zzz, which optimizer type Adam does not take; {valid}")


def test_each_of_several_problems_names_its_own_source(write):
    path = write("a.yml", "norm: batchnorm\nhidden_size: 66\n")
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([write("base.yml", BASE_YML), path], ["zero_optimization.stage=7"])
    assert str(e.value) == (
        "The config has 3 problems:\n"
        f"  - {path}: norm 'batchnorm' is not a valid choice; choose one of: layernorm, rmsnorm, "
        "scalenorm.\n"
        # a rule over several keys names their values, not one source
        "  - hidden_size(66) % num_attention_heads(4) = 2; it must be 0.\n"
        "  - command-line override `zero_optimization.stage=7`: zero_optimization.stage(7) must "
        "be 0, 1, 2 or 3.")


def test_a_dict_of_overrides_and_a_dict_config_are_named_too():
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([], {**BASE, "memory_check": "sometimes"})
    assert str(e.value) == ("command-line override `memory_check=\"sometimes\"`: "
                            "memory_check('sometimes') must be true, false or 'warn'.")
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_dict({**BASE, "split": "a,b"}, source="run.json")
    assert str(e.value) == ("run.json: split('a,b') must be up to three non-negative numbers, "
                            "e.g. \"949,50,1\".")


def test_replace_keeps_where_each_value_was_set_and_names_none_for_its_own(write):
    path = write("a.yml", BASE_YML + "pos_emb: rotary\nrotary_pct: 0.25\n")
    args = NeoXArgs.from_ymls([path])
    assert args.with_world_size(1).origins == args.origins
    with pytest.raises(ConfigError) as e:  # 64 / 16 heads: a head dim of 4 takes 1 rotary dim
        args.replace(num_attention_heads=16)
    assert str(e.value) == (f"{path}: rotary_pct(0.25) * head dim(4) = 1 rotary dims; rotary_pct "
                            "must be in (0, 1] and give an even number of at least 2.")
    with pytest.raises(ConfigError) as e:  # a value the code sets has no file to name
        args.replace(rotary_pct=0.1)
    assert str(e.value) == ("rotary_pct(0.1) * head dim(16) = 1 rotary dims; rotary_pct must be "
                            "in (0, 1] and give an even number of at least 2.")


def test_deepspeed_s_scheduler_section_is_refused_with_its_source(write):
    """GPT-NeoX's `scheduler` (DeepSpeed's) is not read here: the schedule is lr_decay_style,
    warmup, ...; the refusal names the file, or the command line, and the value."""
    text = "scheduler: {type: WarmupLR, params: {warmup_max_lr: fast}}"
    path, base = write("s.yml", text + "\n"), write("base.yml", BASE_YML)
    why = ("'scheduler' is a GPT-NeoX option this project does not implement yet; it is set to "
           '{"type": "WarmupLR", "params": {"warmup_max_lr": "fast"}}, and only GPT-NeoX\'s '
           "default (null, which changes nothing) is accepted; remove it from the config.")
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([base, path])
    assert str(e.value) == f"{path}: {why}"
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([base], [text.replace(": ", "=", 1)])
    override = text.replace(": ", "=", 1)
    assert str(e.value) == f"command-line override `{override}`: {why}"
