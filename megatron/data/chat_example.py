"""A small synthetic chat task a tiny model learns in a few dozen steps, with a chat tokenizer:
the example data of the post-training walkthrough (docs/posttraining.md) and its tests.

    tok_dir = make_chat_tokenizer(base_tokenizer_json, out / "tokenizer")  # HF dir + template
    write_jsonl(path, sft_records(64, seed=0))         # {"messages": [...]}
    write_jsonl(path, preference_records(64, seed=0))  # {"chosen": [...], "rejected": [...]}
    write_example(base_tokenizer_json, out)            # all of it, train and valid splits

The task: the user names a colour, the assistant answers with the thing of that colour
(`ANSWERS`), always in the same form. Preference data prefers the answer with an exclamation
mark over the same answer with a full stop (one style over another); KTO data rewards the right
thing (+1) and punishes another (-1).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ROLES = ("system", "user", "assistant")
END = "<|end|>"
# ChatML-like: every message is <|role|>content<|end|>; the generation prompt is <|assistant|>
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
ANSWERS = {"red": "cherry", "green": "lime", "blue": "sky", "yellow": "sun",
           "purple": "grape", "orange": "carrot", "black": "coal", "white": "snow"}


def make_chat_tokenizer(base_tokenizer_json: str | Path, out_dir: Path) -> Path:
    """A Hugging Face tokenizer directory: the base tokenizer.json with the role and end tokens
    added as special tokens, EOS <|endoftext|>, pad <|padding|>, and TEMPLATE."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    base = Tokenizer.from_file(str(base_tokenizer_json))
    base.add_special_tokens([f"<|{r}|>" for r in ROLES] + [END])
    tok = PreTrainedTokenizerFast(tokenizer_object=base, eos_token="<|endoftext|>",
                                  pad_token="<|padding|>")
    tok.chat_template = TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return out_dir


def question(colour: str) -> dict:
    return {"role": "user", "content": f"what is {colour}?"}


def answer(colour: str, mark: str = "!") -> dict:
    return {"role": "assistant", "content": f"{ANSWERS[colour]}{mark}"}


def sft_records(n: int, seed: int) -> list[dict]:
    """`n` conversations of one or two exchanges, some with a system message."""
    rng = random.Random(seed)
    colours = sorted(ANSWERS)
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": "answer briefly"}] if i % 3 == 0 else []
        for _ in range(1 + i % 2):
            c = rng.choice(colours)
            messages += [question(c), answer(c)]
        out.append({"messages": messages})
    return out


def preference_records(n: int, seed: int) -> list[dict]:
    """`n` pairs: the same answer, chosen with "!", rejected with "."."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        c = rng.choice(sorted(ANSWERS))
        out.append({"chosen": [question(c), answer(c, "!")],
                    "rejected": [question(c), answer(c, ".")]})
    return out


def kto_records(n: int, seed: int) -> list[dict]:
    """`n` conversations with a reward: the right thing +1, another colour's thing -1."""
    rng = random.Random(seed)
    colours = sorted(ANSWERS)
    out = []
    for i in range(n):
        c = rng.choice(colours)
        if i % 2 == 0:
            out.append({"messages": [question(c), answer(c)], "reward": 1})
        else:
            wrong = rng.choice([x for x in colours if x != c])
            out.append({"messages": [question(c), answer(wrong)], "reward": -1})
    return out


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# split -> (records, seed); valid's seeds differ from train's
EXAMPLE_SPLITS = {"train": (256, 0), "valid": (32, 1)}


def write_example(base_tokenizer_json: str | Path, out_dir: str | Path,
                  train_records: int = EXAMPLE_SPLITS["train"][0]) -> dict[str, Path]:
    """The chat tokenizer (`out_dir/tokenizer`) and, for each split, `sft_<split>.jsonl`,
    `pairs_<split>.jsonl` and `kto_<split>.jsonl`; name -> path of everything written."""
    out = Path(out_dir)
    written = {"tokenizer": make_chat_tokenizer(base_tokenizer_json, out / "tokenizer")}
    for split, (n, seed) in EXAMPLE_SPLITS.items():
        n = train_records if split == "train" else n
        written[f"sft_{split}"] = write_jsonl(out / f"sft_{split}.jsonl", sft_records(n, seed))
        written[f"pairs_{split}"] = write_jsonl(out / f"pairs_{split}.jsonl",
                                                preference_records(n, seed + 10))
        written[f"kto_{split}"] = write_jsonl(out / f"kto_{split}.jsonl", kto_records(n, seed))
    return written
