"""build_train_valid_test_datasets and build_data_loader end to end on small token files."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron.data.blendable_dataset import BlendableDataset
from megatron.data.gpt2_dataset import GPT2Dataset
from megatron.data.indexed_dataset import MMapIndexedDataset
from megatron.data.loaders import (available_cpus, build_data_loader,
                                   build_train_valid_test_datasets, clamp_num_workers,
                                   cyclic_iter)


@pytest.fixture
def prefixes(tmp_path, write_dataset, random_documents):
    """Two datasets: 'a' with 100 documents, 'b' with 40 longer ones."""
    a = str(tmp_path / "a")
    b = str(tmp_path / "b")
    write_dataset(a, random_documents(100, max_len=30, min_len=5, seed=1))
    write_dataset(b, random_documents(40, max_len=90, min_len=20, seed=2))
    return a, b


def build(**kw):
    kw.setdefault("seq_length", 8)
    kw.setdefault("seed", 3)
    return build_train_valid_test_datasets(**kw)


def test_single_prefix_is_split_by_documents(prefixes):
    a, _ = prefixes
    train, valid, test = build(data_path=a, split="80,20,0",
                               train_valid_test_num_samples=(100, 20, 0))
    assert isinstance(train, GPT2Dataset) and isinstance(valid, GPT2Dataset) and test is None
    assert train.documents.tolist() == list(range(80))
    assert valid.documents.tolist() == list(range(80, 100))
    assert len(train) >= 100 and len(valid) >= 20
    assert train[0]["text"].shape == (9,)


def test_split_without_documents_is_none_with_a_warning(prefixes, caplog):
    a, _ = prefixes
    with caplog.at_level(logging.WARNING, logger="megatron"):
        _, _, test = build(data_path=[a], split="969, 30, 1",
                           train_valid_test_num_samples=(10, 10, 10))
    assert test is None and "test split has no documents; 10 requested" in caplog.text


def test_several_prefixes_blend_by_tokens(prefixes):
    a, b = prefixes
    train, _, _ = build(data_path=[a, b], split="1", train_valid_test_num_samples=(1000, 0, 0))
    assert isinstance(train, BlendableDataset) and len(train) == 1000
    tokens = np.array([d.indexed_dataset.num_tokens for d in train.datasets], dtype=float)
    assert np.allclose(train.weights, tokens / tokens.sum())
    assert [d.name for d in train.datasets] == ["train_0", "train_1"]


def test_explicit_paths_and_weights(prefixes):
    a, b = prefixes
    train, valid, test = build(train_data_paths=[a, b], train_data_weights=[1, 3],
                               valid_data_paths=[b], test_data_paths=[a],
                               train_valid_test_num_samples=(400, 30, 5))
    counts = np.bincount(train.dataset_index)
    assert counts.tolist() == [100, 300]
    for d, n in zip(train.datasets, counts):  # each part holds its share plus 0.5%
        assert len(d) >= n
    assert isinstance(valid, GPT2Dataset) and valid.documents.tolist() == list(range(40))
    assert isinstance(test, GPT2Dataset) and len(test) >= 5
    equal, _, _ = build(train_data_paths=[a, b], train_valid_test_num_samples=(10, 0, 0))
    assert equal.weights.tolist() == [0.5, 0.5]


def test_one_listed_path_holds_gpt_neoxs_spare_samples(prefixes):
    """GPT-NeoX builds every dataset of train_data_paths, one alone too, for its share of the
    samples plus 0.5% (its data_path for exactly the samples asked): asked for one epoch's
    samples, the listed file is built for two epochs, whose shuffle orders other documents."""
    a, _ = prefixes
    epoch = (int(MMapIndexedDataset(a).sizes.sum()) - 1) // 8
    listed, _, _ = build(train_data_paths=[a], train_valid_test_num_samples=(epoch, 0, 0))
    exact, _, _ = build(data_path=a, split="1", train_valid_test_num_samples=(epoch, 0, 0))
    spare, _, _ = build(data_path=a, split="1",
                        train_valid_test_num_samples=(math.ceil(epoch * 1.005), 0, 0))
    samples = [[d[i]["text"].tolist() for i in range(epoch)] for d in (listed, exact, spare)]
    assert len(exact) == epoch and len(listed) == len(spare) > epoch
    assert samples[0] == samples[2] and samples[0] != samples[1]


def test_weight_by_num_documents_overrides_weights(prefixes, caplog):
    a, b = prefixes
    with caplog.at_level(logging.WARNING, logger="megatron"):
        train, _, _ = build(train_data_paths=[a, b], train_data_weights=[1, 1],
                            weight_by_num_documents=True, weighted_sampler_alpha=0.5,
                            train_valid_test_num_samples=(100, 0, 0))
    assert "train_data_weights are ignored" in caplog.text
    assert train.weights[0] < 0.5  # 100 vs 40 documents: (1 - share) favours the smaller one
    # GPT-NeoX's counts: each file's whole document count (its indexed_dataset.sizes.shape[0])
    share = np.array([100, 40]) / 140
    expected = share ** 0.5 * (1 - share)
    np.testing.assert_allclose(train.weights, expected / expected.sum(), rtol=1e-12)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(), "no data given"),
    (dict(data_path="A", train_data_paths=["A"]), "either data_path or"),
    (dict(train_data_paths=["A", "B"], train_data_weights=[1]), "one weight per data path"),
    (dict(data_path="A", train_valid_test_num_samples=(1, 2)), "three counts"),
])
def test_bad_data_settings(prefixes, kwargs, pattern):
    a, b = prefixes
    kwargs = {k: ({"A": a, "B": b}.get(v, v) if isinstance(v, str) else
                  [{"A": a, "B": b}[x] for x in v] if k.endswith("paths") else v)
              for k, v in kwargs.items()}
    kwargs.setdefault("train_valid_test_num_samples", (10, 0, 0))
    with pytest.raises(ValueError, match=pattern):
        build(**kwargs)


def test_token_ids_are_checked_against_the_vocabulary(prefixes):
    a, _ = prefixes
    with pytest.raises(ValueError, match=r"a\.bin holds token id \d+, but the model's vocab"):
        build(data_path=a, split="1", train_valid_test_num_samples=(10, 0, 0), vocab_size=500)
    build(data_path=a, split="1", train_valid_test_num_samples=(10, 0, 0), vocab_size=1000)


def test_loader_batches_ranks_and_resume(prefixes):
    a, _ = prefixes
    train, _, _ = build(data_path=a, split="1", train_valid_test_num_samples=(64, 0, 0))
    loaders = [build_data_loader(train, 0, 2, r, 2, num_workers=0) for r in range(2)]
    first = [next(iter(loader))["text"] for loader in loaders]
    assert first[0].dtype == torch.int64 and first[0].shape == (2, 9)
    assert torch.equal(first[0][1], torch.from_numpy(train[1]["text"]))
    assert torch.equal(first[1][0], torch.from_numpy(train[2]["text"]))
    batches = list(loaders[1])
    resumed = list(build_data_loader(train, 3 * 4, 2, 1, 2, num_workers=0))
    assert len(resumed) == len(batches) - 3
    assert all(torch.equal(x["text"], y["text"]) for x, y in zip(resumed, batches[3:]))
    assert build_data_loader(None, 0, 2, 0, 1, 0) is None


def test_num_workers_are_clamped_to_the_cpus(caplog):
    cpus = available_cpus()
    with caplog.at_level(logging.WARNING, logger="megatron"):
        assert clamp_num_workers(cpus + 5) == cpus
        assert clamp_num_workers(cpus + 5) == cpus  # the train, valid and test loaders
    assert caplog.text.count(f"num_workers={cpus + 5} exceeds the {cpus} available CPUs") == 1
    assert clamp_num_workers(0) == 0
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        clamp_num_workers(-1)


def test_loader_with_worker_processes(prefixes):
    a, _ = prefixes
    train, _, _ = build(data_path=a, split="1", train_valid_test_num_samples=(16, 0, 0))
    loader = build_data_loader(train, 0, 4, 0, 1, num_workers=1)
    got = torch.cat([b["text"] for b in loader])
    expected = torch.from_numpy(np.stack([train[i]["text"] for i in range(len(got))]))
    assert torch.equal(got, expected)


def test_cyclic_iter_repeats_and_refuses_empty_loaders():
    it = cyclic_iter([1, 2])
    assert [next(it) for _ in range(5)] == [1, 2, 1, 2, 1]
    with pytest.raises(RuntimeError, match="yielded no batch"):
        next(cyclic_iter([]))


def test_too_small_dataset_for_one_global_batch(prefixes):
    a, _ = prefixes
    train, _, _ = build(data_path=a, split="1", train_valid_test_num_samples=(10, 0, 0))
    with pytest.raises(ValueError, match="fewer than one global micro-batch"):
        build_data_loader(train, 0, len(train), 0, 2, num_workers=0)


@pytest.mark.parametrize("global_batch, ok", [(None, True), (22, True), (23, False)])
def test_split_smaller_than_one_global_batch_is_an_error(prefixes, global_batch, ok):
    a, _ = prefixes  # 100 documents of 5..30 tokens: split "90,10" leaves valid 10 documents
    valid_tokens = int(MMapIndexedDataset(a).sizes[90:].sum())
    valid_samples = (valid_tokens - 1) // 8
    assert valid_samples == 22, "fixture changed; pick other global batches"
    kwargs = dict(data_path=a, split="90,10", train_valid_test_num_samples=(50, 40, 0),
                  global_batch_size=global_batch)
    if ok:
        assert build(**kwargs)[1] is not None
        return
    with pytest.raises(ValueError) as err:
        build(**kwargs)
    assert str(err.value).startswith(
        f"the valid split holds {valid_tokens} tokens (22 samples of seq_length + 1 = 9 tokens), "
        "fewer than one global batch of 23 samples")


def test_blend_counts_the_samples_of_every_part(prefixes):
    a, b = prefixes
    samples = [(int(MMapIndexedDataset(p).sizes.sum()) - 1) // 8 for p in (a, b)]
    build(train_data_paths=[a, b], train_valid_test_num_samples=(10, 0, 0),
          global_batch_size=sum(samples))
    pattern = rf"the train split holds \d+ tokens \({sum(samples)} samples of"
    with pytest.raises(ValueError, match=pattern):
        build(train_data_paths=[a, b], train_valid_test_num_samples=(10, 0, 0),
              global_batch_size=sum(samples) + 1)
    with pytest.raises(ValueError, match="global_batch_size must be an integer >= 1, got 0"):
        build(data_path=a, train_valid_test_num_samples=(10, 0, 0), global_batch_size=0)


def test_epochs_needed_are_logged_per_split(prefixes, caplog):
    a, b = prefixes
    tokens = int(MMapIndexedDataset(a).sizes.sum())
    samples = (tokens - 1) // 8
    with caplog.at_level(logging.DEBUG, logger="megatron"):
        build(data_path=a, split="1", train_valid_test_num_samples=(3 * samples, 0, 0))
    split_line = (f"train split: {tokens} tokens = {samples} samples per epoch; {3 * samples} "
                  "samples requested -> 3.00 epochs")
    # one dataset: its own line (INFO) says it, the split's total is a debug line
    assert [r.levelname for r in caplog.records if r.getMessage() == split_line] == ["DEBUG"]
    assert any("-> 3 epoch(s)" in r.getMessage() and r.levelname == "INFO"
               for r in caplog.records)  # GPT2Dataset: the whole epochs it built
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="megatron"):  # a blend: the total at INFO
        build(train_data_paths=[a, b], train_valid_test_num_samples=(10, 0, 0))
    assert any(r.getMessage().startswith("train split: ") for r in caplog.records)


def test_loader_clamps_num_workers_with_a_warning(prefixes, caplog):
    a, _ = prefixes
    train, _, _ = build(data_path=a, split="1", train_valid_test_num_samples=(16, 0, 0))
    cpus = available_cpus()
    with caplog.at_level(logging.WARNING, logger="megatron"):
        loader = build_data_loader(train, 0, 4, 0, 1, num_workers=cpus + 3)
    assert loader.num_workers == cpus
    assert f"num_workers={cpus + 3} exceeds the {cpus} available CPUs; using {cpus}" in caplog.text


def test_iterating_a_loader_leaves_the_global_random_state_alone(prefixes):
    a, _ = prefixes
    train, _, _ = build(data_path=a, split="1", train_valid_test_num_samples=(16, 0, 0))
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    for _ in range(2):  # a resumed run and every evaluation start a fresh iteration
        next(iter(build_data_loader(train, 0, 4, 0, 1, num_workers=0)))
    assert torch.equal(torch.rand(3), expected)


def test_loader_ends_after_the_dataset(prefixes):
    a, _ = prefixes
    train, _, _ = build(data_path=a, split="1", train_valid_test_num_samples=(16, 0, 0))
    batches = list(build_data_loader(train, 0, 4, 0, 1, num_workers=0))
    assert len(batches) == len(train) // 4  # finite: one pass, then StopIteration


def test_a_run_continued_past_its_train_iters_has_validation_samples_for_every_evaluation():
    """eval_interval 15, eval_iters 2, global batch 16: a run to 30 reads 2 evaluations; one
    continued to 42 evaluates at its end (3), one continued again to 48 at 45 and 48 (5): each
    gets at least what it reads, and a run resumed within its train_iters keeps GPT-NeoX's
    count (the cached sample index, and so its validation batches, unchanged)."""
    from types import SimpleNamespace

    from megatron.data.options import sample_counts

    def args(train_iters):
        return SimpleNamespace(derived=SimpleNamespace(train_batch_size=16),
                               training=SimpleNamespace(train_iters=train_iters,
                                                        eval_interval=15, eval_iters=2))

    batch = 2 * 16
    assert sample_counts(args(30)).valid == 3 * batch  # GPT-NeoX: (30 // 15 + 1) evaluations
    assert sample_counts(args(30), 20, 1 * batch).valid == 3 * batch  # resumed: unchanged
    assert sample_counts(args(42), 30, 2 * batch).valid == 3 * batch  # 2 read + 1 at 42
    assert sample_counts(args(48), 42, 3 * batch).valid == 5 * batch  # 3 read + 45 and 48
    assert sample_counts(args(48), 48, 5 * batch).valid == 6 * batch  # finished: one more


def test_a_list_of_data_path_prefixes_is_taken_from_yaml_and_each_is_checked(small_data,
                                                                           tmp_path):
    """docs/data.md: `data_path` may be a list of prefixes; deepy.py opens each, naming the
    key of one that is missing."""
    import shutil

    from megatron.neox_arguments import NeoXArgs
    from megatron.preflight import preflight
    from tests.runs import ROOT

    prefix, tokenizer = small_data
    for ext in (".bin", ".idx"):
        shutil.copy(prefix + ext, tmp_path / f"copy{ext}")
    config = tmp_path / "data.yml"
    config.write_text(f"data_path: [{prefix}, {tmp_path / 'copy'}]\nvocab_file: {tokenizer}\n"
                      f"save: {tmp_path / 'run'}\nload: {tmp_path / 'run'}\nnum_gpus: 1\n")
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml", config])
    assert args.data.data_path == [prefix, str(tmp_path / "copy")]
    preflight(args, "train.py")
    with pytest.raises(FileNotFoundError, match=f"^data_path: .*{tmp_path / 'missing'}"):
        preflight(args.replace(data_path=[prefix, str(tmp_path / "missing")]), "train.py")


def test_token_ids_beyond_the_vocabulary_are_refused_before_any_worker(small_data, tmp_path):
    """A12 in deepy.py: a token file with ids the tokenizer does not have (tokenized with
    another tokenizer) is refused naming the file, the id and the vocabulary, before any worker;
    the largest id it found is kept where the workers look for it."""
    from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
    from megatron.data.token_ids import cache_path
    from megatron.neox_arguments import NeoXArgs
    from megatron.preflight import preflight
    from tests.runs import ROOT

    prefix = str(tmp_path / "other_tokenizer")
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    builder.add_documents(np.random.default_rng(0).integers(0, 3001, size=500_000), [500] * 1000)
    builder.finalize(prefix + ".idx")
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], [
        f"data_path={prefix}", f"vocab_file={small_data[1]}", "num_gpus=1",
        f"save={tmp_path / 'run'}", f"load={tmp_path / 'run'}",
        f"data_cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(ValueError) as err:
        preflight(args, "train.py")
    assert str(err.value).startswith(
        f"{prefix}.bin holds token id 3000, but the model's vocabulary has 2048 entries")
    kept = cache_path(MMapIndexedDataset(prefix), str(tmp_path / "cache"))
    assert json.loads(Path(kept).read_text())["max_token_id"] == 3000


def test_a_train_split_without_documents_is_refused_before_any_worker(small_data, tmp_path):
    """split 0,100,0 (or an empty dataset) leaves training nothing: one line from deepy.py, not
    a DeepSpeed traceback from every worker."""
    from megatron.neox_arguments import NeoXArgs
    from megatron.preflight import preflight
    from tests.runs import ROOT

    prefix, tokenizer = small_data
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], [
        f"data_path={prefix}", f"vocab_file={tokenizer}", "split=0,100,0", "num_gpus=1",
        f"save={tmp_path / 'run'}", f"load={tmp_path / 'run'}"])
    with pytest.raises(ValueError) as err:
        preflight(args, "train.py")
    assert str(err.value) == (
        f"the train split holds no documents (data_path {prefix} with split '0,100,0'), but "
        f"training needs {args.training.train_iters * args.derived.train_batch_size} samples: "
        "give it data (its data paths, or a split whose first proportion is not 0)")
