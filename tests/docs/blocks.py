"""The shell blocks of docs/*.md: each fenced ```sh / ```bash block, with the reason it is not
run when a `<!-- not run: reason -->` comment stands on the line before its fence."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.runs import ROOT

DOCS = ROOT / "docs"
SHELL_LANGS = {"sh", "bash"}
NOT_RUN = re.compile(r"^<!--\s*not run:(.*?)-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    page: str          # file name under docs/
    line: int          # line of the opening fence, 1-based
    lang: str          # the fence's language ("" when none)
    text: str          # the block's lines
    not_run: str | None  # the reason given, "" for a comment without one, None when it runs

    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of one page, shell or not."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"docs/{path.name}:{i + 1}: a fence that is never closed"
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.match(before.strip())
        found.append(Block(path.name, i + 1, fence.group(1), "\n".join(lines[i + 1:end]),
                           marker.group(1).strip() if marker else None))
        i = end + 1
    return found


def shell_blocks(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.lang in SHELL_LANGS]
