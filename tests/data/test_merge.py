"""tools/datasets/merge_datasets.py: documents of every input, in order, byte-exact."""

import subprocess
import sys

import numpy as np

from megatron.data.indexed_dataset import MMapIndexedDataset, make_builder
from tests.runs import ROOT


def write(prefix, docs, vocab_size=1000):
    builder = make_builder(f"{prefix}.bin", impl="mmap", vocab_size=vocab_size)
    for doc in docs:
        for item in doc:
            builder.add_item(np.array(item))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")


def run(*argv):
    return subprocess.run([sys.executable, str(ROOT / "tools/datasets/merge_datasets.py"), *argv],
                          capture_output=True, text=True, timeout=60)


def test_merge_keeps_every_document_in_order(tmp_path):
    write(tmp_path / "a", [[[1, 2, 3]], [[4], [5, 6]]])  # a document of two items
    write(tmp_path / "b", [[[7, 8]]])
    proc = run("--datasets", str(tmp_path / "a"), str(tmp_path / "b"),
               "--output-prefix", str(tmp_path / "ab"))
    assert proc.returncode == 0, proc.stderr
    merged = MMapIndexedDataset(str(tmp_path / "ab"))
    assert [merged[i].tolist() for i in range(len(merged))] == [[1, 2, 3], [4], [5, 6], [7, 8]]
    assert merged.doc_idx.tolist() == [0, 1, 3, 4]
    assert (tmp_path / "ab.bin").read_bytes() == (tmp_path / "a.bin").read_bytes() + \
        (tmp_path / "b.bin").read_bytes()


def test_merge_refuses_mixed_dtypes_and_names_them(tmp_path):
    write(tmp_path / "small", [[[1]]], vocab_size=1000)
    write(tmp_path / "big", [[[70000]]], vocab_size=100_000)
    proc = run("--datasets", str(tmp_path / "small"), str(tmp_path / "big"),
               "--output-prefix", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert "different token dtypes" in proc.stderr and "uint16" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out.idx").exists()


def test_a_folder_is_its_datasets_in_name_order_and_gpt_neox_input_flag_names_it(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    write(shards / "b_text_document", [[[7, 8]]])
    write(shards / "a_text_document", [[[1, 2]], [[3]]])
    proc = run("--input", str(shards), "--output-prefix", str(tmp_path / "all"))
    assert proc.returncode == 0, proc.stderr
    merged = MMapIndexedDataset(str(tmp_path / "all"))
    assert [merged[i].tolist() for i in range(len(merged))] == [[1, 2], [3], [7, 8]]
    assert "merged 2 datasets into" in proc.stderr


def test_a_folder_with_label_files_beside_its_tokens_is_refused_naming_them(tmp_path):
    sft = tmp_path / "sft"
    sft.mkdir()
    write(sft / "train_messages_document", [[[1, 2, 3]]])
    write(sft / "train_messages_label_document", [[[0, 2, 3]]])  # as named, not as made
    proc = run("--datasets", str(sft), "--output-prefix", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert (f"error: directory {sft} holds label or reward files (train_messages_label_document) "
            "beside token files (train_messages_document): merged as one they would put labels "
            "among the tokens; merge each kind on its own") in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("out*"))
    # a folder of label files alone merges
    labels = tmp_path / "labels"
    labels.mkdir()
    (sft / "train_messages_label_document.idx").rename(labels / "a_label_document.idx")
    (sft / "train_messages_label_document.bin").rename(labels / "a_label_document.bin")
    proc = run("--datasets", str(labels), "--output-prefix", str(tmp_path / "all_labels"))
    assert proc.returncode == 0, proc.stderr
