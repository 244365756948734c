"""generate.py's input file: prompts split on `prompt_end` (no torch: deepy.py reads the file
before any worker starts, rank 0 again when it generates)."""

from __future__ import annotations

from pathlib import Path

from megatron.monitoring.logger import get_logger

log = get_logger(__name__)


def read_prompts(path: str, prompt_end: str, warn: bool = True) -> list[str]:
    """Prompts of an input file split on prompt_end, each stripped of surrounding whitespace
    (a carriage return too), as GPT-NeoX reads them; blank ones are dropped (and, with `warn`,
    counted in a warning)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"sample_input_file {path} does not exist")
    parts = p.read_text(encoding="utf-8").split(prompt_end)
    if parts and not parts[-1].strip():  # the file ends with the separator
        parts.pop()
    prompts = [x.strip() for x in parts if x.strip()]
    if warn and len(prompts) < len(parts):
        log.warning("%s: skipped %d empty prompt(s)", path, len(parts) - len(prompts))
    if not prompts:
        raise ValueError(f"sample_input_file {path} holds no prompts (separator {prompt_end!r})")
    return prompts
