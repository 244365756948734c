"""Documents with a part that carries no loss, for models without a chat template: token files
and a label file, as GPT-NeoX's tools/datasets/preprocess_data_with_mask.py writes them.

    preprocess_masked("data.jsonl", "data/sft/train", tokenizer, mask_before=[50256, 27])
    # data/sft/train_text_document: tokens; data/sft/train_label_document: labels

Two ways to say where the loss starts:
- `mask_before` (GPT-NeoX's --mask-before-token): the first occurrence of this token sequence in
  a document and everything before it carry no loss (-100); a document without it carries loss
  everywhere.
- `prompt_key` / `completion_key` (jsonl fields): the prompt's tokens carry no loss, the
  completion's do. Each is tokenized on its own and the two are joined, so the boundary is
  exact.
With `append_eod` the end-of-document token follows, carrying loss.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Sequence

from megatron.data.chat_preprocess import ChatResult
from megatron.data.indexed_dataset import (IGNORE_LABEL, MMapIndexedDatasetBuilder,
                                           best_fitting_dtype, index_file_path)
from megatron.data.preprocess import _tokenizers_threads_off
from megatron.data.preprocess_inputs import expand_inputs, iter_documents, open_text
from megatron.monitoring.logger import get_logger
from megatron.paths import make_output_dir
from megatron.monitoring.progress import progress

logger = get_logger(__name__)


@dataclass(frozen=True)
class MaskRule:
    """Where the loss starts: after `mask_before`, or at the completion."""

    mask_before: tuple[int, ...] = ()
    prompt_key: str | None = None
    completion_key: str | None = None
    append_eod: bool = False


def find(tokens: Sequence[int], pattern: Sequence[int]) -> int:
    """Index of the first occurrence of `pattern` in `tokens`, -1 when there is none."""
    n, m = len(tokens), len(pattern)
    if m == 0:
        return -1
    first = pattern[0]
    for i in range(n - m + 1):
        if tokens[i] == first and list(tokens[i:i + m]) == list(pattern):
            return i
    return -1


def masked_labels(tokens: list[int], pattern: Sequence[int]) -> list[int]:
    """GPT-NeoX's rule: up to and including the first `pattern`, -100; then the tokens."""
    at = find(tokens, pattern)
    if at < 0:
        return list(tokens)
    cut = at + len(pattern)
    return [IGNORE_LABEL] * cut + list(tokens[cut:])


@dataclass
class _Records:
    """The prompt/completion jsonl records of the input files, checked."""

    files: list
    rule: MaskRule
    counted: list = field(default_factory=list)

    def __iter__(self):
        keys = (self.rule.prompt_key, self.rule.completion_key)
        for path in self.files:
            with open_text(path) as f:
                for line_no, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    where = f"{path} line {line_no}"
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{where} is not valid JSON: {err}") from None
                    for key in keys:
                        if not isinstance(record.get(key), str):
                            raise ValueError(f"{where} has no text under {key!r}; set "
                                             "--prompt-key / --completion-key")
                    yield record[keys[0]], record[keys[1]]


def _tokenize_record(tokenizer, rule: MaskRule, record: tuple) -> tuple[list, list]:
    """(token list per key, labels) of one record: (prompt, completion) or a text per key."""
    eod = [tokenizer.eod] if rule.append_eod else []
    if rule.prompt_key:
        prompt, completion = tokenizer.tokenize(record[0]), tokenizer.tokenize(record[1])
        return [prompt + completion + eod], [IGNORE_LABEL] * len(prompt) + completion + eod
    per_key = [tokenizer.tokenize(text) + eod for text in record]
    return per_key, masked_labels(per_key[0], rule.mask_before)


_WORKER: dict = {}
WORKER_BATCH = 256  # records sent to a worker process at a time


def _init_worker(tokenizer, rule: MaskRule) -> None:
    _WORKER["tokenizer"], _WORKER["rule"] = tokenizer, rule


def _tokenize_batch(records: list) -> list:
    return [_tokenize_record(_WORKER["tokenizer"], _WORKER["rule"], r) for r in records]


def _tokenized(records, tokenizer, rule: MaskRule, workers: int):
    """(token lists, labels) per record in input order, by `workers` processes when > 1 (the
    tokenizer is sent to each; one thread each, as preprocess_data.py's workers)."""
    if workers <= 1:
        yield from (_tokenize_record(tokenizer, rule, r) for r in records)
        return
    import itertools
    import multiprocessing
    import pickle

    try:
        pickle.dumps(tokenizer)
    except Exception as err:  # noqa: BLE001 - whatever the tokenizer's own pickling raises
        raise ValueError(f"--workers {workers}: this tokenizer cannot be sent to worker "
                         f"processes ({err}); use --workers 1") from None
    records = iter(records)
    batches = iter(lambda: list(itertools.islice(records, WORKER_BATCH)), [])
    with _tokenizers_threads_off(), multiprocessing.get_context("spawn").Pool(
            workers, initializer=_init_worker, initargs=(tokenizer, rule)) as pool:
        for batch in pool.imap(_tokenize_batch, batches):
            yield from batch


def preprocess_masked(inputs: str | Sequence[str], output_prefix: str, tokenizer,
                      rule: MaskRule, jsonl_keys: Sequence[str] = ("text",),
                      num_docs: int | None = None, workers: int = 1,
                      log_interval: int = 0) -> ChatResult:
    """Tokenize `inputs`, write `{prefix}_{key}_document` per key (`{prefix}_text_document` in
    prompt/completion mode) and the label file `{prefix}_label_document` (of the first key).
    `workers` > 1 tokenizes in that many processes (the same files); `log_interval` logs the
    progress every that many documents (0: the progress bar only)."""
    files = expand_inputs(inputs)
    if bool(rule.prompt_key) != bool(rule.completion_key):
        raise ValueError("--prompt-key and --completion-key go together")
    if not rule.prompt_key and not rule.mask_before:
        raise ValueError("say where the loss starts: --mask-before-token, or --prompt-key and "
                         "--completion-key")
    beyond = [t for t in rule.mask_before if not 0 <= t < tokenizer.vocab_size]
    if beyond:
        raise ValueError(f"--mask-before-token {','.join(map(str, rule.mask_before))}: "
                         f"{beyond[0]} is not a token id of this tokenizer (0 to "
                         f"{tokenizer.vocab_size - 1}), so no document would contain it")
    keys = ["text"] if rule.prompt_key else list(jsonl_keys)
    make_output_dir(os.path.dirname(os.path.abspath(output_prefix)), "--output-prefix")
    dtype = best_fitting_dtype(max(tokenizer.vocab_size, tokenizer.max_token_id + 1))
    result = ChatResult(prefixes={k: f"{output_prefix}_{k}_document" for k in keys})
    result.prefixes["label"] = f"{output_prefix}_label_document"
    builders = {k: MMapIndexedDatasetBuilder(p + ".bin", dtype,
                                             values="labels" if k == "label" else "tokens")
                for k, p in result.prefixes.items()}
    unmarked = unlabelled = read = 0  # without the mask pattern; with no label; read so far
    documents = (_Records(files, rule) if rule.prompt_key
                 else (tuple(d[k] for k in keys) for d in iter_documents(files, keys)))
    try:
        for per_key, labels in progress(_tokenized(documents, tokenizer, rule, workers),
                                        total=num_docs, desc="documents", unit="doc"):
            read += 1
            if log_interval and read % log_interval == 0:
                logger.info("processed %d%s documents, %d tokens", read,
                            f"/{num_docs}" if num_docs else "", result.tokens)
            if not per_key[0]:
                continue  # an empty document, skipped as preprocess_data.py does
            if rule.mask_before and find(per_key[0], rule.mask_before) < 0:
                unmarked += 1
            if all(v == IGNORE_LABEL for v in labels):
                unlabelled += 1
            for key, tokens in zip(keys, per_key):
                builders[key].add_item(tokens)
                builders[key].end_document()
            builders["label"].add_item(labels)
            builders["label"].end_document()
            result.documents += 1
            result.tokens += len(per_key[0])
            result.labelled += sum(1 for v in labels if v != IGNORE_LABEL)
        if unmarked and unmarked == result.documents:  # nothing is written
            raise ValueError(f"no document contains --mask-before-token "
                             f"{','.join(map(str, rule.mask_before))}, so every token would "
                             "carry loss, the prompts' too; give the ids the documents put "
                             "between prompt and answer")
        for name, builder in builders.items():
            builder.finalize(index_file_path(result.prefixes[name]))
    except BaseException:
        for builder in builders.values():
            builder.abort()
        raise
    logger.info("wrote %d documents, %d tokens of which %d labels", result.documents,
                result.tokens, result.labelled)
    pattern = ",".join(map(str, rule.mask_before))
    if unmarked:
        logger.warning("%d of %d documents do not contain --mask-before-token %s: every token "
                       "of those carries loss (GPT-NeoX's rule)", unmarked, result.documents,
                       pattern)
    if unlabelled:
        logger.warning("%d of %d documents have no token that carries loss (an empty "
                       "completion, or the pattern at the very end): they add nothing to "
                       "training", unlabelled, result.documents)
    return result
