"""Loading: NeoX-style YAML, merge order, overrides, key spellings, and every load-time error."""

from __future__ import annotations

import pytest

from neox_args_helpers import BASE, DATA

from megatron.neox_arguments import ConfigError, NeoXArgs
from megatron.neox_arguments.errors import ConfigFileNotFoundError
from megatron.neox_arguments.neox_keys import NOT_YET_IMPLEMENTED, RENAMED, RUNTIME_KEYS
from megatron.neox_arguments.sections import FIELD_SECTION

BASE_YML = "{\n" + "".join(f'  "{k}": {v},\n' for k, v in BASE.items()) + "}\n"


def test_neox_125m_file_loads_unchanged():
    args = NeoXArgs.from_ymls([DATA / "neox_125M.yml"])
    assert args.num_layers == 12 and args.hidden_size == 768 and args.pos_emb == "rotary"
    assert args.checkpoint_activations and args.weight_decay == 0.1  # dash keys
    assert args.zero_stage == 1 and args.get("zero_optimization")["overlap_comm"] is True
    assert args.hostfile == "/mock_path" and args.lr == 0.0006 and args.eps == 1e-8
    assert args.derived.precision == "fp16" and args.derived.warmup_iters == 3200


def test_neox_pythia_file_loads_unchanged():
    args = NeoXArgs.from_ymls([DATA / "neox_pythia_1B.yml"])
    assert args.gpt_j_residual and args.rotary_pct == 0.25
    assert args.derived.precision == "bf16"  # fp16 {type: bfloat16} is GPT-NeoX's bf16
    assert args.derived.train_batch_size == 16 and args.hidden_dropout == 0.0
    assert args.extra_save_iters[:4] == [0, 1, 2, 4]


def test_neox_pythia_flash_file_loads_with_or_without_flash_attn():
    """GPT-NeoX's Pythia file selects flash attention; without flash-attn SDPA runs it."""
    args = NeoXArgs.from_ymls([DATA / "neox_pythia_160M_flash.yml"])
    assert args.derived.attention_types == ("flash",) * 12
    args = NeoXArgs.from_ymls([DATA / "neox_pythia_160M_flash.yml"], ["attention_config=null"])
    assert set(args.derived.attention_types) == {"global"}


def test_later_files_win_and_each_file_s_overrides_are_named_in_one_line(write, config_log):
    a = write("a.yml", BASE_YML)
    b = write("b.yml", "hidden_size: 128\ntrain_iters: 20\n")
    c = write("c.yml", "train_iters: 30\n")
    args = NeoXArgs.from_ymls([a, b, c])
    assert args.hidden_size == 128 and args.train_iters == 30
    log = "\n".join(args.overrides_log)
    assert f"hidden_size: 64 ({a}) -> 128 ({b})" in log
    assert f"train_iters: 20 ({b}) -> 30 ({c})" in log
    assert f"train_iters: 10 ({a}) -> 20 ({b})" in log
    # the console: one line per source naming the keys it changes; the values are in the record
    assert config_log == [
        f"INFO config: {b} overrides hidden_size, train_iters (log_level: debug lists each value)",
        f"INFO config: {c} overrides train_iters (log_level: debug lists each value)"]
    NeoXArgs.from_ymls([a], ["train_iters=40", f"hidden_size={64}"])  # 64: a's own value
    assert config_log[2:] == ["INFO config: command line sets train_iters (log_level: debug "
                              "lists each value)"]


def test_overrides_strings_dict_and_dotted_keys(write):
    a = write("a.yml", BASE_YML)
    args = NeoXArgs.from_ymls(
        [a],
        ["train-iters=7", "optimizer={type: AdamW, params: {lr: 1e-3}}",
         "optimizer.params.betas=[0.8, 0.9]", "eval_tasks=[lambada_openai, piqa]"],
    )
    assert args.train_iters == 7 and args.optimizer.type == "AdamW"
    assert args.lr == 0.001 and args.betas == (0.8, 0.9)  # "1e-3" is a YAML string -> float
    assert args.eval_tasks == ["lambada_openai", "piqa"]
    assert "train_iters: 10 (" in args.overrides_log[0] and "-> 7 (command line)" in args.overrides_log[0]
    assert any("eval_tasks: null (default) -> " in line for line in args.overrides_log)
    assert NeoXArgs.from_ymls([a], {"seq_length": 16}).seq_length == 16


def test_dash_and_underscore_keys_are_the_same_key(write):
    base = {k: v for k, v in BASE.items() if k != "train_iters"}
    args = NeoXArgs.from_dict({**base, "train-iters": 5, "pipe-parallel-size": 1})
    assert args.train_iters == 5 and args.pipe_parallel_size == 1
    both = write("both.yml", BASE_YML.replace("{\n", '{\n  "seq-length": 16,\n'))
    with pytest.raises(ConfigError, match="sets 'seq_length' twice"):
        NeoXArgs.from_ymls([both])


def test_unknown_key_names_file_and_nearest_keys(write):
    path = write("typo.yml", BASE_YML.replace("{\n", '{\n  "hiden_size": 64,\n'))
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([path])
    msg = str(e.value)
    assert "Unknown config key 'hiden_size'" in msg and path in msg
    assert msg.endswith("Did you mean: hidden_size?")  # not batch_size, much further off
    with pytest.raises(ConfigError, match="'trian_iters' in command-line override `trian_iters=3`. "
                       "Did you mean: train_iters"):
        NeoXArgs.from_ymls([write("ok.yml", BASE_YML)], ["trian_iters=3"])


def test_unknown_key_with_nothing_close():
    with pytest.raises(ConfigError, match="No valid key is close.*configs/README.md"):
        NeoXArgs.from_dict({**BASE, "zzzzqqq": 1})


def test_not_yet_implemented_neox_key(write):
    path = write("rpe.yml", BASE_YML.replace("{\n", '{\n  "rpe_max_distance": 64,\n'))
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([path])
    assert "'rpe_max_distance' is a GPT-NeoX option this project does not implement yet" in str(e.value)
    assert path in str(e.value)
    with pytest.raises(ConfigError, match="inside deepspeed_extra_args"):
        NeoXArgs.from_dict({**BASE, "flops_profiler": {"enabled": True}})


def test_switched_off_neox_option_is_accepted_silently(config_log):
    args = NeoXArgs.from_dict({**BASE, "use_bnb_optimizer": False, "sparsity_config": None})
    assert args == NeoXArgs.from_dict(BASE)
    assert not any("use_bnb_optimizer" in l or "sparsity_config" in l for l in config_log)


def test_runtime_neox_key_is_refused():
    with pytest.raises(ConfigError, match="'world_size' in test is not a config option.*num_nodes"):
        NeoXArgs.from_dict({**BASE, "world_size": 8}, source="test")


def test_renamed_neox_key_is_accepted_with_a_warning(config_log):
    args = NeoXArgs.from_dict({**BASE, "save_interval": 50, "gas": 2, "save": "/tmp/x"})
    assert args.checkpoint_factor == 50 and args.gradient_accumulation_steps == 2
    assert any("'save_interval' is GPT-NeoX's old name for 'checkpoint_factor'" in l
               for l in config_log)


def test_keys_gpt_neox_overwrites_are_refused_unless_at_its_default():
    """GPT-NeoX overwrites batch_size and clip_grad with the micro batch and gradient_clipping,
    so a value written there trains nothing in GPT-NeoX: at its default it is dropped, another
    value is refused naming the key that decides."""
    args = NeoXArgs.from_dict({**BASE, "clip_grad": 1.0, "gradient_clipping": 0.3}, source="t")
    assert args.gradient_clipping == 0.3
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_dict({**BASE, "clip_grad": 0.5}, source="t")
    assert str(e.value).startswith("'clip_grad' in t is not a config option here: it is read "
                                   "from gradient_clipping, as GPT-NeoX overwrites clip_grad")
    assert str(e.value).endswith("Set gradient_clipping=0.5 instead.")
    with pytest.raises(ConfigError, match="'batch_size' in t .* read from "
                                          "train_micro_batch_size_per_gpu.*Set "
                                          "train_micro_batch_size_per_gpu=4 instead"):
        NeoXArgs.from_dict({**BASE, "batch_size": 4}, source="t")


def test_type_errors_name_key_value_and_expected_type(write):
    path = write("t.yml", BASE_YML + "")
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([path], ["train_iters=lots"])
    assert str(e.value) == ("'train_iters' in command-line override `train_iters=lots` must be int "
                            "or null, but it is \"lots\" (str).")
    with pytest.raises(ConfigError, match=r"'no_weight_tying' in test must be bool \(true or false\), but it is 1 \(int\)"):
        NeoXArgs.from_dict({**BASE, "no_weight_tying": 1}, source="test")
    with pytest.raises(ConfigError, match="'eval_tasks' in test must be list of str or null"):
        NeoXArgs.from_dict({**BASE, "eval_tasks": {"piqa": 1}}, source="test")
    # one item where a list is expected is that list (`--eval_tasks piqa` on a command line)
    assert NeoXArgs.from_dict({**BASE, "eval_tasks": "piqa"}, source="test").eval_tasks == ["piqa"]
    with pytest.raises(ConfigError, match="'zero_optimization' in test must be mapping"):
        NeoXArgs.from_dict({**BASE, "zero_optimization": 1}, source="test")


def test_numbers_are_coerced_where_harmless():
    args = NeoXArgs.from_dict({**BASE, "hidden_dropout": 0, "min_lr": "1e-5", "train_iters": 1.0e+2,
                               "optimizer": {"type": "adam", "params": {"lr": "6e-4", "eps": "1e-8"}}})
    assert args.hidden_dropout == 0.0 and isinstance(args.hidden_dropout, float)
    assert args.min_lr == 1e-5 and args.train_iters == 100 and isinstance(args.train_iters, int)
    assert args.lr == 6e-4 and args.eps == 1e-8 and args.optimizer.type == "Adam"
    with pytest.raises(ConfigError, match="'train_iters' in x must be int or null, but it is 10.5"):
        NeoXArgs.from_dict({**BASE, "train_iters": 10.5}, source="x")


def test_yaml_syntax_error_names_file_and_line(write):
    path = write("broken.yml", '{\n  "num_layers": 2,\n  "hidden_size": 64\n  "seq_length": 32,\n}\n')
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([path])
    assert str(e.value).startswith(f"{path}, line 4: YAML syntax error:")
    assert str(e.value).endswith("(entries of a {...} mapping are separated by commas).")
    path = write("indented.yml", "num_layers: 2\n  hidden_size: 64\n")
    with pytest.raises(ConfigError) as e:  # a block mapping: no word of commas
        NeoXArgs.from_ymls([path])
    assert str(e.value) == (f"{path}, line 2: YAML syntax error: mapping values are not "
                            "allowed here. Fix the file there.")


def test_duplicate_key_in_one_file_is_refused(write):
    path = write("dup.yml", "num_layers: 2\nhidden_size: 64\nnum_layers: 4\n")
    with pytest.raises(ConfigError, match=r"dup.yml, line 3: .*'num_layers' appears twice \(first on line 1\)"):
        NeoXArgs.from_ymls([path])


def test_missing_file_names_the_path():
    with pytest.raises(ConfigFileNotFoundError, match="Config file not found: nope/missing.yml") as e:
        NeoXArgs.from_ymls(["nope/missing.yml"])
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, ConfigError)
    # a tool that takes config files only, given an override (convert_hf_to_neox --config_file)
    with pytest.raises(ConfigFileNotFoundError) as e:
        NeoXArgs.from_ymls(["num_layers=2"])
    assert str(e.value).endswith(
        "It reads as a key=value override, which this command does not take: put it in a YAML "
        "file and pass that")


def test_non_mapping_file_and_bad_override(write):
    with pytest.raises(ConfigError, match="must hold a mapping of config keys"):
        NeoXArgs.from_ymls([write("list.yml", "- 1\n- 2\n")])
    with pytest.raises(ConfigError, match="Override 'train_iters' must look like key=value"):
        NeoXArgs.from_ymls([write("ok.yml", BASE_YML)], ["train_iters"])
    with pytest.raises(ConfigError, match="train_iters is not a mapping"):
        NeoXArgs.from_ymls([write("ok2.yml", BASE_YML)], ["train_iters.x=1"])


def test_empty_file_is_allowed(write):
    assert NeoXArgs.from_ymls([write("a.yml", BASE_YML), write("empty.yml", "# nothing\n")]).num_layers == 2


def test_neox_key_lists_are_consistent():
    fields = set(FIELD_SECTION)
    assert not NOT_YET_IMPLEMENTED & fields
    assert not set(RUNTIME_KEYS) & fields and not set(RENAMED) & fields
    assert set(RENAMED.values()) <= fields
    assert not NOT_YET_IMPLEMENTED & set(RUNTIME_KEYS)
