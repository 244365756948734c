"""How the data section of a config turns documents into samples, and which files go beside the
token files: plain data, read by the workers and by deepy.py's checks alike (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SampleOptions:
    """How a split's documents become samples, and the files beside the token files (each a
    (train, valid, test) triple of lists parallel to the *_data_paths, or None)."""

    dataset_impl: str = "gpt2"
    pack_impl: str = "packed"
    allow_chopped: bool = True
    pad_id: int = 0
    side_files: dict = field(default_factory=dict)  # "label"/"reward"/"neg"/... -> triple


def sample_options(args, pad_id: int = 0) -> SampleOptions:
    """How documents become samples, and the label/reward/rejected files beside the token
    files, from the data section of the config."""
    d = args.data

    def triple(kind: str):
        return tuple(getattr(d, kind.format(split=s)) for s in ("train", "valid", "test"))

    if d.dataset_impl == "pairwise":
        side = {"neg": triple("neg_{split}_data_paths"),
                "label": triple("pos_{split}_label_data_paths"),
                "neg_label": triple("neg_{split}_label_data_paths")}
    else:
        side = {"label": triple("{split}_label_data_paths"),
                "reward": triple("{split}_reward_data_paths")}
    return SampleOptions(dataset_impl=d.dataset_impl, pack_impl=d.pack_impl,
                         allow_chopped=d.allow_chopped, pad_id=pad_id,
                         side_files={k: v for k, v in side.items() if any(p is not None for p in v)})


def token_paths(args) -> tuple:
    """(train, valid, test) token file lists: the chosen side's for pairwise data."""
    d = args.data
    if d.dataset_impl == "pairwise":
        return d.pos_train_data_paths, d.pos_valid_data_paths, d.pos_test_data_paths
    return d.train_data_paths, d.valid_data_paths, d.test_data_paths


@dataclass(frozen=True)
class SampleCounts:
    """Samples each split must provide for the whole run."""

    train: int
    valid: int
    test: int


def sample_counts(args, iteration: int = 0, consumed_valid: int = 0) -> SampleCounts:
    """train_iters x global batch for train; enough evaluation batches for every eval_interval
    (GPT-NeoX's eval_iters x (train_iters // eval_interval + 1)), or, for a run resumed at
    `iteration` having read `consumed_valid` validation samples, what it read and what it will
    read (an evaluation at each eval_interval to train_iters and one at the end), when that is
    more: a run continued past its first train_iters evaluated at the end of each part."""
    gbs = args.derived.train_batch_size
    t = args.training
    evals = (t.train_iters // t.eval_interval + 1) if t.eval_interval else 1
    valid = evals * t.eval_iters * gbs
    if t.eval_interval:
        ahead = max(0, t.train_iters // t.eval_interval - iteration // t.eval_interval)
        ahead += 1 if t.train_iters % t.eval_interval or iteration >= t.train_iters else 0
        valid = max(valid, consumed_valid + ahead * t.eval_iters * gbs)
    return SampleCounts(train=t.train_iters * gbs, valid=valid, test=t.eval_iters * gbs)
