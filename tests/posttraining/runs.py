"""Post-training runs for the tests: the synthetic chat data preprocessed once per session, runs
of `deepy.py train.py configs/tiny.yml` on it (workers forked in-process: tests/runs.py), and
greedy answers of a trained checkpoint.

    files = prepare_chat_files(tokenizer_json, out_dir)       # ChatFiles: prefixes per split
    proc = posttrain(files, run_dir, "normal", train_iters=40)  # a finished run
    accuracy = greedy_accuracy(step_dir, files)                 # share of colours answered right
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from megatron.data.chat_example import (ANSWERS, kto_records, make_chat_tokenizer,
                                         preference_records, question, sft_records, write_jsonl)
from tests.runs import explain, free_port, launch_in_process

SPLITS = {"train": (256, 0), "valid": (32, 1), "test": (32, 2)}  # records, seed


@dataclass(frozen=True)
class ChatFiles:
    """The chat tokenizer and every preprocessed file prefix, by kind and split."""

    tokenizer_dir: Path
    sft: dict  # split -> (tokens prefix, labels prefix)
    pairs: dict  # split -> (chosen, chosen labels, rejected, rejected labels)
    kto: dict  # split -> (tokens, labels, rewards)
    rm: dict  # split -> (chosen, chosen labels, rejected, rejected labels), --for-rm format

    @property
    def vocab_file(self) -> str:
        return str(self.tokenizer_dir / "tokenizer.json")


def prepare_chat_files(base_tokenizer_json: str, out: Path) -> ChatFiles:
    from megatron.data.chat_preprocess import ChatOptions, preprocess_chat

    tok = make_chat_tokenizer(base_tokenizer_json, out / "tokenizer")
    sft, pairs, kto, rm = {}, {}, {}, {}
    for split, (n, seed) in SPLITS.items():
        p = preprocess_chat(str(write_jsonl(out / f"sft_{split}.jsonl", sft_records(n, seed))),
                            str(out / f"sft_{split}"), str(tok), ["messages"])
        sft[split] = (p.prefixes["messages/tokens"], p.prefixes["messages/labels"])
        prefs = write_jsonl(out / f"pairs_{split}.jsonl", preference_records(n, seed + 10))
        for name, options, into in (("dpo", ChatOptions(only_last=True), pairs),
                                    ("rm", ChatOptions(for_rm=True), rm)):
            p = preprocess_chat(str(prefs), str(out / f"{name}_{split}"), str(tok),
                                ["chosen", "rejected"], options)
            into[split] = (p.prefixes["chosen/tokens"], p.prefixes["chosen/labels"],
                           p.prefixes["rejected/tokens"], p.prefixes["rejected/labels"])
        p = preprocess_chat(str(write_jsonl(out / f"kto_{split}.jsonl", kto_records(n, seed))),
                            str(out / f"kto_{split}"), str(tok), ["messages"],
                            reward_key="reward")
        kto[split] = (p.prefixes["messages/tokens"], p.prefixes["messages/labels"],
                      p.prefixes["messages/reward"])
    return ChatFiles(tok, sft, pairs, kto, rm)


def data_overrides(files: ChatFiles, impl: str) -> dict:
    """The data keys of a run of `impl` (normal = SFT) on the chat files."""
    out = {}
    for split in SPLITS:
        if impl == "normal":
            out[f"{split}_data_paths"], out[f"{split}_label_data_paths"] = \
                [files.sft[split][0]], [files.sft[split][1]]
        elif impl == "kto":
            tokens, labels, rewards = files.kto[split]
            out.update({f"{split}_data_paths": [tokens], f"{split}_label_data_paths": [labels],
                        f"{split}_reward_data_paths": [rewards]})
        else:
            c, cl, r, rl = (files.pairs if impl == "dpo" else files.rm)[split]
            out.update({f"pos_{split}_data_paths": [c], f"pos_{split}_label_data_paths": [cl],
                        f"neg_{split}_data_paths": [r], f"neg_{split}_label_data_paths": [rl]})
    if impl in ("dpo", "rm"):
        out["dataset_impl"] = "pairwise"
    if impl != "normal":
        out["train_impl"] = impl
    return out


def posttrain(files: ChatFiles, run: Path, impl: str = "normal", check: bool = True, **extra):
    """The `deepy.py train.py configs/tiny.yml` launch on the chat data; the finished run."""
    values = {"vocab_file": files.vocab_file, "tokenizer_type": "HFTokenizer",
              "save": str(run / "ckpt"), "log_dir": str(run / "logs"), "seq_length": 64,
              "max_position_embeddings": 64, "pack_impl": "unpacked", "train_iters": 40,
              "eval_interval": 20, "eval_iters": 2, "log_interval": 10,
              "checkpoint_factor": 20, "master_port": free_port(),
              "distributed_timeout_minutes": 2, "data_path": "null",
              **data_overrides(files, impl), **extra}
    values.setdefault("load", values["save"])
    argv = [f"{k}={v}" for k, v in values.items()]
    proc = launch_in_process("train.py", "configs/tiny.yml", *argv)
    if check:
        assert proc.returncode == 0, explain(proc)
    return proc


def answer_tokens(tokenizer, colour: str) -> list[int]:
    return tokenizer(ANSWERS[colour], add_special_tokens=False)["input_ids"]


def greedy_accuracy(step_dir: Path, files: ChatFiles) -> float:
    """Share of the colours whose greedy continuation of the question, after the generation
    prompt, begins with the right answer's tokens."""
    from transformers import AutoTokenizer

    from megatron.checkpointing.reader import read_checkpoint
    from megatron.model.config import model_config_from_args
    from megatron.text_generation.generation import generate
    from megatron.text_generation.inference_model import InferenceModel
    from megatron.text_generation.sampling import SamplingParams

    tok = AutoTokenizer.from_pretrained(str(files.tokenizer_dir))
    ck = read_checkpoint(str(step_dir))
    config = model_config_from_args(ck.saved_args, ck.trained_vocab)
    model = InferenceModel.from_canonical(config, ck.canonical)
    colours = sorted(ANSWERS)
    prompts = [tok(tok.apply_chat_template([question(c)], tokenize=False,
                                           add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"] for c in colours]
    out = generate(model, prompts, 6, SamplingParams(), frozenset())
    right = [g.ids[:len(answer_tokens(tok, c))] == answer_tokens(tok, c)
             for g, c in zip(out, colours)]
    return sum(right) / len(right)
