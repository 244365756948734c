"""Samples of whole documents (pack_impl unpacked / pack_until_overflow) with their label and
reward files, chosen/rejected pairs, and the checks that files belong together (each error
names both files)."""

from __future__ import annotations

import numpy as np
import pytest

from megatron.data.aligned import check_pair, open_labels, read_rewards, supervised_documents
from megatron.data.document_dataset import DocumentDataset, PairwiseDataset
from megatron.data.indexed_dataset import (IGNORE_LABEL, MMapIndexedDataset,
                                           MMapIndexedDatasetBuilder)
from megatron.data.packing import pack_documents

M = IGNORE_LABEL


def write(prefix, docs, values="tokens"):
    with MMapIndexedDatasetBuilder(f"{prefix}.bin", np.int32, values=values) as b:
        for doc in docs:
            b.add_item(doc)
            b.end_document()
        b.finalize(f"{prefix}.idx")
    return MMapIndexedDataset(str(prefix))


DOCS = [[10, 11, 12], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37], [40]]
LABELS = [[M, 11, 12], [M, M], [M, M, 32, 33, 34, 35, 36, 37], [40]]


@pytest.fixture
def files(tmp_path):
    return write(tmp_path / "tok", DOCS), write(tmp_path / "lab", LABELS, "labels")


def test_unpacked_samples_are_one_padded_document_with_masked_padding(files):
    tokens, labels = files
    ds = DocumentDataset("train", "tok", np.arange(4), tokens, num_samples=6, seq_length=4,
                         seed=1, pack_impl="unpacked", labels=labels, pad_id=1)
    seen = {}
    for i in range(len(ds)):
        s = ds[i]
        assert all(len(v) == 5 for v in s.values())
        seen[int(s["text"][0])] = s
    # document 1 has no label after its first token: never a sample; 3 is too short for a
    # target; document 2 (8 tokens) is cut to 5
    assert sorted(seen) == [10, 30]
    assert seen[10]["text"].tolist() == [10, 11, 12, 1, 1]
    assert seen[10]["label"].tolist() == [M, 11, 12, M, M]
    assert seen[10]["segment"].tolist() == [0, 0, 0, -1, -1]
    assert seen[30]["text"].tolist() == [30, 31, 32, 33, 34]


def test_documents_too_long_are_left_out_unless_chopped(files):
    tokens, _ = files
    kept = pack_documents(tokens.sizes, np.arange(4), 4, 8, 0, "unpacked", allow_chopped=False)
    assert sorted(set(kept.doc_idx.tolist())) == [0, 1, 3]
    with pytest.raises(ValueError, match="none of its 1 documents can make a sample.*longer "
                                         "than seq_length \\+ 1 = 4 tokens"):
        DocumentDataset("train", "tok", np.array([2]), tokens, 4, 3, 0, "unpacked",
                        allow_chopped=False)


def test_pack_until_overflow_packs_whole_documents_and_numbers_them(files):
    tokens, labels = files
    samples = pack_documents(tokens.sizes, np.array([0, 1, 3]), 6, 3, 0, "pack_until_overflow")
    for j in range(len(samples)):  # each sample's documents fit in 7 tokens
        docs = samples.doc_idx[samples.starts[j]:samples.starts[j + 1]]
        assert tokens.sizes[docs].sum() <= 7
    ds = DocumentDataset("train", "tok", np.array([0, 1, 3]), tokens, 3, 6, 0,
                         "pack_until_overflow")
    s = ds[0]
    segments = s["segment"].tolist()
    assert segments[0] == 0 and max(segments) >= 1 and segments.count(-1) == 7 - len(
        [t for t in segments if t >= 0])
    assert (s["label"] == np.where(s["segment"] >= 0, s["text"], M)).all()  # no label file


def test_pairs_pack_by_the_longer_side_and_keep_their_order(tmp_path):
    pos = write(tmp_path / "pos", [[1, 2, 3], [4, 5], [6, 7, 8, 9]])
    neg = write(tmp_path / "neg", [[1, 2], [4, 5, 5, 5], [6]])
    ds = PairwiseDataset("train", "pos", np.arange(3), pos, neg, 6, 5, 0, "pack_until_overflow")
    for i in range(len(ds)):
        s = ds[i]
        assert s["pos_segment"].max() == s["neg_segment"].max()  # the same pairs on both sides
        for k in range(s["pos_segment"].max() + 1):  # pair k: the same document number
            assert s["pos"][s["pos_segment"] == k][0] == s["neg"][s["neg_segment"] == k][0]


def test_label_files_are_checked_against_their_token_files(tmp_path, files):
    tokens, _ = files
    fewer = write(tmp_path / "fewer", LABELS[:3], "labels")
    with pytest.raises(ValueError, match=r"label file .*fewer.idx and token file .*tok.idx do not "
                                         r"belong together: 3 vs 4 documents"):
        open_labels(fewer.path, tokens)
    shorter = write(tmp_path / "shorter", [[M, 11], *LABELS[1:]], "labels")
    with pytest.raises(ValueError, match="document 0 has 2 labels and 3 tokens"):
        open_labels(shorter.path, tokens)
    other = write(tmp_path / "other", [[M, 99, 12], *LABELS[1:]], "labels")
    with pytest.raises(ValueError, match="document 0 position 1 has label 99 where the token is "
                                         "11"):
        open_labels(other.path, tokens)
    with pytest.raises(FileNotFoundError, match=r"label file .*nope .*does not exist"):
        open_labels(str(tmp_path / "nope"), tokens)
    with pytest.raises(ValueError, match="label -5 in item 0 is neither a token id"):
        write(tmp_path / "bad", [[-5, 1]], "labels")


def test_supervision_and_rewards_and_pairs(tmp_path, files):
    tokens, labels = files
    assert supervised_documents(labels, seq_length=4).tolist() == [True, False, True, False]
    rewards = write(tmp_path / "rew", [[1.5], [-1.0], [0.25], [2.0]], "rewards")
    assert read_rewards(rewards.path, tokens).tolist() == [1.5, -1.0, 0.25, 2.0]
    three = write(tmp_path / "rew3", [[1.0]] * 3, "rewards")
    with pytest.raises(ValueError, match="reward file .* do not belong together: 3 vs 4"):
        read_rewards(three.path, tokens)
    with pytest.raises(ValueError, match="chosen-response file .* has 4 documents but "
                                         "rejected-response file .* has 3"):
        check_pair(tokens, write(tmp_path / "neg", DOCS[:3]))
