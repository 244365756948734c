"""Float value files (.bin/.idx): GPT-NeoX's dtype codes when writing, the data's width when
reading, so files of writers that swap the two float codes read correctly too."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from megatron.data.indexed_dataset import (DTYPES, MMapIndexedDataset, MMapIndexedDatasetBuilder,
                                           data_file_path, encode_index, index_file_path)

CODE_OFFSET = 17  # magic 9 + version 8


def write_pair(prefix, sizes, code, itemsize, data: bytes) -> None:
    """A pair built field by field from the documented layout, one document per item."""
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(sizes), len(sizes) + 1)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.int64) * itemsize
    body = (np.asarray(sizes, "<i4").tobytes() + pointers.astype("<i8").tobytes()
            + np.arange(len(sizes) + 1, dtype="<i8").tobytes())
    with open(index_file_path(prefix), "wb") as f:
        f.write(head + body)
    with open(data_file_path(prefix), "wb") as f:
        f.write(data)


def write_rewards(prefix, rewards) -> None:
    builder = MMapIndexedDatasetBuilder(data_file_path(prefix), values="rewards")
    for value in rewards:
        builder.add_item([value])
        builder.end_document()
    builder.finalize(index_file_path(prefix))


def code_byte(prefix) -> int:
    with open(index_file_path(prefix), "rb") as f:
        return f.read()[CODE_OFFSET]


def set_code_byte(prefix, code: int) -> None:
    with open(index_file_path(prefix), "r+b") as f:
        f.seek(CODE_OFFSET)
        f.write(bytes([code]))


def test_table_is_gpt_neox():
    assert DTYPES == {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                      6: np.float32, 7: np.float64, 8: np.uint16}


def test_writers_use_gpt_neox_float_codes(tmp_path):
    assert encode_index([2], [0, 1], np.float32)[CODE_OFFSET] == 6
    assert encode_index([2], [0, 1], np.float64)[CODE_OFFSET] == 7
    prefix = str(tmp_path / "rewards")
    write_rewards(prefix, [0.5, -1.25, 3.0])
    assert code_byte(prefix) == 7
    with open(data_file_path(prefix), "rb") as f:
        assert f.read() == struct.pack("<3d", 0.5, -1.25, 3.0)
    ds = MMapIndexedDataset(prefix)
    assert ds.dtype == np.float64 and [ds[i][0] for i in range(3)] == [0.5, -1.25, 3.0]


@pytest.mark.parametrize("code", [6, 7])
@pytest.mark.parametrize("dtype, sizes", [
    (np.float32, [2, 0, 3]), (np.float64, [2, 0, 3]),  # width from the pointers
    (np.float32, [0, 5]), (np.float64, [4]),  # width from the .bin's size
])
def test_either_float_code_reads_at_the_data_width(tmp_path, code, dtype, sizes):
    # GPT-NeoX: 6 float32, 7 float64; Megatron-LM's core: 6 float64, 7 float32
    values = np.linspace(-2.0, 2.0, sum(sizes)).astype(dtype)
    prefix = str(tmp_path / "values")
    write_pair(prefix, sizes, code, np.dtype(dtype).itemsize, values.tobytes())
    ds = MMapIndexedDataset(prefix)
    assert ds.dtype == dtype
    assert np.concatenate(ds[0:len(sizes)]).tolist() == values.tolist()


@pytest.mark.parametrize("rewards", [[0.5, -1.25, 3.0], [0.1]])
def test_float64_files_written_with_code_6_still_read(tmp_path, rewards):
    # float64 files coded 6, as this project's writer and older Megatron wrote them
    prefix = str(tmp_path / "old_rewards")
    write_rewards(prefix, rewards)
    set_code_byte(prefix, 6)
    ds = MMapIndexedDataset(prefix)
    assert ds.dtype == np.float64
    assert [ds[i][0] for i in range(len(rewards))] == rewards


@pytest.mark.parametrize("code, dtype", [(6, np.float32), (7, np.float64)])
def test_files_without_values_take_gpt_neox_table(tmp_path, code, dtype):
    prefix = str(tmp_path / "empty")
    write_pair(prefix, [0, 0], code, 8, b"")
    assert MMapIndexedDataset(prefix).dtype == dtype


@pytest.mark.parametrize("code", [6, 7])
def test_a_width_neither_float_has_is_refused_naming_the_file(tmp_path, code):
    prefix = str(tmp_path / "halves")
    write_pair(prefix, [3, 1], code, 2, np.zeros(4, np.float16).tobytes())
    with pytest.raises(ValueError, match=r"dtype code \d means float32 or float64 .* put 3 values "
                                         r"in 6 bytes, neither 4 nor 8") as err:
        MMapIndexedDataset(prefix)
    assert index_file_path(prefix) in str(err.value)


def test_a_bin_of_neither_width_is_refused_as_truncated(tmp_path):
    prefix = str(tmp_path / "short")
    write_pair(prefix, [3], 6, 4, b"\x00" * 10)
    with pytest.raises(ValueError, match=r"short\.bin is truncated: .* 3 tokens of float32 = "
                                         r"12 bytes, found 10 bytes"):
        MMapIndexedDataset(prefix)
