"""The data section's keys as a run builds its datasets (megatron/training/data.py):
data_cache_dir holds the sample indices, mmap_warmup reads the token files at start-up."""

from pathlib import Path

from megatron.data.options import sample_counts
from megatron.neox_arguments import NeoXArgs
from megatron.training.data import build_datasets
from tests.runs import ROOT


def token_files(dataset) -> list:
    """The indexed datasets under a split's dataset (blended or not)."""
    parts = getattr(dataset, "datasets", [dataset])
    return [part.indexed_dataset for part in parts]


def test_data_cache_dir_and_mmap_warmup_take_effect(small_data, tmp_path):
    prefix, tok = small_data
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], [
        f"data_path={prefix}", f"vocab_file={tok}", "num_gpus=1", "seq_length=32",
        "train_iters=4", f"data_cache_dir={tmp_path / 'cache'}", "mmap_warmup=true",
        "seed=4321"])  # a seed no other test uses: its index files are new
    train, valid, _ = build_datasets(args, sample_counts(args), vocab_size=2048)
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert any(name.endswith("_doc_idx.npy") and "_train_" in name for name in cached), cached
    assert any("_max_token_id_" in name for name in cached), cached  # A12's kept largest id
    assert not list(Path(prefix).parent.glob("*4321s*"))  # none beside the data
    assert all(not files._skip_warmup for files in token_files(train) + token_files(valid))
    plain = args.replace(mmap_warmup=False, data_cache_dir=None)
    train, _, _ = build_datasets(plain, sample_counts(plain), vocab_size=2048)
    assert all(files._skip_warmup for files in token_files(train))
