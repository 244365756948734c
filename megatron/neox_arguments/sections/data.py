"""The data and tokenizer sections."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option


@dataclass(frozen=True)
class DataArgs:
    """Where training data lives, how it is split, blended and masked."""

    data_path: str | list[str] | None = option(
        None, "Prefix of one tokenized dataset (.bin/.idx) split into train/valid/test by `split`; "
        "a list of prefixes: each split blends its part of each, in proportion to their tokens."
    )
    train_data_paths: list[str] | None = option(
        None, "Dataset prefixes to blend for training (instead of data_path)."
    )
    valid_data_paths: list[str] | None = option(
        None, "Dataset prefixes to blend for validation (instead of data_path)."
    )
    test_data_paths: list[str] | None = option(
        None, "Dataset prefixes to blend for testing (instead of data_path)."
    )
    train_data_weights: list[float] | None = option(
        None, "Blend weight per train_data_paths entry; null means equal weights."
    )
    valid_data_weights: list[float] | None = option(
        None, "Blend weight per valid_data_paths entry; null means equal weights."
    )
    test_data_weights: list[float] | None = option(
        None, "Blend weight per test_data_paths entry; null means equal weights."
    )
    weight_by_num_documents: bool = option(
        False,
        "Replace the blend weights by w_i = p_i ** weighted_sampler_alpha * (1 - p_i), "
        "normalised, p_i being dataset i's share of the documents (GPT-NeoX's formula; alpha 1 "
        "gives [900, 100] documents weights [0.5, 0.5]).",
    )
    weighted_sampler_alpha: float = option(
        1.0, "Exponent alpha of weight_by_num_documents; a smaller alpha boosts small datasets."
    )
    split: str = option(
        "969, 30, 1", "Train, valid, test proportions of data_path, e.g. \"949,50,1\"."
    )
    data_impl: str = option(
        "infer", "Indexed dataset format: infer (read from each .idx header) or mmap; only the "
        "mmap format exists here (GPT-NeoX's older 'cached' format is refused by name)."
    )
    mmap_warmup: bool = option(False, "Read every .bin once at start-up so the page cache holds it.")
    num_workers: int = option(2, "Data-loader worker processes per rank.")
    eod_mask_loss: bool = option(False, "Exclude end-of-document tokens from the loss.")
    reset_position_ids: bool = option(
        False, "Restart position ids after each end-of-document token."
    )
    reset_attention_mask: bool = option(
        False, "Stop attention from crossing end-of-document tokens."
    )
    dataset_impl: str = option(
        "gpt2",
        "Kind of dataset: gpt2 (one token stream, with optional label and reward files) or "
        "pairwise (chosen/rejected pairs from pos_* and neg_* paths, for train_impl dpo and rm).",
    )
    pack_impl: str = option(
        "packed",
        "How documents become samples: packed (one stream cut every seq_length tokens, documents "
        "crossing samples), pack_until_overflow (whole documents added to a sample while they "
        "fit, then padded) or unpacked (one document per sample, padded).",
    )
    allow_chopped: bool = option(
        True,
        "pack_until_overflow / unpacked: a document longer than seq_length + 1 tokens is cut to "
        "fit (true) or left out (false).",
    )
    train_label_data_paths: list[str] | None = option(
        None,
        "Label files, one per train_data_paths entry: the token id at each position that carries "
        "loss, -100 where it does not (preprocess_data_with_chat_template.py, "
        "preprocess_data_with_mask.py).",
    )
    valid_label_data_paths: list[str] | None = option(
        None, "Label files, one per valid_data_paths entry."
    )
    test_label_data_paths: list[str] | None = option(
        None, "Label files, one per test_data_paths entry."
    )
    train_reward_data_paths: list[str] | None = option(
        None, "Reward files (one value per document; KTO), one per train_data_paths entry."
    )
    valid_reward_data_paths: list[str] | None = option(
        None, "Reward files, one per valid_data_paths entry."
    )
    test_reward_data_paths: list[str] | None = option(
        None, "Reward files, one per test_data_paths entry."
    )
    pos_train_data_paths: list[str] | None = option(
        None, "Chosen responses of the training pairs (dataset_impl pairwise)."
    )
    neg_train_data_paths: list[str] | None = option(
        None, "Rejected responses of the training pairs, one file per pos_train_data_paths entry."
    )
    pos_valid_data_paths: list[str] | None = option(None, "Chosen responses, validation pairs.")
    neg_valid_data_paths: list[str] | None = option(None, "Rejected responses, validation pairs.")
    pos_test_data_paths: list[str] | None = option(None, "Chosen responses, test pairs.")
    neg_test_data_paths: list[str] | None = option(None, "Rejected responses, test pairs.")
    pos_train_label_data_paths: list[str] | None = option(
        None, "Label files of pos_train_data_paths (null: every token carries loss)."
    )
    neg_train_label_data_paths: list[str] | None = option(
        None, "Label files of neg_train_data_paths."
    )
    pos_valid_label_data_paths: list[str] | None = option(
        None, "Label files of pos_valid_data_paths."
    )
    neg_valid_label_data_paths: list[str] | None = option(
        None, "Label files of neg_valid_data_paths."
    )
    pos_test_label_data_paths: list[str] | None = option(
        None, "Label files of pos_test_data_paths."
    )
    neg_test_label_data_paths: list[str] | None = option(
        None, "Label files of neg_test_data_paths."
    )
    data_cache_dir: str | None = option(
        None, "Directory for the sample-index caches and the kept largest token id of each token "
        "file; null writes them beside the data."
    )
    data_fingerprint: str = option(
        "sampled",
        "How checkpoints fingerprint each .bin: sampled (sha256 of 64 blocks of 64 KiB at fixed "
        "offsets, blind to changes between them) or full (sha256 of every byte, read at start-up "
        "on every rank).",
    )


@dataclass(frozen=True)
class TokenizerArgs:
    """Which tokenizer turns text into ids and the files it needs."""

    tokenizer_type: str = option(
        "GPT2BPETokenizer",
        "Tokenizer: GPT2BPETokenizer, HFGPT2Tokenizer, HFTokenizer, SPMTokenizer, "
        "CharLevelTokenizer or TiktokenTokenizer.",
    )
    vocab_file: str | None = option(
        None, "Vocabulary file (tokenizer.json for HFTokenizer, vocab.json for GPT-2 BPE)."
    )
    merge_file: str | None = option(None, "BPE merges file (GPT2BPETokenizer).")
