"""What the MoE layers did over a log interval: router losses and how evenly experts were loaded.

Each MoE layer counts its expert assignments and averages its load-balancing and z losses over
the training forwards since the last read (megatron/model/moe.py). At every logged iteration
the probe reads them on every rank, brings each layer's values from the pipeline stage that
holds it and averages them over data-parallel ranks (tensor-parallel ranks route alike), and
gives:

- `moe_balance_loss`, `moe_z_loss`: the mean over MoE layers of each layer's mean loss (the
  balance loss is moe_top_k for perfectly even routing, up to moe_num_experts * moe_top_k);
- `moe_max_load`: the busiest expert's share of its layer's assignments times the number of
  experts, over all MoE layers (1.0: perfectly even; moe_num_experts: one expert takes all);
- per layer `moe/layer_<i>/balance_loss`, `moe/layer_<i>/z_loss` and
  `moe/layer_<i>/expert_<e>_load` (that expert's share of the layer's assignments).

The console line shows the first three.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.model.block import TransformerLayer
from megatron.model.moe import MoE


class MoEProbe:
    """Reads the MoE layers of this rank's model at each log (a collective: every rank calls)."""

    def __init__(self, engine, model_config):
        self.numbers = [i for i in range(model_config.num_layers) if model_config.is_moe_layer(i)]
        self.experts = model_config.moe_num_experts
        self.local = {m.layer_number: m.mlp for m in engine.engine.module.modules()
                      if isinstance(m, TransformerLayer) and isinstance(m.mlp, MoE)}
        self.groups = engine.groups

    def take(self) -> tuple[dict, str]:
        """(metrics, console text) of the interval since the last call."""
        e = self.experts
        rows = torch.zeros(len(self.numbers), e + 3)  # shares, balance, z, ranks reporting
        for j, number in enumerate(self.numbers):
            stats = self.local[number].take_stats() if number in self.local else None
            if stats is not None:
                rows[j, :e] = stats.load.float() / max(int(stats.load.sum()), 1)
                rows[j, e:] = torch.tensor([stats.balance_loss, stats.z_loss, 1.0])
        for group in (self.groups.pp_group, self.groups.dp_group):
            if dist.get_world_size(group=group) > 1:
                dist.all_reduce(rows, group=group)
        reported = rows[:, e + 2:].clamp(min=1.0)
        rows = rows[:, :e + 2] / reported
        metrics = {"moe_balance_loss": rows[:, e].mean().item(),
                   "moe_z_loss": rows[:, e + 1].mean().item(),
                   "moe_max_load": (rows[:, :e].max() * e).item()}
        for j, number in enumerate(self.numbers):
            metrics[f"moe/layer_{number}/balance_loss"] = rows[j, e].item()
            metrics[f"moe/layer_{number}/z_loss"] = rows[j, e + 1].item()
            for expert in range(e):
                metrics[f"moe/layer_{number}/expert_{expert}_load"] = rows[j, expert].item()
        text = (f"moe balance {metrics['moe_balance_loss']:.4f} | moe z "
                f"{metrics['moe_z_loss']:.4f} | moe max load {metrics['moe_max_load']:.2f}x | ")
        return metrics, text
