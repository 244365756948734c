#!/usr/bin/env python
"""Describe a checkpoint and check that it is intact, without loading it.

    python tools/ckpts/inspect_checkpoint.py checkpoints/tiny              # its latest
    python tools/ckpts/inspect_checkpoint.py checkpoints/tiny --iteration 100 --verify
    python tools/ckpts/inspect_checkpoint.py checkpoints/tiny/global_step200 --verify

Prints the iteration, consumed samples, parallel layout, model shape, what the checkpoint holds
and its files' total size; --verify hashes every file against the manifest. Exits 1 when a file
is missing, truncated or altered (each one named), 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", help="a save directory or one global_step<N> directory in it")
    parser.add_argument("--iteration", type=int, default=None, help="N of global_step<N>")
    parser.add_argument("--verify", action="store_true", help="hash every file")
    args = parser.parse_args(argv)
    from megatron.checkpointing.summary import describe_checkpoint

    try:
        lines, problems = describe_checkpoint(Path(args.path), args.iteration, args.verify)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines + [f"  - {p}" for p in problems]))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
