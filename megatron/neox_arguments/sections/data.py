"""The data and tokenizer sections."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option


@dataclass(frozen=True)
class DataArgs:
    """Where training data lives, how it is split, blended and masked."""

    data_path: str | None = option(
        None, "Prefix of one tokenized dataset (.bin/.idx) split into train/valid/test by `split`."
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
        "Replace the blend weights by document counts raised to weighted_sampler_alpha.",
    )
    weighted_sampler_alpha: float = option(
        1.0, "Exponent for weight_by_num_documents; below 1 boosts small datasets."
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
    data_cache_dir: str | None = option(
        None, "Directory for the sample-index caches; null writes them beside the data."
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
