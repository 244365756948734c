"""The rank grid of a run: tensor x pipeline x data parallel degrees, pure and torch-free.

Ranks are laid out as DeepSpeed's PipeModelDataParallelTopology lays them out: axes ordered
(pipe, data, model) with the model (tensor) axis fastest, so the ranks of one tensor-parallel
group are adjacent (and share a node whenever tp divides the GPUs per node).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Coordinates:
    """Where one rank sits in the grid."""

    pipe: int
    data: int
    model: int
    expert: int = 0  # rank in the expert-parallel group: data % ep


@dataclass(frozen=True)
class Topology:
    """tp x pp x dp == world_size, with rank <-> coordinate maths. `pp` counts stages (>= 1).

    `ep` (expert parallelism, moe_expert_parallel_size) divides the data-parallel ranks of each
    (stage, tensor rank) into groups of ep consecutive ones: data ranks q, q + ep, q + 2 ep, ...
    hold the same experts (expert rank q) and reduce their gradients together; data ranks
    k ep .. k ep + ep - 1 exchange tokens with each other."""

    tp: int
    pp: int
    dp: int
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"parallel degree {name} must be a positive integer, got {value!r}")
        if self.dp % self.ep:
            raise ValueError(f"moe_expert_parallel_size({self.ep}) must divide the "
                             f"data-parallel size({self.dp})")

    @classmethod
    def from_world(cls, world_size: int, tp: int, pp: int, ep: int = 1) -> "Topology":
        """The grid for `world_size` ranks; dp is what tp and pp leave, and must be whole."""
        stages = max(pp, 1)
        if world_size % (tp * stages) != 0:
            raise ValueError(
                f"world_size({world_size}) is not divisible by model_parallel_size({tp}) * "
                f"pipe_parallel_size({stages}) = {tp * stages}; change the degrees or the number "
                "of processes (num_gpus x num_nodes)")
        return cls(tp=tp, pp=stages, dp=world_size // (tp * stages), ep=ep)

    def describe(self) -> str:
        return f"tp={self.tp} pp={self.pp} dp={self.dp}" + (f" ep={self.ep}" if self.ep > 1 else "")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def coords(self, rank: int) -> Coordinates:
        """The (pipe, data, model) coordinates of global `rank`."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the grid of world_size {self.world_size}")
        model = rank % self.tp
        data = (rank // self.tp) % self.dp
        return Coordinates(pipe=rank // (self.tp * self.dp), data=data, model=model,
                           expert=data % self.ep)

    def rank(self, pipe: int, data: int, model: int) -> int:
        """The global rank at the given coordinates."""
        return (pipe * self.dp + data) * self.tp + model

    def data_parallel_group(self, rank: int) -> list[int]:
        """Ranks that hold the same model shard and differ only in data."""
        c = self.coords(rank)
        return [self.rank(c.pipe, d, c.model) for d in range(self.dp)]

    def expert_parallel_group(self, rank: int) -> list[int]:
        """Ranks that exchange tokens with `rank`, each holding other experts (expert rank
        order): ep consecutive data-parallel ranks."""
        c = self.coords(rank)
        first = c.data - c.expert
        return [self.rank(c.pipe, first + q, c.model) for q in range(self.ep)]

    def expert_data_parallel_group(self, rank: int) -> list[int]:
        """Ranks holding the same experts as `rank`: they average their expert gradients."""
        c = self.coords(rank)
        return [self.rank(c.pipe, d, c.model) for d in range(c.expert, self.dp, self.ep)]

    def model_parallel_group(self, rank: int) -> list[int]:
        """Ranks of one tensor-parallel group (adjacent ranks)."""
        c = self.coords(rank)
        return [self.rank(c.pipe, c.data, m) for m in range(self.tp)]

    def pipeline_group(self, rank: int) -> list[int]:
        """Ranks holding the stages of one model replica, first stage first."""
        c = self.coords(rank)
        return [self.rank(p, c.data, c.model) for p in range(self.pp)]

    def deepspeed_topology(self):
        """DeepSpeed's PipeModelDataParallelTopology with the same rank layout."""
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        return PipeModelDataParallelTopology(num_pp=self.pp, num_mp=self.tp, num_dp=self.dp)
