"""input-file mode's prompts (megatron/text_generation/prompts.py::read_prompts), read as
GPT-NeoX's generate_samples_input_from_file reads them: split on prompt_end, each stripped."""

from __future__ import annotations

import logging

import pytest

from megatron.text_generation.prompts import read_prompts


def test_prompts_split_on_prompt_end_keep_their_inner_newlines(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("def add(a, b):\n    return<END>  class Stack:\n    pass\n<END>\n",
                    encoding="utf-8")
    assert read_prompts(str(path), "<END>") == ["def add(a, b):\n    return",
                                                "class Stack:\n    pass"]


def test_lines_are_stripped_and_blank_ones_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"The assert statement \r\n\r\n   \r\nA list comprehension\r\n")
    with caplog.at_level(logging.WARNING):
        assert read_prompts(str(path), "\n") == ["The assert statement", "A list comprehension"]
    assert f"{path}: skipped 2 empty prompt(s)" in caplog.text


def test_a_file_of_blanks_is_refused_naming_the_separator(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\n \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"holds no prompts \(separator '\\n'\)"):
        read_prompts(str(path), "\n")


def test_a_directory_or_a_file_that_is_not_utf8_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"sample_input_file {tmp_path} is a directory"):
        read_prompts(str(tmp_path), "\n")
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"caf\xe9\n")  # Latin-1
    with pytest.raises(ValueError, match=rf"sample_input_file {path} is not UTF-8 text "
                                         r"\(invalid continuation byte at byte 3\)"):
        read_prompts(str(path), "\n")
