"""Split strings and document-count weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from megatron.data.splits import (get_train_valid_test_split, parse_split,
                                  split_document_ranges, weights_by_num_documents)
from megatron.neox_arguments.sections.data import DataArgs

ROOT = Path(__file__).resolve().parents[2]


def test_parse_split_forms():
    assert parse_split("969, 30, 1") == pytest.approx([0.969, 0.030, 0.001])
    assert parse_split("949,50,1") == pytest.approx([0.949, 0.050, 0.001])
    assert parse_split("98/2") == pytest.approx([0.98, 0.02, 0.0])
    assert parse_split("1") == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("bad", ["a,b", "1,2,3,4", "0,0,0", "-1,2,0", "inf,1,1"])
def test_bad_split_strings(bad):
    with pytest.raises(ValueError, match="split"):
        parse_split(bad)


def test_boundaries_match_gpt_neox():
    assert get_train_valid_test_split("969, 30, 1", 1000) == [0, 969, 999, 1000]
    assert get_train_valid_test_split("949,50,1", 2259) == [0, 2144, 2257, 2259]
    assert get_train_valid_test_split("1,1,1", 10) == [0, 4, 7, 10]
    assert get_train_valid_test_split("969, 30, 1", 3) == [0, 3, 3, 3]
    ranges = split_document_ranges("80,20", 10)
    assert ranges == {"train": range(0, 8), "valid": range(8, 10), "test": range(10, 10)}


def test_weights_by_num_documents():
    assert weights_by_num_documents([5], 0.3) == [1.0]
    w = weights_by_num_documents([100, 100], 1.0)
    assert w == pytest.approx([0.5, 0.5])
    w = weights_by_num_documents([900, 100], 0.3)
    # p ~ n^0.3 then * (1 - n/total), normalised
    p = [0.9 ** 0.3, 0.1 ** 0.3]
    p = [x / sum(p) for x in p]
    raw = [p[0] * 0.1, p[1] * 0.9]
    assert w == pytest.approx([raw[0] / sum(raw), raw[1] / sum(raw)])
    assert weights_by_num_documents([10, 0], 1.0) == pytest.approx([1.0, 0.0])
    with pytest.raises(ValueError, match="not all 0"):
        weights_by_num_documents([0, 0], 1.0)


def test_document_weights_are_gpt_neox_formula_not_the_document_share():
    # GPT-NeoX's weights_by_num_docs: alpha 1 does not reproduce the shares [0.9, 0.1]
    assert weights_by_num_documents([900, 100], 1.0) == pytest.approx([0.5, 0.5])
    # w_i = p_i ** alpha * (1 - p_i), normalised; here computed for three datasets
    counts, alpha = [700, 200, 100], 0.3
    shares = [n / 1000 for n in counts]
    raw = [p ** alpha * (1 - p) for p in shares]
    expected = [w / sum(raw) for w in raw]
    assert weights_by_num_documents(counts, alpha) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx([0.2220, 0.4065, 0.3715], abs=1e-4)
    assert weights_by_num_documents([900, 100], 0.5) == pytest.approx([0.25, 0.75])


def test_documentation_states_the_formula_the_weights_follow():
    fields = {f.name: f.metadata["doc"] for f in dataclasses.fields(DataArgs)}
    option_doc = fields["weight_by_num_documents"]
    page = " ".join((ROOT / "docs" / "data.md").read_text().split())
    assert "w_i = p_i ** weighted_sampler_alpha * (1 - p_i), normalised" in option_doc
    assert "[900, 100] documents weights [0.5, 0.5]" in option_doc
    assert "`w_i = p_i ** alpha * (1 - p_i)`, normalised to sum 1" in page
    assert "datasets of 900 and 100 documents get 0.5 each" in page
    assert "counts raised to" not in option_doc + page
