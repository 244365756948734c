"""preprocess_data_with_mask.py: GPT-NeoX's --mask-before-token rule, and prompt/completion
records whose prompt carries no loss."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from megatron.data.indexed_dataset import IGNORE_LABEL, MMapIndexedDataset
from megatron.data.mask_preprocess import MaskRule, masked_labels, preprocess_masked
from megatron.tokenizer import build_tokenizer
from tests.runs import ROOT, explain

SCRIPT = ROOT / "tools" / "datasets" / "preprocess_data_with_mask.py"


def test_gpt_neox_rule_masks_up_to_and_including_the_first_pattern():
    assert masked_labels([5, 6, 7, 8, 7, 8, 9], [7, 8]) == [IGNORE_LABEL] * 4 + [7, 8, 9]
    assert masked_labels([5, 6, 9], [7, 8]) == [5, 6, 9]  # absent: everything carries loss


def test_prompt_completion_records_mask_the_prompt(small_data, tmp_path):
    tokenizer = build_tokenizer("HFTokenizer", small_data[1])
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "what is red?", "completion": " cherry"}) + "\n"
                    + json.dumps({"prompt": "and blue?", "completion": " sky"}) + "\n")
    out = tmp_path / "sft" / "train"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--input", str(data), "--prompt-key",
                           "prompt", "--completion-key", "completion", "--tokenizer-type",
                           "HFTokenizer", "--vocab-file", small_data[1], "--append-eod",
                           "--output-prefix", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, explain(proc)
    tokens = MMapIndexedDataset(f"{out}_text_document")
    labels = MMapIndexedDataset(f"{out}_label_document")
    prompt = tokenizer.tokenize("what is red?")
    completion = tokenizer.tokenize(" cherry") + [tokenizer.eod]
    assert tokens.get(0).tolist() == prompt + completion
    assert labels.get(0).tolist() == [IGNORE_LABEL] * len(prompt) + completion
    assert np.array_equal(tokens.sizes, labels.sizes)


def test_the_mask_rule_on_jsonl_text_and_what_is_refused(small_data, tmp_path):
    tokenizer = build_tokenizer("HFTokenizer", small_data[1])
    marker = tokenizer.tokenize(" Answer:")  # as it is tokenized inside the text
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"text": "Question: red? Answer: cherry"}) + "\n")
    result = preprocess_masked(str(data), str(tmp_path / "m"), tokenizer,
                               MaskRule(mask_before=tuple(marker)))
    tokens = MMapIndexedDataset(result.prefixes["text"]).get(0).tolist()
    labels = MMapIndexedDataset(result.prefixes["label"]).get(0).tolist()
    cut = labels.count(IGNORE_LABEL)
    assert labels[cut:] == tokens[cut:] and tokenizer.detokenize(tokens[cut:]).strip() == "cherry"
    with pytest.raises(ValueError, match="say where the loss starts"):
        preprocess_masked(str(data), str(tmp_path / "n"), tokenizer, MaskRule())
    with pytest.raises(ValueError, match="has no text under 'prompt'"):
        preprocess_masked(str(data), str(tmp_path / "o"), tokenizer,
                          MaskRule(prompt_key="prompt", completion_key="completion"))


def test_a_pattern_no_document_holds_is_refused_and_unmasked_or_unlabelled_ones_counted(
        small_data, tmp_path, caplog):
    """GPT-NeoX's rule gives a document without the pattern loss on every token, the prompt's
    too, without a word: here a pattern in no document is refused (nothing written), one beyond
    the vocabulary before reading, and the documents it leaves unmasked, or without any token
    that carries loss, are counted in a warning."""
    import logging

    tokenizer = build_tokenizer("HFTokenizer", small_data[1])
    marker = tuple(tokenizer.tokenize(" Answer:"))
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in (
        "Question: red? Answer: cherry", "no marker in this one", "Question: blue? Answer:")))
    with pytest.raises(ValueError, match=rf"^--mask-before-token {tokenizer.vocab_size}: "
                       rf"{tokenizer.vocab_size} is not a token id of this tokenizer \(0 to "
                       rf"{tokenizer.vocab_size - 1}\)"):
        preprocess_masked(str(data), str(tmp_path / "a"), tokenizer,
                          MaskRule(mask_before=(tokenizer.vocab_size,)))
    absent = tuple(tokenizer.tokenize(" zebra"))
    with pytest.raises(ValueError, match=r"^no document contains --mask-before-token .*, so "
                                         r"every token would carry loss, the prompts' too"):
        preprocess_masked(str(data), str(tmp_path / "b"), tokenizer, MaskRule(mask_before=absent))
    assert not list(tmp_path.glob("b_*"))
    with caplog.at_level(logging.WARNING, logger="megatron"):
        preprocess_masked(str(data), str(tmp_path / "c"), tokenizer,
                          MaskRule(mask_before=marker))
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [
        f"1 of 3 documents do not contain --mask-before-token {','.join(map(str, marker))}: "
        "every token of those carries loss (GPT-NeoX's rule)",
        "1 of 3 documents have no token that carries loss (an empty completion, or the pattern "
        "at the very end): they add nothing to training"]
