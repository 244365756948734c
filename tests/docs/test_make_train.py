"""README.md's `make train` figures: the run that command makes (the built-in dataset, then
`deepy.py train.py configs/tiny.yml`, 200 iterations on two processes) logs the losses the
README quotes. The dataset is made as `make data` makes it, in the checkout's data/ (reused when
up to date, as there: test_doc_commands.py makes the same one); checkpoints and logs go to a
temporary directory instead of the checkout. Nothing else differs from `make train`."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.runs import ROOT, clean_env, deepy, explain, free_port, read_metrics

pytestmark = pytest.mark.slow


def quoted_losses() -> list[tuple[int, str, float]]:
    """(iteration, metric, value) of each loss README.md quotes for `make train`."""
    text = " ".join((ROOT / "README.md").read_text().split())
    found = re.search(r"falls from ([\d.]+) \(iteration (\d+)\) to ([\d.]+) \(iteration (\d+)\), "
                      r"validation loss ([\d.]+) at iteration (\d+) and ([\d.]+) at (\d+)", text)
    assert found, "README.md no longer quotes make train's losses in the form this test reads"
    values, iterations = found.groups()[0::2], found.groups()[1::2]
    keys = ["lm_loss", "lm_loss", "val_loss", "val_loss"]
    return [(int(i), key, float(v)) for i, key, v in zip(iterations, keys, values)]


def test_make_train_logs_the_losses_the_readme_quotes(tmp_path):
    quoted = quoted_losses()
    made = subprocess.run([sys.executable, "tools/datasets/prepare_data.py", "builtin", "-d",
                           "data"], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, explain(made)
    builtin = ROOT / "data" / "builtin"
    run = deepy("train.py", "configs/tiny.yml",
                f"data_path={builtin / 'builtin_text_document'}",
                f"vocab_file={builtin / 'tokenizer.json'}", f"save={tmp_path / 'ckpt'}",
                f"load={tmp_path / 'ckpt'}", f"log_dir={tmp_path / 'logs'}",
                f"master_port={free_port()}", timeout=900, env=clean_env())
    assert run.returncode == 0, explain(run)
    train, val = read_metrics(tmp_path / "logs")
    logged = {(r["iteration"], "lm_loss"): r["lm_loss"] for r in train}
    logged.update({(r["iteration"], "val_loss"): r["val_loss"] for r in val})
    got = [logged.get((i, key)) for i, key, _ in quoted]
    # two decimals, as quoted; the same on an AVX-512 Intel CPU and an AVX2 AMD one
    assert all(g is not None and abs(g - v) <= 0.02 for g, (_, _, v) in zip(got, quoted)), (
        f"README.md quotes {quoted}; make train's run logged {got}")
    assert "run finished at iteration 200/200" in run.stdout + run.stderr
