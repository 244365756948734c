"""Shared setups of the post-training tests: the chat data (preprocessed once), and the SFT run
every preference run starts from."""

from __future__ import annotations

import pytest

from tests.posttraining.runs import posttrain, prepare_chat_files


@pytest.fixture(scope="session")
def chat_files(small_data, tmp_path_factory):
    """The synthetic chat task preprocessed for SFT, DPO, KTO and RM (ChatFiles)."""
    _prefix, tokenizer_json = small_data
    return prepare_chat_files(tokenizer_json, tmp_path_factory.mktemp("chat"))


@pytest.fixture(scope="session")
def sft_run(chat_files, tmp_path_factory):
    """A tiny model fine-tuned from scratch on the chat task for 60 steps (checkpoints after
    steps 1 and 60): the policy and reference of the preference runs. Its samples pack several
    conversations (pack_until_overflow), each attending only to itself with its own positions,
    as one conversation alone at generation."""
    run = tmp_path_factory.mktemp("sft")
    posttrain(chat_files, run, "normal", train_iters=60, eval_interval=30, checkpoint_factor=60,
              extra_save_iters=[1], pack_impl="pack_until_overflow", reset_attention_mask=True,
              reset_position_ids=True)
    return run
