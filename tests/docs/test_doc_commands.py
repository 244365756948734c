"""Every shell command in docs/*.md runs, as a user would run it: each ```sh / ```bash block in
bash from the repository root, pages in the order they build on each other (data -> train ->
checkpoints -> generate -> evaluate -> export -> finetune -> posttraining -> profile), so later pages use the
checkpoint the training page trained. Outputs go under $RUN_DIR, which the pages use and this
test points at a temporary directory; the built-in dataset goes to data/ as `make data` puts it.
A block that cannot run here carries `<!-- not run: reason -->` on the line before its fence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import DOCS, blocks, shell_blocks
from tests.runs import ROOT, clean_env

# pages whose commands build on an earlier page's outputs come after it
ORDER = ["README.md", "data.md", "train.md", "memory.md", "checkpoints.md", "generate.md", "evaluate.md",
         "export.md", "finetune.md", "posttraining.md", "profile.md", "troubleshooting.md", "migrating.md",
         "launching.md", "gpt-neox.md", "checks.md"]
COMMAND_STARTS = ("python ", "make ", "deepspeed ", "mpirun ", "srun ", "pip ", "export ")


def pages() -> list[Path]:
    return [DOCS / name for name in ORDER if (DOCS / name).is_file()]


def test_every_page_has_its_place_in_the_order():
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(p.name for p in pages()), \
        f"add new pages to ORDER in {Path(__file__).name}"


def test_blocks_not_run_say_why_and_commands_sit_in_shell_blocks():
    for page in pages():
        for block in blocks(page):
            if block.lang in ("sh", "bash"):
                assert block.not_run != "", f"{block.where()}: `not run:` needs a reason"
            else:
                assert block.not_run is None, \
                    f"{block.where()}: `not run:` only marks ```sh / ```bash blocks"
                first = block.text.lstrip().split("\n")[0]
                assert block.lang or not first.startswith(COMMAND_STARTS), \
                    f"{block.where()}: a command in a fence without a language: use ```sh"


@pytest.mark.slow
def test_every_documented_command_runs(tmp_path):
    env = clean_env(RUN_DIR=str(tmp_path / "run"),
                    PATH=f"{Path(sys.executable).parent}:{clean_env()['PATH']}")
    ran = []
    for page in pages():
        for block in shell_blocks(page):
            if block.not_run is not None:
                continue
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, (
                f"{block.where()} failed (exit {proc.returncode}):\n{block.text}\n--- stdout\n"
                f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
            ran.append(block.where())
    assert len(ran) >= 10, ran
