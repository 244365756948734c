"""generate.py's prompts: the input file split on `prompt_end`, and A14 (prompt plus
maximum_tokens fit max_position_embeddings). No torch: deepy.py reads the file and checks the
lengths before any worker starts; rank 0 reads it again and every batch is checked again."""

from __future__ import annotations

from pathlib import Path

from megatron.monitoring.logger import get_logger

log = get_logger(__name__)


def read_prompts(path: str, prompt_end: str, warn: bool = True) -> list[str]:
    """Prompts of an input file split on prompt_end, each stripped of surrounding whitespace
    (a carriage return too), as GPT-NeoX reads them; blank ones are dropped (and, with `warn`,
    counted in a warning)."""
    p = Path(path)
    if p.is_dir():
        raise FileNotFoundError(f"sample_input_file {path} is a directory: give the file of "
                                "prompts")
    if not p.is_file():
        raise FileNotFoundError(f"sample_input_file {path} does not exist")
    try:
        parts = p.read_text(encoding="utf-8").split(prompt_end)
    except UnicodeDecodeError as err:
        raise ValueError(f"sample_input_file {path} is not UTF-8 text ({err.reason} at byte "
                         f"{err.start}); convert it to UTF-8") from None
    if parts and not parts[-1].strip():  # the file ends with the separator
        parts.pop()
    prompts = [x.strip() for x in parts if x.strip()]
    if warn and len(prompts) < len(parts):
        log.warning("%s: skipped %d empty prompt(s)", path, len(parts) - len(prompts))
    if not prompts:
        raise ValueError(f"sample_input_file {path} holds no prompts (separator {prompt_end!r})")
    return prompts


def prompt_tokens(tokenizer, text: str) -> list[int]:
    """The token ids generation starts from: an empty prompt is one end-of-text token, the
    start of a new document (unconditional generation)."""
    return tokenizer.tokenize(text) or [tokenizer.eod]


def check_lengths(prompt_lengths: list[int], max_new_tokens: int, max_positions: int,
                  first_index: int = 0) -> None:
    """A14: prompt + max_new_tokens must fit max_position_embeddings; the error names the
    longest prompts (by index), their length and the limits."""
    if max_new_tokens < 1:
        raise ValueError(f"maximum_tokens({max_new_tokens}) must be at least 1")
    if max_new_tokens >= max_positions:  # no prompt is short enough: say so, not "-372 tokens"
        raise ValueError(f"maximum_tokens({max_new_tokens}) must be below "
                         f"max_position_embeddings({max_positions}), as every prompt has at least "
                         "one token; lower maximum_tokens")
    too_long = [(i + first_index, n) for i, n in enumerate(prompt_lengths)
                if n + max_new_tokens > max_positions]
    if too_long:
        shown = ", ".join(f"prompt {i} has {n} tokens" for i, n in too_long[:3])
        more = f" (and {len(too_long) - 3} more)" if len(too_long) > 3 else ""
        raise ValueError(f"{shown}{more}: prompt tokens + maximum_tokens({max_new_tokens}) must "
                         f"not exceed max_position_embeddings({max_positions}); shorten the "
                         f"prompt to at most {max_positions - max_new_tokens} tokens or lower "
                         "maximum_tokens")
