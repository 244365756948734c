"""The largest token id of a token file, kept in the cache folder so that deepy.py and every
worker do not each read the whole .bin again (A12)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from megatron.data.indexed_dataset import MMapIndexedDataset, MMapIndexedDatasetBuilder
from megatron.data.token_ids import cache_path, check_token_ids, largest_token_id


def write_tokens(prefix: str, tokens: list[int], lengths: list[int]) -> MMapIndexedDataset:
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    builder.add_documents(np.array(tokens), lengths)
    builder.finalize(prefix + ".idx")
    return MMapIndexedDataset(prefix)


def test_the_largest_id_is_kept_in_the_cache_folder_and_read_back(tmp_path):
    prefix = str(tmp_path / "data" / "corpus")
    (tmp_path / "data").mkdir()
    dataset = write_tokens(prefix, [5, 900, 7, 3, 1], [3, 2])
    check_token_ids(dataset, 901, str(tmp_path / "cache"))
    kept = json.loads(open(cache_path(dataset, str(tmp_path / "cache"))).read())
    assert kept["max_token_id"] == 900
    assert kept["fingerprint"]["idx_sha256"] == dataset.opened_fingerprint["idx_sha256"]
    assert os.listdir(tmp_path / "cache") == [os.path.basename(cache_path(dataset, "x"))]
    # without a cache folder the file goes beside the data, as the sample-index caches do
    assert largest_token_id(dataset, None) == 900
    assert os.path.dirname(cache_path(dataset, None)) == str(tmp_path / "data")
    with pytest.raises(ValueError, match=r"corpus\.bin holds token id 900, but the model's "
                                         r"vocabulary has 900 entries"):
        check_token_ids(dataset, 900, str(tmp_path / "cache"))


def test_a_kept_id_serves_only_the_content_it_was_read_from(tmp_path):
    """The kept file is what a second open reads (an id written into it is the one refused);
    data rebuilt under the same name with other content is read again, and a kept file whose
    fingerprint is not the data's is not believed."""
    prefix, cache = str(tmp_path / "corpus"), str(tmp_path / "cache")
    dataset = write_tokens(prefix, [5, 900, 7, 3, 1], [3, 2])
    path = cache_path(dataset, cache)
    check_token_ids(dataset, 1000, cache)
    kept = json.loads(open(path).read())
    with open(path, "w") as f:
        json.dump({**kept, "max_token_id": 4000}, f)
    with pytest.raises(ValueError, match="holds token id 4000"):
        check_token_ids(MMapIndexedDataset(prefix), 1000, cache)

    rebuilt = write_tokens(prefix, [5, 950, 7, 3], [2, 2])  # other lengths, other .idx
    assert cache_path(rebuilt, cache) != path
    assert largest_token_id(rebuilt, cache) == 950
    with open(cache_path(rebuilt, cache), "w") as f:  # a kept file of other content
        json.dump({**kept, "max_token_id": 4000}, f)
    assert largest_token_id(MMapIndexedDataset(prefix), cache) == 950


def test_a_cache_folder_that_cannot_be_written_is_no_error(tmp_path):
    prefix = str(tmp_path / "corpus")
    dataset = write_tokens(prefix, [5, 900, 7], [3])
    (tmp_path / "a_file").write_text("")
    assert largest_token_id(dataset, str(tmp_path / "a_file" / "cache")) == 900
    assert sorted(os.listdir(tmp_path)) == ["a_file", "corpus.bin", "corpus.idx"]
