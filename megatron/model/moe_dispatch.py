"""Expert parallelism's token exchange: assignments travel to the rank holding their expert and
their outputs travel back, by all-to-all over an expert-parallel group.

In a group of `ep` ranks, each with its own tokens, expert e of E lives on group rank
e // (E / ep). A rank's assignments, sorted by expert, go to their experts' ranks in one
all-to-all (the per-expert counts first, in a small all-to-all of their own). The receiver holds
them source by source; it regroups them expert by expert, runs its E / ep experts, restores the
source-by-source order and sends the outputs back with the inverse all-to-all, so each rank gets
its assignments' outputs in the order it sent them. torch's differentiable all_to_all_single
(functional collectives) carries gradients back the same way: an expert's weights collect the
gradient of every rank's tokens routed to it, and each rank's inputs the gradient of their own
outputs.

Used by the MoE layer (moe.py) when moe_expert_parallel_size > 1.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_to_all_single_autograd

ExpertsFn = Callable[[torch.Tensor, list[int]], torch.Tensor]


def expert_major_order(counts: torch.Tensor) -> torch.Tensor:
    """Row indices that regroup rows laid out source by source (counts [sources, experts]: rows
    of each source, expert by expert) into expert by expert, sources in order within each."""
    sources, experts = counts.shape
    flat = counts.reshape(-1)  # blocks in source-major order
    starts = torch.cumsum(flat, 0) - flat
    blocks = torch.arange(sources * experts).view(sources, experts).t().reshape(-1)
    lengths = flat[blocks]
    offsets = torch.arange(int(lengths.sum())) - torch.repeat_interleave(
        torch.cumsum(lengths, 0) - lengths, lengths)
    return torch.repeat_interleave(starts[blocks], lengths) + offsets


def exchange_and_compute(rows: torch.Tensor, counts: list[int], experts: ExpertsFn,
                         group=None) -> torch.Tensor:
    """rows [N, h]: this rank's assignments sorted by expert, counts[e] of them for each of the
    E experts of the group. `experts(x, local_counts)` runs this rank's E / ep experts on rows
    grouped by local expert. Returns the outputs [N, h] in `rows`' order."""
    group = dist.group.WORLD if group is None else group
    ep = dist.get_world_size(group=group)
    if len(counts) % ep:
        raise ValueError(f"{len(counts)} experts do not split over {ep} expert-parallel ranks")
    per_rank = torch.tensor(counts, dtype=torch.int64).view(ep, len(counts) // ep)
    received = torch.empty_like(per_rank)  # [source rank, local expert]
    dist.all_to_all_single(received, per_rank, group=group)
    send, recv = per_rank.sum(1).tolist(), received.sum(1).tolist()
    arrived = all_to_all_single_autograd(rows.contiguous(), recv, send,
                                         group)  # [M, h], source by source
    order = expert_major_order(received).to(rows.device)
    out = experts(arrived[order], received.sum(0).tolist())  # [M, h], expert by expert
    restored = torch.empty_like(out).index_copy(0, order, out)  # source by source again
    return all_to_all_single_autograd(restored, send, recv, group)
