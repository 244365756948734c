"""Tokenizer backends: round trips, special ids (A13), registry errors, optional packages."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from megatron.neox_arguments import NeoXArgs
from megatron.tokenizer import TOKENIZERS, build_tokenizer
from megatron.training.memory_check import padded_vocab
from megatron.tokenizer.train_bpe import train_bpe_tokenizer

TEXTS = ["Hello, world!\n\tIndented line", "café 東京 🙂 naïve", "", "  two  spaces  "]


def test_hf_tokenizer_round_trip_and_special_ids(tiny_tokenizer_file):
    tok = build_tokenizer("HFTokenizer", tiny_tokenizer_file)
    assert tok.name == "HFTokenizer"
    assert (tok.eod, tok.pad) == (0, 1)
    assert tok.vocab_size == Tokenizer.from_file(tiny_tokenizer_file).get_vocab_size()
    assert tok.max_token_id == tok.vocab_size - 1
    for text in TEXTS:
        ids = tok.tokenize(text)
        assert all(isinstance(i, int) for i in ids)
        assert tok.detokenize(ids) == text
    assert tok.tokenize_batch(TEXTS) == [tok.tokenize(t) for t in TEXTS]
    assert len(tok.tokenize("the quick brown fox")) < len("the quick brown fox")


def test_registry_is_case_insensitive_and_lists_valid_names(tiny_tokenizer_file):
    assert build_tokenizer("hftokenizer", tiny_tokenizer_file).name == "HFTokenizer"
    with pytest.raises(ValueError) as err:
        build_tokenizer("WordPiece")
    assert "unknown tokenizer_type 'WordPiece'" in str(err.value)
    for name in TOKENIZERS:
        assert name in str(err.value)


def test_missing_and_unreadable_files_are_named(tmp_path):
    missing = str(tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError, match=f"tokenizer JSON file \\(vocab_file\\) {missing}"):
        build_tokenizer("HFTokenizer", missing)
    with pytest.raises(ValueError, match="needs a tokenizer JSON file"):
        build_tokenizer("HFTokenizer")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(ValueError, match=f"cannot load {garbage}"):
        build_tokenizer("HFTokenizer", str(garbage))


def test_tokenizer_without_eod_is_refused(tmp_path, corpus_texts):
    path = tmp_path / "no_eod.json"
    train_bpe_tokenizer(corpus_texts, 300, str(path), special_tokens=("<pad>",))
    with pytest.raises(ValueError) as err:
        build_tokenizer("HFTokenizer", str(path))
    assert (f"the end-of-document token (one of '<|endoftext|>', '<|end_of_text|>', '</s>', "
            f"'<eos>') is not in the vocabulary of {path}; add it as a special token") \
        in str(err.value)


LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>")
LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
                   "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}")


def llama3_shaped_dir(path: Path, corpus_texts, eos: str | None) -> Path:
    """A Hugging Face tokenizer directory shaped like Llama 3's: no <|endoftext|> or
    <|padding|>, its own special tokens, and (unless `eos` is None) a tokenizer_config.json
    naming the EOS, as Llama-3-Instruct's names <|eot_id|>."""
    from transformers import PreTrainedTokenizerFast

    train_bpe_tokenizer(corpus_texts, 300, str(path / "tokenizer.json"),
                        special_tokens=LLAMA3_SPECIALS)
    if eos is not None:
        PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"),
                                bos_token="<|begin_of_text|>", eos_token=eos,
                                chat_template=LLAMA3_TEMPLATE).save_pretrained(str(path))
    return path


def test_a_tokenizer_without_endoftext_ends_documents_with_its_own_eos(tmp_path, corpus_texts):
    """GPT-NeoX's Llama 3 post-training configs name a Llama 3 tokenizer directory: its EOS is
    the end-of-document token, the same id the chat preprocessing ends conversations with."""
    from megatron.data.chat_preprocess import render
    from transformers import AutoTokenizer

    instruct = llama3_shaped_dir(tmp_path / "instruct", corpus_texts, "<|eot_id|>")
    configs = Path(__file__).parents[1] / "neox_arguments" / "data" / "gpt-neox" / "post-training"
    args = NeoXArgs.from_ymls([configs / "llama3-8b-sft.yml"],
                              [f"vocab_file={instruct / 'tokenizer.json'}"])
    tok = build_tokenizer(args.tokenizer.tokenizer_type, args.tokenizer.vocab_file)
    assert (tok.eod, tok.pad) == (4, 4)  # <|eot_id|>; no pad token: the EOS pads
    chat = AutoTokenizer.from_pretrained(str(instruct))
    tokens, _labels = render(
        chat, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    assert tokens[-1] == tok.eod and tok.detokenize([tok.eod]) == "<|eot_id|>"
    # without settings beside it: the first known end-of-text token of the file
    base = llama3_shaped_dir(tmp_path / "base", corpus_texts, None)
    assert build_tokenizer("HFTokenizer", str(base / "tokenizer.json")).eod == 1
    # a pad token the settings name is the pad
    (instruct / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": {"content": "<|end_of_text|>"}, "pad_token": "<|begin_of_text|>"}))
    tok = build_tokenizer("HFTokenizer", str(instruct / "tokenizer.json"))
    assert (tok.eod, tok.pad) == (1, 0)


def test_pad_falls_back_to_eod(tmp_path, corpus_texts):
    path = tmp_path / "eod_only.json"
    train_bpe_tokenizer(corpus_texts, 300, str(path), special_tokens=("<|endoftext|>",))
    tok = build_tokenizer("HFTokenizer", str(path))
    assert tok.pad == tok.eod == 0


@pytest.fixture
def gpt2_json(tmp_path, corpus_texts):
    """A tokenizer JSON whose only special token is "<|endoftext|>", like GPT-2's."""
    path = tmp_path / "json" / "tokenizer.json"
    train_bpe_tokenizer(corpus_texts, 400, str(path), special_tokens=("<|endoftext|>",))
    return str(path)


@pytest.fixture
def gpt2_files(tmp_path, gpt2_json):
    """vocab.json + merges.txt of that tokenizer, as GPT-2 ships them."""
    Tokenizer.from_file(gpt2_json).model.save(str(tmp_path))
    return str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")


def test_gpt2_bpe_files_match_the_json_tokenizer(gpt2_files, gpt2_json):
    vocab, merges = gpt2_files
    hf = build_tokenizer("HFTokenizer", gpt2_json)
    gpt2 = build_tokenizer("GPT2BPETokenizer", vocab, merges)
    assert gpt2.eod == hf.eod and gpt2.pad == gpt2.eod and gpt2.vocab_size == 400
    for text in TEXTS:
        assert gpt2.tokenize(text) == hf.tokenize(text)
        assert gpt2.detokenize(gpt2.tokenize(text)) == text
    assert gpt2.tokenize("a<|endoftext|>b")[1] == gpt2.eod


def test_hf_gpt2_tokenizer_adds_a_padding_token(gpt2_files, tmp_path):
    vocab, merges = gpt2_files
    base = build_tokenizer("GPT2BPETokenizer", vocab, merges)
    tok = build_tokenizer("HFGPT2Tokenizer", str(tmp_path))  # a folder holding both files
    assert tok.pad == base.vocab_size and tok.vocab_size == base.vocab_size + 1
    assert tok.max_token_id == tok.pad


def test_a_gpt2_vocab_json_given_as_a_tokenizer_json_is_named_for_what_it_is(gpt2_files):
    vocab, _merges = gpt2_files
    with pytest.raises(ValueError) as err:
        build_tokenizer("HFTokenizer", vocab)
    assert str(err.value) == (
        f"HFTokenizer: {vocab} is a map of tokens to ids (GPT-2's vocab.json), not a tokenizers "
        "tokenizer.json: use tokenizer_type GPT2BPETokenizer with its merges.txt as merge_file, "
        "or the model's tokenizer.json")


def test_gpt2_needs_both_files(gpt2_files, tmp_path):
    vocab, _ = gpt2_files
    with pytest.raises(ValueError, match="needs a merge file"):
        build_tokenizer("GPT2BPETokenizer", vocab)
    missing = str(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match=missing):
        build_tokenizer("GPT2BPETokenizer", vocab, missing)


def test_char_level_tokenizer():
    tok = build_tokenizer("CharLevelTokenizer")
    assert (tok.vocab_size, tok.eod, tok.pad, tok.max_token_id) == (512, 0, 1, 255)
    for text in TEXTS:
        ids = tok.tokenize(text)
        assert ids == list(text.encode("utf-8"))
        assert tok.detokenize(ids) == text
    assert [list(a) for a in tok.tokenize_batch(TEXTS)] == [tok.tokenize(t) for t in TEXTS]


@pytest.mark.parametrize("name, module, hint", [
    ("SPMTokenizer", "sentencepiece", "pip install sentencepiece"),
    ("TiktokenTokenizer", "tiktoken", "pip install tiktoken"),
])
def test_optional_backends_name_their_package(monkeypatch, name, module, hint):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ImportError, match=hint):
        build_tokenizer(name, "model")


def test_a_tokenizer_file_not_given_is_asked_for_by_its_key_and_the_tools_flag():
    with pytest.raises(ValueError, match=r"^HFTokenizer needs a tokenizer JSON file \(vocab_file\); "
                                         r"set vocab_file in the config \(--vocab-file for the "
                                         r"data tools\)$"):
        build_tokenizer("HFTokenizer", None)
    with pytest.raises(ValueError, match=r"GPT2BPETokenizer needs a merge file \(merges.txt\); set "
                                         r"merge_file in the config \(--merge-file"):
        build_tokenizer("GPT2BPETokenizer", __file__, None)


GPT2_JSON = Path("/work/shared/data/gpt2-tokenizer.json")  # checked against when present
GPT2_FIRST_MERGES = ["Ġ t", "Ġ a", "h e", "i n", "r e", "o n", "Ġt he"]  # ids 256..262


def gpt2_byte_alphabet() -> list[str]:
    """GPT-2's 256 byte symbols in its id order: printable Latin-1 bytes stand for themselves,
    the others (control bytes, space, 127-160, 173) for chr(256 + k) in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    moved = [b for b in range(256) if b not in kept]
    return [chr(b) for b in kept] + [chr(256 + k) for k in range(len(moved))]


@pytest.fixture
def gpt2_shaped_files(tmp_path):
    """vocab.json of GPT-2's shape (50257 entries, "<|endoftext|>" last at 50256) and merges.txt
    with GPT-2's first merges; the entries between are fillers no merge reaches."""
    tokens = gpt2_byte_alphabet() + [m.replace(" ", "") for m in GPT2_FIRST_MERGES]
    tokens += [f"<filler{i}>" for i in range(50256 - len(tokens))] + ["<|endoftext|>"]
    vocab, merges = tmp_path / "vocab.json", tmp_path / "merges.txt"
    vocab.write_text(json.dumps({t: i for i, t in enumerate(tokens)}), encoding="utf-8")
    merges.write_text("#version: 0.2\n" + "\n".join(GPT2_FIRST_MERGES) + "\n", encoding="utf-8")
    return str(vocab), str(merges)


def gpt2_run_config(vocab: str, merges: str, tp: int) -> NeoXArgs:
    return NeoXArgs.from_dict({
        "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
        "max_position_embeddings": 32, "train_iters": 10, "train_micro_batch_size_per_gpu": 2,
        "tokenizer_type": "GPT2BPETokenizer", "vocab_file": vocab, "merge_file": merges,
        "model_parallel_size": tp,
    }, source="test", world_size=tp)


def test_gpt2_sized_vocabulary_ids_and_padding(gpt2_shaped_files):
    vocab, merges = gpt2_shaped_files
    tok = build_tokenizer("GPT2BPETokenizer", vocab, merges)
    assert (tok.vocab_size, tok.eod, tok.pad) == (50257, 50256, 50256)
    # GPT-2's ids: "t" 83, "he" 258, "Ġthe" 262; the end-of-document text is one token
    assert tok.tokenize("the the<|endoftext|>") == [83, 258, 262, 50256]
    assert tok.detokenize([83, 258, 262, 50256]) == "the the<|endoftext|>"
    # a multiple of make_vocab_size_divisible_by (128) * model_parallel_size, as GPT-NeoX pads
    assert padded_vocab(gpt2_run_config(vocab, merges, 1)) == 50304
    assert padded_vocab(gpt2_run_config(vocab, merges, 2)) == 50432
    if GPT2_JSON.exists():  # GPT-2's own files give the ids of GPT-2's tokenizer.json
        Tokenizer.from_file(str(GPT2_JSON)).model.save(str(Path(vocab).parent), "real")
        real = build_tokenizer("GPT2BPETokenizer", str(Path(vocab).parent / "real-vocab.json"),
                               str(Path(vocab).parent / "real-merges.txt"))
        reference = build_tokenizer("HFTokenizer", str(GPT2_JSON))
        assert (real.vocab_size, real.eod, real.pad) == (50257, 50256, 50256)
        assert real.tokenize("Hello world, the cat") == [15496, 995, 11, 262, 3797]
        for text in [*TEXTS, "the the<|endoftext|> next document"]:
            assert real.tokenize(text) == reference.tokenize(text)
        assert real.tokenize("the the")[-1] == 262 and real.tokenize("he")[0] == 258
