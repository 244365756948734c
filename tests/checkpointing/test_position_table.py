"""A sinusoidal model's checkpoint records its position table's layout (GPT-NeoX's: every sine,
then every cosine); one written before the manifest recorded it, when the table interleaved
them, is loaded with a warning by training and by the weights reader (generation, eval,
export)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.distributed import run_distributed


def _save_and_load(rank: int, world: int, directory: str, pos_emb: str) -> dict:
    from megatron.checkpointing import load_checkpoint, save_checkpoint
    from megatron.checkpointing.reader import read_checkpoint
    from tests.checkpointing import engines

    heard: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: heard.append(record.getMessage())
    logging.getLogger("megatron").addHandler(handler)
    args = engines.make_args(Path(directory), pos_emb=pos_emb)
    engine = engines.build(args)
    engines.train(engine, args, 1)
    save_checkpoint(engine, args.checkpoint, 1, {"consumed_train_samples": 2})
    path = Path(directory) / "ckpt" / "global_step1" / "manifest.json"
    recorded = json.loads(path.read_text())["run"].get("position_table")
    out = {"recorded": recorded}
    for case in ("as written", "earlier version"):
        if case == "earlier version":  # the manifest such a version wrote: no layout in `run`
            manifest = json.loads(path.read_text())
            manifest["run"].pop("position_table", None)
            path.write_text(json.dumps(manifest))
        heard.clear()
        load_checkpoint(engines.build(args), args.checkpoint)
        read_checkpoint(args.checkpoint.load, None, run_args=args)
        out[case] = [m for m in heard if "position table" in m]
    # the reshard tool's load and save (megatron/training/relayout.py), here on the test engine
    from megatron.checkpointing.load import LOADED_FROM
    from megatron.training.relayout import _as_loaded

    engine = engines.build(args)
    resumed = load_checkpoint(engine, args.checkpoint, resharding=True)
    engine.run = _as_loaded(engine.run, resumed.pop(LOADED_FROM))
    again = args.replace(save=str(Path(directory) / "resharded")).checkpoint
    save_checkpoint(engine, again, int(resumed.pop("iteration")), resumed)
    written = Path(again.save) / "global_step1" / "manifest.json"
    out["resharded"] = json.loads(written.read_text())["run"].get("position_table")
    return out


def test_a_sinusoidal_checkpoint_records_its_table_and_an_older_one_is_named(tmp_path):
    result = run_distributed(_save_and_load, 1, str(tmp_path), "sinusoidal")[0]
    assert result["recorded"] == "sines then cosines"
    assert result["as written"] == []
    warned = result["earlier version"]
    assert len(warned) == 2, warned  # training's load, then the weights reader
    where = tmp_path / "ckpt" / "global_step1"
    assert warned[0] == (
        f"checkpoint {where} was trained with pos_emb: sinusoidal by an earlier version of this "
        "project, whose position table interleaved sines and cosines; this version lays it out "
        "as GPT-NeoX does (every sine, then every cosine), so the model now sees other position "
        "signals than it learned: fine-tune it for a while, or generate and evaluate it with "
        "the version that trained it")
    assert warned[1] == warned[0]
    assert result["resharded"] is None  # not retrained: it does not claim the new layout


@pytest.mark.parametrize("pos_emb", ["rotary", "learned"])
def test_other_position_embeddings_record_no_table_and_never_warn(tmp_path, pos_emb):
    result = run_distributed(_save_and_load, 1, str(tmp_path), pos_emb)[0]
    assert result["recorded"] is None
    assert result["as written"] == result["earlier version"] == []
    assert result["resharded"] is None
