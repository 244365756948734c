"""preprocess_data_with_chat_template.py: conversations rendered with the tokenizer's own chat
template (the text transformers' apply_chat_template gives), labels only on the assistant
turns, GPT-NeoX's file names and flags, and a clear error for each kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from megatron.data.chat_example import (answer, kto_records, make_chat_tokenizer, question,
                                         sft_records, write_jsonl)
from megatron.data.chat_preprocess import ChatOptions, load_chat_tokenizer, preprocess_chat, render
from megatron.data.indexed_dataset import IGNORE_LABEL, MMapIndexedDataset
from tests.runs import ROOT, explain

SCRIPT = ROOT / "tools" / "datasets" / "preprocess_data_with_chat_template.py"


@pytest.fixture(scope="module")
def tok_dir(small_data, tmp_path_factory):
    return make_chat_tokenizer(small_data[1], tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tokenizer(tok_dir):
    return load_chat_tokenizer(str(tok_dir))


def text(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def test_the_tokens_are_the_templates_rendering_and_only_assistant_turns_are_labels(tokenizer):
    messages = [{"role": "system", "content": "be brief"}, question("red"), answer("red"),
                question("blue"), answer("blue")]
    tokens, labels = render(tokenizer, messages)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text(tokenizer, tokens) == rendered + tokenizer.eos_token  # GPT-NeoX appends EOS
    assert len(labels) == len(tokens)
    kept = [t for t, lab in zip(tokens, labels) if lab != IGNORE_LABEL]
    assert all(lab in (IGNORE_LABEL, t) for t, lab in zip(tokens, labels))
    # the answers with their end-of-turn, and the final EOS; never the generation prompt
    assert text(tokenizer, kept) == "cherry!<|end|>sky!<|end|>" + tokenizer.eos_token
    only_last = [t for t, lab in zip(*render(tokenizer, messages, ChatOptions(only_last=True)))
                 if lab != IGNORE_LABEL]
    assert text(tokenizer, only_last) == "sky!<|end|>" + tokenizer.eos_token


def labelled(tokenizer, tokens, labels) -> str:
    assert len(labels) == len(tokens) and all(lab in (IGNORE_LABEL, t)
                                              for t, lab in zip(tokens, labels))
    return text(tokenizer, [t for t, lab in zip(tokens, labels) if lab != IGNORE_LABEL])


def test_generation_role_user_labels_exactly_the_user_turns(tokenizer, tok_dir, tmp_path):
    """--generation-role user (a user simulator): the user turns, header included, carry loss;
    the tokens are still the template's rendering; EOS is a label only after a user turn."""
    system = {"role": "system", "content": "answer briefly"}
    ends_with_answer = [system, question("red"), answer("red"), question("blue"), answer("blue")]
    ends_with_question = [question("red"), answer("red"), question("blue")]
    data = write_jsonl(tmp_path / "chats.jsonl", [{"messages": ends_with_answer},
                                                  {"messages": ends_with_question}])
    out = tmp_path / "user"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--input", str(data), "--jsonl-keys",
                           "messages", "--tokenizer-path", str(tok_dir), "--output-prefix",
                           str(out), "--generation-role", "user"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, explain(proc)
    tokens = MMapIndexedDataset(f"{out}_messages_document")
    labels = MMapIndexedDataset(f"{out}_messages_label_document")
    written = [(tokens.get(i).tolist(), labels.get(i).tolist()) for i in range(2)]
    user = ChatOptions(generation_role="user")
    assert written == [render(tokenizer, m, user) for m in (ends_with_answer, ends_with_question)]
    for messages, (ids, _) in zip((ends_with_answer, ends_with_question), written):
        assert text(tokenizer, ids) == \
            tokenizer.apply_chat_template(messages, tokenize=False) + tokenizer.eos_token
    assert labelled(tokenizer, *written[0]) == \
        "<|user|>what is red?<|end|><|user|>what is blue?<|end|>"  # EOS after an answer: no
    assert written[0][1][-1] == IGNORE_LABEL
    assert labelled(tokenizer, *written[1]) == \
        "<|user|>what is red?<|end|><|user|>what is blue?<|end|>" + tokenizer.eos_token
    # the default still labels the assistant turns, and not the generation prompt before them
    assert labelled(tokenizer, *render(tokenizer, ends_with_answer)) == \
        "cherry!<|end|>sky!<|end|>" + tokenizer.eos_token


def test_reward_model_and_unmasked_formats(tokenizer):
    messages = [question("red"), answer("red")]
    tokens, labels = render(tokenizer, messages, ChatOptions(for_rm=True))
    eos = tokenizer.eos_token_id
    assert tokens[-2:] == [eos, eos] and labels[-1] == eos  # one position a reward model reads
    assert set(labels[:-1]) == {IGNORE_LABEL}
    tokens, labels = render(tokenizer, messages, ChatOptions(no_mask=True))
    assert labels == tokens and text(tokenizer, tokens) == \
        tokenizer.apply_chat_template(messages, tokenize=False)


@pytest.mark.parametrize("messages, message", [
    ([question("red"), {"role": "user", "content": "and?"}],
     "has no 'assistant' turn (roles: user), so nothing in it would be trained on"),
    ("hello", "expected a non-empty list of messages"),
    ([], "expected a non-empty list of messages [{\"role\": ..., \"content\": ...}], got an "
         "empty list"),
    ([{"role": "user", "content": 3}], "message 1 is not"),
])
def test_bad_conversations_are_refused_naming_where(tokenizer, messages, message):
    with pytest.raises(ValueError, match="chats.jsonl line 7") as err:
        render(tokenizer, messages, where="chats.jsonl line 7")
    assert message in str(err.value)


def test_a_template_that_rewrites_earlier_turns_is_refused(tok_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    # the last message is rendered differently from the same message followed by more
    tok.chat_template = ("{% for m in messages %}{% if loop.last %}<|end|>{% endif %}"
                         "<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}")
    with pytest.raises(ValueError, match="do not begin with the rendering of messages 1..1"):
        render(tok, [question("red"), answer("red")])


def test_a_tokenizer_without_a_chat_template_is_refused(tok_dir, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("tokenizer.json",):
        (plain / name).write_bytes((tok_dir / name).read_bytes())
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has no chat template"):
        load_chat_tokenizer(str(plain))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"--tokenizer-path .*empty holds no Hugging Face "
                                                r"tokenizer \(none of tokenizer.json, "):
        load_chat_tokenizer(str(empty))


def test_the_script_writes_gpt_neox_named_files_that_belong_together(tok_dir, tmp_path):
    data = write_jsonl(tmp_path / "chats.jsonl", kto_records(20, seed=3))
    out = tmp_path / "out" / "train"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--input", str(data), "--jsonl-keys",
                           "messages", "--tokenizer-path", str(tok_dir), "--output-prefix",
                           str(out), "--reward-key", "reward", "--workers", "2"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, explain(proc)
    tokens = MMapIndexedDataset(f"{out}_messages_document")
    labels = MMapIndexedDataset(f"{out}_messages_label_document")
    rewards = MMapIndexedDataset(f"{out}_messages_reward_document")
    assert len(tokens) == len(labels) == len(rewards) == 20
    assert np.array_equal(tokens.sizes, labels.sizes) and labels.dtype == np.int32
    assert [float(rewards.get(i)[0]) for i in range(4)] == [1.0, -1.0, 1.0, -1.0]
    one = preprocess_chat(str(data), str(tmp_path / "one"), str(tok_dir), ["messages"],
                          reward_key="reward")
    for kind in ("tokens", "labels"):  # two processes write what one does
        a = MMapIndexedDataset(one.prefixes[f"messages/{kind}"])
        b = tokens if kind == "tokens" else labels
        assert all(np.array_equal(a.get(i), b.get(i)) for i in range(20))


def test_a_missing_key_or_a_bad_reward_names_the_line(tok_dir, tmp_path):
    data = write_jsonl(tmp_path / "chats.jsonl", sft_records(3, seed=0))
    with pytest.raises(ValueError, match=r"chats.jsonl line 1 has no key 'conversation'"):
        preprocess_chat(str(data), str(tmp_path / "x"), str(tok_dir))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [question("red"), answer("red")],
                                                "reward": "great"}])
    with pytest.raises(ValueError, match=r"bad.jsonl line 1: reward 'great' is not a number"):
        preprocess_chat(str(bad), str(tmp_path / "y"), str(tok_dir), ["messages"],
                        reward_key="reward")
    assert not list(tmp_path.glob("y_*"))  # nothing half-written is left


def test_true_false_rewards_need_binary_reward_which_takes_only_truth_values(tok_dir, tmp_path):
    """Read as numbers, false would be a reward of 0: neither desirable nor undesirable to KTO.
    With --binary-reward, a string such as "false" (true to Python) is refused, not made +1."""
    from megatron.data.chat_preprocess import reward_value

    records = [{"messages": [question("red"), answer("red")], "reward": value}
               for value in (True, False)]
    data = write_jsonl(tmp_path / "kto.jsonl", records)
    with pytest.raises(ValueError, match=r"kto.jsonl line 1: reward True is true/false: pass "
                                         r"--binary-reward to write true as \+1 and false as -1"):
        preprocess_chat(str(data), str(tmp_path / "x"), str(tok_dir), ["messages"],
                        reward_key="reward")
    out = preprocess_chat(str(data), str(tmp_path / "y"), str(tok_dir), ["messages"],
                          reward_key="reward", binary_reward=True)
    rewards = MMapIndexedDataset(out.prefixes["messages/reward"])
    assert [float(rewards.get(i)[0]) for i in range(2)] == [1.0, -1.0]
    assert [reward_value(v, True, "x") for v in (1, 0, 1.0)] == [1.0, -1.0, 1.0]
    for value in ("false", 0.5, None):
        with pytest.raises(ValueError, match=rf"^x: reward {value!r} is not true/false "
                                             r"\(--binary-reward takes a JSON boolean, or 0 / 1\)"):
            reward_value(value, True, "x")


def test_the_tokenizer_json_file_instead_of_its_directory_is_named(tok_dir):
    path = tok_dir / "tokenizer.json"
    with pytest.raises(ValueError, match=rf"^--tokenizer-path {path} is a file; give the "
                                         rf"directory that holds it \({tok_dir}\): the chat "
                                         r"template is in its tokenizer_config.json$"):
        load_chat_tokenizer(str(path))
