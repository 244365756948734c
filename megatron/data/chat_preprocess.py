"""Conversations (jsonl with a list of {"role", "content"} messages) rendered with a tokenizer's
own chat template into token files and label files, as GPT-NeoX's
tools/datasets/preprocess_data_with_chat_template.py writes them.

    result = preprocess_chat("chats.jsonl", "data/sft/train", "path/to/hf_tokenizer",
                             jsonl_keys=["messages"])
    # data/sft/train_messages_document.bin/.idx        the tokens
    # data/sft/train_messages_label_document.bin/.idx  the labels (not with no_mask)
    # data/sft/train_messages_reward_document.bin/.idx one reward per conversation (reward_key)

Rendering (`render`): conversation prefixes 1..n are rendered with
`tokenizer.apply_chat_template`, the tokens each adds belonging to its last message; with
`generation_role` assistant, a turn followed by an assistant turn is rendered with the generation
prompt (a template's generation prompt opens an assistant turn), which thus belongs to the turn
before and is masked; another role's turns keep their own header. The tokens of
`generation_role`'s turns are labels (the token itself), all others -100 (no loss); with
`only_last` only the last turn's. The EOS token is then appended (labelled when the last turn
is), as GPT-NeoX does. `for_rm` (reward models) masks everything and appends two EOS tokens,
the second a label: the one position a reward model reads. `no_mask` labels every token.

Checked, naming the file and line: a conversation that is not a list of messages with a role and
text content, one with no `generation_role` turn (nothing to learn), a template whose rendering
of a prefix is not the start of the rendering of the whole (labels could not be placed), and a
tokenizer without a chat template.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from megatron.data.indexed_dataset import (IGNORE_LABEL, MMapIndexedDatasetBuilder,
                                           best_fitting_dtype, index_file_path)
from megatron.data.preprocess_inputs import (expand_inputs, json_type, open_text,
                                             require_package)
from megatron.monitoring.logger import get_logger
from megatron.paths import make_output_dir
from megatron.monitoring.progress import progress

logger = get_logger(__name__)


@dataclass(frozen=True)
class ChatOptions:
    """How a conversation becomes tokens and labels (see the module docstring)."""

    generation_role: str = "assistant"
    only_last: bool = False
    for_rm: bool = False
    no_mask: bool = False
    ftfy: bool = False  # each message's content through ftfy.fix_text before rendering


def load_chat_tokenizer(path: str):
    """A Hugging Face tokenizer (a directory or hub name) that has a chat template."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ImportError("chat templates need transformers: pip install -e '.[hf]'") from None
    if not os.path.exists(path):
        raise FileNotFoundError(f"--tokenizer-path {path} does not exist; give the directory of "
                                "a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json)")
    files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if os.path.isfile(path):
        raise ValueError(f"--tokenizer-path {path} is a file; give the directory that holds it "
                         f"({os.path.dirname(path) or '.'}): the chat template is in its "
                         "tokenizer_config.json")
    if os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, f)) for f in files):
        raise FileNotFoundError(f"--tokenizer-path {path} holds no Hugging Face tokenizer (none "
                                f"of {', '.join(files)}); give the directory a tokenizer was "
                                "saved to (save_pretrained)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer in {path} has no chat template (tokenizer_config.json "
                         "'chat_template'); use a tokenizer that has one, or "
                         "preprocess_data_with_mask.py for prompt/completion data")
    return tokenizer


def _template_ids(tokenizer, messages: list, generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render(tokenizer, messages: list, options: ChatOptions = ChatOptions(),
           where: str = "conversation") -> tuple[list[int], list[int]]:
    """(tokens, labels) of one conversation (see the module docstring)."""
    _check_messages(messages, options, where)
    eos = tokenizer.eos_token_id
    if options.for_rm or options.no_mask:
        tokens = _template_ids(tokenizer, messages, False)
        if options.no_mask:
            return tokens, list(tokens)
        if eos is None:
            raise ValueError(f"{where}: --for-rm appends EOS tokens, but the tokenizer has no "
                             "eos_token")
        return tokens + [eos, eos], [IGNORE_LABEL] * (len(tokens) + 1) + [eos]
    tokens: list[int] = []
    labels: list[int] = []
    last = len(messages) - 1
    for i, message in enumerate(messages):
        prompt = (options.generation_role == "assistant" and i < last
                  and messages[i + 1]["role"] == "assistant")
        rendered = _template_ids(tokenizer, messages[:i + 1], prompt)
        if rendered[:len(tokens)] != tokens:
            raise ValueError(f"{where}: the chat template renders messages 1..{i + 1} into "
                             f"tokens that do not begin with the rendering of messages 1..{i}, "
                             "so each turn's tokens cannot be told apart; this tokenizer's "
                             "template cannot be used for label masking (use --no-mask)")
        added = rendered[len(tokens):]
        trained = message["role"] == options.generation_role and (not options.only_last
                                                                  or i == last)
        tokens += added
        labels += added if trained else [IGNORE_LABEL] * len(added)
    if eos is not None:
        trained_last = bool(labels) and labels[-1] != IGNORE_LABEL
        tokens.append(eos)
        labels.append(eos if trained_last else IGNORE_LABEL)
    return tokens, labels


def _check_messages(messages: Any, options: ChatOptions, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: expected a non-empty list of messages "
                         "[{\"role\": ..., \"content\": ...}], got "
                         + ("an empty list" if messages == [] else type(messages).__name__))
    for n, m in enumerate(messages, start=1):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: message {n} is not {{\"role\": ..., \"content\": "
                             f"\"text\"}}: {str(m)[:80]}")
    if options.for_rm or options.no_mask:
        return
    if not any(m["role"] == options.generation_role for m in messages):
        roles = ", ".join(sorted({m["role"] for m in messages}))
        raise ValueError(f"{where}: the conversation has no '{options.generation_role}' turn "
                         f"(roles: {roles}), so nothing in it would be trained on; remove it "
                         "from the input or set --generation-role")


@dataclass
class ChatResult:
    """What was written: the prefix of each output kind, per key, and the counts."""

    prefixes: dict[str, str] = field(default_factory=dict)
    documents: int = 0
    tokens: int = 0
    labelled: int = 0


def iter_conversations(files: Sequence[str], keys: Sequence[str], reward_key: str | None
                       ) -> Iterator[tuple[str, dict]]:
    """(where, record) for each jsonl line with every key (and the reward key) present."""
    for path in files:
        with open_text(path) as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path} line {line_no}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{where} is not valid JSON: {err}") from None
                if not isinstance(record, dict):
                    raise ValueError(f"{where} is a JSON {json_type(record)}, not an object "
                                     f"with the conversation under {', '.join(keys)}")
                for key in list(keys) + ([reward_key] if reward_key else []):
                    if key not in record:
                        raise ValueError(f"{where} has no key {key!r} (it has: "
                                         f"{', '.join(map(str, record))}); set --jsonl-keys / "
                                         "--reward-key")
                yield where, record


def reward_value(value: Any, binary: bool, where: str) -> float:
    """The reward of a record: a number, or with `binary` a truth value (a JSON boolean, or
    0 / 1) made +1 / -1. A boolean without `binary` is refused: read as a number, false would be
    a reward of 0, which KTO takes as neither desirable nor undesirable."""
    if binary:
        if isinstance(value, bool) or (isinstance(value, (int, float)) and value in (0, 1)):
            return 1.0 if value else -1.0
        raise ValueError(f"{where}: reward {value!r} is not true/false (--binary-reward takes "
                         "a JSON boolean, or 0 / 1)")
    if isinstance(value, bool):
        raise ValueError(f"{where}: reward {value!r} is true/false: pass --binary-reward to "
                         "write true as +1 and false as -1")
    try:
        reward = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: reward {value!r} is not a number (use --binary-reward for "
                         "true/false)") from None
    if not np.isfinite(reward):
        raise ValueError(f"{where}: reward {value!r} is not finite")
    return reward


_WORKER: dict = {}


def fixed_messages(messages: Any, fix_text) -> Any:
    """`messages` with each message's text content run through `fix_text`; anything else (a
    role, a content that is not text, messages that are not a list) as it was, for
    _check_messages to judge."""
    if not isinstance(messages, list):
        return messages
    return [{**m, "content": fix_text(m["content"])}
            if isinstance(m, dict) and isinstance(m.get("content"), str) else m
            for m in messages]


def _init_worker(tokenizer_path: str, keys: tuple, options: ChatOptions,
                 reward_key: str | None, binary_reward: bool) -> None:
    fix_text = require_package("ftfy", "--ftfy").fix_text if options.ftfy else None
    _WORKER.update(tokenizer=load_chat_tokenizer(tokenizer_path), keys=keys, options=options,
                   reward_key=reward_key, binary=binary_reward, fix_text=fix_text)


def _render_record(item: tuple[str, dict]) -> list[tuple[list, list, float | None]]:
    """(tokens, labels, reward) per key of one record, in the worker."""
    where, record = item
    w = _WORKER
    reward = (reward_value(record[w["reward_key"]], w["binary"], where) if w["reward_key"]
              else None)
    fix = w["fix_text"]
    return [(*render(w["tokenizer"], fixed_messages(record[key], fix) if fix else record[key],
                     w["options"], f"{where} ({key})"), reward)
            for key in w["keys"]]


def _rendered(records, tokenizer_path: str, keys: tuple, options: ChatOptions,
              reward_key: str | None, binary_reward: bool, workers: int):
    """The records rendered in input order, by `workers` processes when more than one."""
    init = (tokenizer_path, keys, options, reward_key, binary_reward)
    if workers <= 1:
        _init_worker(*init)
        yield from map(_render_record, records)
        return
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(workers, _init_worker, init) as pool:
        yield from pool.imap(_render_record, records, chunksize=25)


def preprocess_chat(inputs: str | Sequence[str], output_prefix: str, tokenizer_path: str,
                    jsonl_keys: Sequence[str] = ("conversation",),
                    options: ChatOptions = ChatOptions(), reward_key: str | None = None,
                    binary_reward: bool = False, num_docs: int | None = None,
                    workers: int = 1, log_interval: int = 0) -> ChatResult:
    """Render every conversation of `inputs` (by `workers` processes) and write the token,
    label and reward files; every `log_interval` conversations a progress line is logged."""
    if options.ftfy:
        require_package("ftfy", "--ftfy")  # before any output is written
    tokenizer = load_chat_tokenizer(tokenizer_path)
    files = expand_inputs(inputs)
    dtype = best_fitting_dtype(len(tokenizer))
    make_output_dir(os.path.dirname(os.path.abspath(output_prefix)), "--output-prefix")
    result = ChatResult()
    builders: dict[str, MMapIndexedDatasetBuilder] = {}
    for key in jsonl_keys:
        base = f"{output_prefix}_{key}"
        kinds = {"tokens": (f"{base}_document", "tokens")}
        if not options.no_mask:
            kinds["labels"] = (f"{base}_label_document", "labels")
        if reward_key:
            kinds["reward"] = (f"{base}_reward_document", "rewards")
        for kind, (prefix, values) in kinds.items():
            builders[f"{key}/{kind}"] = MMapIndexedDatasetBuilder(prefix + ".bin", dtype,
                                                                  values=values)
            result.prefixes[f"{key}/{kind}"] = prefix
    records = iter_conversations(files, jsonl_keys, reward_key)
    rendered = _rendered(records, tokenizer_path, tuple(jsonl_keys), options, reward_key,
                         binary_reward, workers)
    try:
        for per_key in progress(rendered, total=num_docs, desc="conversations", unit="doc"):
            for key, (tokens, labels, reward) in zip(jsonl_keys, per_key):
                builders[f"{key}/tokens"].add_item(tokens)
                builders[f"{key}/tokens"].end_document()
                if not options.no_mask:
                    builders[f"{key}/labels"].add_item(labels)
                    builders[f"{key}/labels"].end_document()
                if reward_key:
                    builders[f"{key}/reward"].add_item([reward])
                    builders[f"{key}/reward"].end_document()
                result.tokens += len(tokens)
                result.labelled += sum(1 for v in labels if v != IGNORE_LABEL)
            result.documents += 1
            if log_interval and result.documents % log_interval == 0:
                logger.info("%d conversations, %d tokens", result.documents, result.tokens)
        for name, builder in builders.items():
            builder.finalize(index_file_path(result.prefixes[name]))
    except BaseException:
        for builder in builders.values():
            builder.abort()
        raise
    if result.documents == 0:
        raise ValueError(f"no conversations in {', '.join(files)}")
    logger.info("wrote %d conversations, %d tokens of which %d labels", result.documents,
                result.tokens, result.labelled)
    return result
