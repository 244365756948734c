"""DeepSpeed's fp16 wrapper without ZeRO (bf16 or fp16 on a plain module, ZeRO 0) keeps an fp32
master copy of each parameter: its checkpoints resume exactly and reshard to and from the
pipeline engine's flat bf16 layout, master copies and Adam's moments included."""

from __future__ import annotations

from pathlib import Path

from tests.distributed import run_distributed


def _scenario(rank, world, directory: Path) -> dict:
    from megatron.checkpointing import load_checkpoint, optimizer_layouts, save_checkpoint
    from tests.checkpointing import engines

    def make(pipe: int):
        args = engines.make_args(directory, bf16={"enabled": True}, pipe_parallel_size=pipe,
                                 hidden_dropout=0.0, attention_dropout=0.0)
        return args, engines.build(args)

    out = {}
    args, plain = make(0)
    out["plain_layout"] = optimizer_layouts.detect(plain.engine.optimizer).name
    engines.train(plain, args, 3)
    save_checkpoint(plain, args.checkpoint, 3, {})
    out["plain"] = engines.train(plain, args, 4, seed=1)
    args, again = make(0)
    load_checkpoint(again, args.checkpoint)
    out["plain_resumed"] = engines.train(again, args, 4, seed=1)
    args, piped = make(1)
    out["piped_layout"] = optimizer_layouts.detect(piped.engine.optimizer).name
    load_checkpoint(piped, args.checkpoint)  # master_copy -> flat
    out["piped"] = engines.train(piped, args, 2, seed=1)
    save_checkpoint(piped, args.checkpoint, 5, {})
    out["piped_more"] = engines.train(piped, args, 2, seed=2)
    args, back = make(0)
    load_checkpoint(back, args.checkpoint)  # flat -> master_copy
    out["back"] = engines.train(back, args, 2, seed=2)
    out["moments"] = sum(len(s) for s in back.engine.optimizer.optimizer.state.values())
    return out


def test_the_master_copy_layout_resumes_exactly_and_reshards_both_ways(tmp_path):
    out = run_distributed(_scenario, 1, tmp_path)[0]
    assert (out["plain_layout"], out["piped_layout"]) == ("master_copy", "flat")
    assert out["plain_resumed"] == out["plain"]  # same layout: bit-exact
    # another layout computes the same steps up to bf16 rounding of the gradients
    for a, b in zip(out["piped"], out["plain"][:2]):
        assert abs(a - b) < 5e-4, (out["piped"], out["plain"])
    for a, b in zip(out["back"], out["piped_more"]):
        assert abs(a - b) < 5e-4, (out["back"], out["piped_more"])
    assert out["moments"] > 0  # Adam's state was placed, not left empty
