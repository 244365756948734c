"""tools/plot_metrics.py: PNG plots from a real run's metrics.jsonl.

What a user relies on: the images exist and show something (a real size, more than one colour),
several runs share one figure under their names, tokens need a seq_length that is found or
asked for, a restarted run's repeated iterations keep their last record, and a missing or empty
metrics file is named in one line.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.runs import ROOT, deepy, explain, tiny_overrides

import matplotlib.image


NO_PLOTS = shutil.ignore_patterns("plots")


def plot_tool():
    spec = importlib.util.spec_from_file_location("plot_metrics",
                                                  ROOT / "tools" / "plot_metrics.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run_dir(small_data, tmp_path_factory) -> Path:
    """A real 20-iteration run (one process) with validation at 10 and 20."""
    data, tokenizer = small_data
    run = tmp_path_factory.mktemp("plotted")
    proc = deepy("train.py", "configs/tiny.yml",
                 *tiny_overrides(data, tokenizer, run, num_gpus=1, checkpoint_factor=20))
    assert proc.returncode == 0, explain(proc)
    return run


def assert_picture(path: Path) -> np.ndarray:
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 600, image.shape
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 10  # not blank
    return image


@pytest.mark.slow  # shares a real training run (~1 min)
def test_one_run_plotted_against_iterations_and_tokens(run_dir, capsys):
    assert plot_tool().main([str(run_dir / "logs")]) == 0
    out = capsys.readouterr().out
    plots = run_dir / "logs" / "plots"
    for name in ("metrics_iteration.png", "metrics_tokens.png"):
        assert f"wrote {plots / name}" in out
        assert_picture(plots / name)
    # the metrics file itself stands for its log_dir
    assert plot_tool().main([str(run_dir / "logs" / "metrics.jsonl")]) == 0
    assert f"wrote {plots / 'metrics_iteration.png'}" in capsys.readouterr().out


@pytest.mark.slow  # shares a real training run (~1 min)
def test_two_runs_overlaid_with_their_names(run_dir, tmp_path):
    from megatron.monitoring.plots import load_run

    other = tmp_path / "wide"
    shutil.copytree(run_dir / "logs", other, ignore=NO_PLOTS)
    records = [json.loads(line) for line in (other / "metrics.jsonl").read_text().splitlines()]
    with open(other / "metrics.jsonl", "w") as f:  # a second run with another loss curve
        for r in records:
            if "lm_loss" in r:
                r["lm_loss"] += 0.5
            f.write(json.dumps(r) + "\n")
    out = tmp_path / "plots"
    assert plot_tool().main([str(run_dir / "logs"), "--out", str(tmp_path / "one"),
                             "--x", "iteration"]) == 0
    assert plot_tool().main([str(run_dir / "logs"), str(other), "--names", "base", "wide",
                             "--out", str(out), "--x", "iteration"]) == 0
    single = assert_picture(tmp_path / "one" / "metrics_iteration.png")
    both = assert_picture(out / "metrics_iteration.png")
    assert not (out / "metrics_tokens.png").exists()  # --x iteration only
    assert single.shape == both.shape and not np.array_equal(single, both)
    assert load_run(other, "wide").train[0]["lm_loss"] == pytest.approx(
        load_run(run_dir / "logs").train[0]["lm_loss"] + 0.5)


@pytest.mark.slow  # shares a real training run (~1 min)
def test_restart_keeps_the_last_record_of_an_iteration(run_dir, tmp_path):
    from megatron.monitoring.plots import load_run

    log = tmp_path / "resumed"
    shutil.copytree(run_dir / "logs", log, ignore=NO_PLOTS)
    lines = (log / "metrics.jsonl").read_text().splitlines()
    repeated = [json.loads(line) for line in lines if '"lm_loss"' in line][-2:]
    with open(log / "metrics.jsonl", "a") as f:
        for r in repeated:
            f.write(json.dumps({**r, "lm_loss": 1.25}) + "\n")
    run = load_run(log)
    iterations = [r["iteration"] for r in run.train]
    assert iterations == sorted(set(iterations))
    assert [r["lm_loss"] for r in run.train[-2:]] == [1.25, 1.25]
    assert run.seq_length == 64  # from run_summary.json
    assert [r["iteration"] for r in run.valid] == [10, 20]


@pytest.mark.slow  # shares a real training run (~1 min)
def test_seq_length_from_the_checkpoint_config_or_asked_for(run_dir, tmp_path, capsys):
    from megatron.monitoring.plots import load_run

    log = tmp_path / "old"
    shutil.copytree(run_dir / "logs", log, ignore=NO_PLOTS)
    summary = json.loads((log / "run_summary.json").read_text())
    del summary["seq_length"]
    (log / "run_summary.json").write_text(json.dumps(summary))
    assert load_run(log).seq_length == 64  # the checkpoint's config.yml
    (log / "run_summary.json").unlink()
    assert load_run(log).seq_length is None
    assert plot_tool().main([str(log), "--x", "tokens"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("error: cannot plot against tokens: no seq_length for old (neither "
                           "run_summary.json nor its checkpoint's config.yml gives one); pass "
                           "--seq_length")
    assert plot_tool().main([str(log)]) == 0  # iterations only, saying why
    assert "no tokens plot: no seq_length for old" in capsys.readouterr().err
    assert not (log / "plots" / "metrics_tokens.png").exists()
    assert plot_tool().main([str(log), "--seq_length", "64", "--x", "tokens"]) == 0
    assert_picture(log / "plots" / "metrics_tokens.png")


def test_missing_or_empty_metrics_named(tmp_path, capsys):
    assert plot_tool().main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: no metrics file at {tmp_path / 'metrics.jsonl'}: pass a run's log_dir (the "
        f"directory that holds metrics.jsonl)")
    (tmp_path / "metrics.jsonl").write_text("")
    assert plot_tool().main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path / 'metrics.jsonl'} has no training records (lines with lm_loss): the "
        f"run logged nothing yet; it writes one every log_interval iterations")
    assert not (tmp_path / "plots").exists()


@pytest.mark.slow  # shares a real training run (~1 min)
def test_without_matplotlib_one_line_says_how_to_install(run_dir):
    code = ("import sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = ['plot_metrics.py', {str(run_dir / 'logs')!r}, '--out', "
            f"{str(run_dir / 'no_plots')!r}]; "
            "import runpy; runpy.run_path('tools/plot_metrics.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2, explain(proc)
    assert proc.stderr.strip() == ("error: matplotlib is not installed: pip install -r "
                                   "requirements/requirements-plot.txt (or pip install -e "
                                   "'.[plot]')")
