"""PNG plots of training runs from their `<log_dir>/metrics.jsonl` (tools/plot_metrics.py).

    runs = [load_run("logs/a"), load_run("logs/b", name="b", seq_length=2048)]
    paths = plot_runs(runs, out_dir="logs/a/plots", x_axes=("iteration", "tokens"))

One PNG per x axis (`metrics_iteration.png`, `metrics_tokens.png`), each with five panels:
loss (training, validation and test), learning rate, gradient norm, tokens/s and memory, every
run drawn in its own colour with its name. A resumed run repeats the iterations it had logged
after its last checkpoint; the last record of an iteration wins. Tokens are `consumed_samples *
seq_length`; seq_length comes from the caller, else the run's run_summary.json, else the
config.yml of the checkpoint that summary names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from megatron.monitoring.trackers import METRICS_FILE

INSTALL_HINT = ("matplotlib is not installed: pip install -r requirements/requirements-plot.txt "
                "(or pip install -e '.[plot]')")

# panel title -> the training record's key
PANELS = (("learning rate", "learning_rate"), ("gradient norm", "grad_norm"),
          ("tokens/s", "tokens_per_sec"), ("memory (GiB)", "memory_gib"))


@dataclass
class Run:
    """One run's records, one per iteration, in iteration order."""

    name: str
    log_dir: Path
    train: list[dict]
    valid: list[dict] = field(default_factory=list)
    test: list[dict] = field(default_factory=list)
    seq_length: int | None = None

    def tokens(self, record: dict) -> int | None:
        """Tokens consumed at `record` (None without seq_length or consumed_samples)."""
        samples = record.get("consumed_samples")
        if self.seq_length is None or samples is None:
            return None
        return samples * self.seq_length


def read_records(path: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """(training, validation, test) records of a metrics.jsonl, the last of each iteration kept."""
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}: pass a run's log_dir (the directory "
                                f"that holds metrics.jsonl)")
    lines = path.read_text(encoding="utf-8").splitlines()
    kinds: dict[str, dict[int, dict]] = {"lm_loss": {}, "val_loss": {}, "test_loss": {}}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):  # a run killed while writing its last line
                continue
            raise ValueError(f"{path} line {number} is not JSON ({err.msg}): the file is "
                             f"damaged; remove that line") from None
        for key, by_iteration in kinds.items():
            if key in record and "iteration" in record:
                by_iteration[record["iteration"]] = record
    train, valid, test = ([d[i] for i in sorted(d)] for d in kinds.values())
    if not train:
        raise ValueError(f"{path} has no training records (lines with lm_loss): the run logged "
                         f"nothing yet; it writes one every log_interval iterations")
    return train, valid, test


def saved_seq_length(log_dir: Path) -> int | None:
    """seq_length from the run's run_summary.json, or from the config.yml of its checkpoint."""
    summary_path = log_dir / "run_summary.json"
    if not summary_path.is_file():
        return None
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    if summary.get("seq_length"):
        return int(summary["seq_length"])
    checkpoint = summary.get("checkpoint")
    config = Path(checkpoint) / "config.yml" if checkpoint else None
    if config is not None and config.is_file():
        value = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("seq_length")
        return int(value) if value else None
    return None


def load_run(log_dir: str | Path, name: str | None = None,
             seq_length: int | None = None) -> Run:
    """The run logged in `log_dir` (or the metrics file given in its place); an explicit
    `seq_length` is used as given."""
    log_dir = Path(log_dir)
    if log_dir.is_file() and log_dir.name == METRICS_FILE:
        log_dir = log_dir.parent
    train, valid, test = read_records(log_dir / METRICS_FILE)
    return Run(name or log_dir.resolve().name, log_dir, train, valid, test,
               seq_length if seq_length is not None else saved_seq_length(log_dir))


def tokens_unknown(runs: list[Run]) -> str | None:
    """Why the tokens axis cannot be drawn for `runs`, or None when it can."""
    missing = [run.name for run in runs if run.seq_length is None]
    if not missing:
        return None
    return (f"no seq_length for {', '.join(missing)} (neither run_summary.json nor its "
            f"checkpoint's config.yml gives one); pass --seq_length")


def _xs(run: Run, records: list[dict], x_axis: str) -> list:
    return [r["iteration"] if x_axis == "iteration" else run.tokens(r) for r in records]


def _series(run: Run, records: list[dict], key: str, x_axis: str) -> tuple[list, list]:
    points = [(x, r[key]) for x, r in zip(_xs(run, records, x_axis), records)
              if r.get(key) is not None and x is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _draw_loss(ax, runs: list[Run], colours: list, x_axis: str) -> None:
    for run, colour in zip(runs, colours):
        ax.plot(*_series(run, run.train, "lm_loss", x_axis), color=colour,
                label=f"{run.name} train")
        xs, ys = _series(run, run.valid, "val_loss", x_axis)
        if xs:
            ax.plot(xs, ys, "o--", color=colour, markersize=4, label=f"{run.name} validation")
        xs, ys = _series(run, run.test, "test_loss", x_axis)
        if xs:
            ax.plot(xs, ys, "s", color=colour, markersize=6, label=f"{run.name} test")
    ax.set_title("loss")


def _draw_panel(ax, runs: list[Run], colours: list, key: str, title: str, x_axis: str) -> None:
    drawn = False
    for run, colour in zip(runs, colours):
        xs, ys = _series(run, run.train, key, x_axis)
        if xs:
            ax.plot(xs, ys, color=colour, label=run.name)
            drawn = True
    ax.set_title(title)
    if not drawn:
        ax.text(0.5, 0.5, f"{key} not recorded", ha="center", va="center",
                transform=ax.transAxes)


def plot_runs(runs: list[Run], out_dir: str | Path, x_axes=("iteration", "tokens")) -> list[Path]:
    """Write one PNG per x axis into `out_dir`; return their paths.

    Raises ValueError when a run has no seq_length and "tokens" is asked for.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(INSTALL_HINT) from None
    reason = tokens_unknown(runs)
    if "tokens" in x_axes and reason:
        raise ValueError(f"cannot plot against tokens: {reason}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    colours = [f"C{i % 10}" for i in range(len(runs))]
    paths = []
    for x_axis in x_axes:
        fig, axes = plt.subplots(2, 3, figsize=(13, 7), dpi=80)
        flat = axes.ravel()
        _draw_loss(flat[0], runs, colours, x_axis)
        for ax, (title, key) in zip(flat[1:], PANELS):
            _draw_panel(ax, runs, colours, key, title, x_axis)
        for ax in flat[:5]:
            ax.set_xlabel(x_axis if x_axis == "iteration" else "tokens")
            ax.grid(alpha=0.3)
        handles, labels = flat[0].get_legend_handles_labels()
        flat[5].axis("off")
        flat[5].legend(handles, labels, loc="center", fontsize=9)
        fig.tight_layout()
        path = out_dir / f"metrics_{x_axis}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
