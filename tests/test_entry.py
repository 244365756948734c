"""Command lines as users type them: config files, key=value, and GPT-NeoX's --key forms."""

import pytest

from megatron.entry import split_command_line


def test_files_and_overrides_in_any_order():
    assert split_command_line(["a.yml", "train_iters=5", "b.yaml", "seed=3"]) == (
        ["a.yml", "b.yaml"], ["train_iters=5", "seed=3"])


def test_dash_dash_forms_including_lists():
    files, overrides = split_command_line(
        ["c.yml", "--eval_tasks", "lambada_openai", "hellaswag", "--seed", "7", "--lr=0.1", "x=1"])
    assert files == ["c.yml"]
    assert overrides == ["eval_tasks=[lambada_openai, hellaswag]", "seed=7", "lr=0.1", "x=1"]


def test_option_without_value_says_how_to_write_it():
    with pytest.raises(ValueError, match="--seed has no value; write seed=VALUE"):
        split_command_line(["c.yml", "--seed"])
