#!/usr/bin/env python
"""Plot training runs from their metrics.jsonl: loss, learning rate, grad norm, tokens/s, memory.

    python tools/plot_metrics.py logs/tiny                      # -> logs/tiny/plots/*.png
    python tools/plot_metrics.py logs/a logs/b --names base wide --out plots
    python tools/plot_metrics.py logs/a --x tokens --seq_length 2048

Draws metrics_iteration.png and metrics_tokens.png (or only the axis --x names) with every run
overlaid. Tokens are consumed_samples * seq_length, seq_length read from the run's
run_summary.json or its checkpoint's config.yml unless --seq_length gives it. Needs matplotlib
(requirements/requirements-plot.txt).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log_dirs", nargs="+",
                        help="run log directories (each with metrics.jsonl), or those files")
    parser.add_argument("--out", default=None, help="output directory (default: <first log_dir>/plots)")
    parser.add_argument("--x", choices=("iteration", "tokens"), default=None,
                        help="one x axis only (default: both; tokens skipped when unknown)")
    parser.add_argument("--names", nargs="+", default=None, help="one legend name per log_dir")
    parser.add_argument("--seq_length", type=int, default=None,
                        help="sequence length for the tokens axis, for every run")
    args = parser.parse_args(argv)
    from megatron.monitoring.plots import load_run, plot_runs, tokens_unknown

    if args.names is not None and len(args.names) != len(args.log_dirs):
        parser.error(f"--names gives {len(args.names)} names for {len(args.log_dirs)} log dirs")
    names = args.names or [None] * len(args.log_dirs)
    try:
        runs = [load_run(d, n, args.seq_length) for d, n in zip(args.log_dirs, names)]
        x_axes = (args.x,) if args.x else ("iteration", "tokens")
        reason = tokens_unknown(runs)
        if args.x is None and reason:
            x_axes = ("iteration",)
            print(f"no tokens plot: {reason}", file=sys.stderr)
        paths = plot_runs(runs, args.out or os.path.join(runs[0].log_dir, "plots"), x_axes)
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
