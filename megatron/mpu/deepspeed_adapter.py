"""The `mpu` object DeepSpeed asks about model- and data-parallel groups, over ProcessGroups."""

from __future__ import annotations

import torch.distributed as dist

from megatron.mpu.groups import ProcessGroups


class DeepSpeedMPU:
    """Answers DeepSpeed's get_*_parallel_{rank,world_size,group} from our ProcessGroups."""

    def __init__(self, groups: ProcessGroups):
        self.groups = groups
        self._coords = groups.topology.coords(groups.rank)

    # tensor (model) parallel
    def get_model_parallel_rank(self) -> int:
        return self._coords.model

    def get_model_parallel_world_size(self) -> int:
        return self.groups.topology.tp

    def get_model_parallel_group(self):
        return self.groups.tp_group

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_tensor_model_parallel_src_rank(self) -> int:
        return self.groups.topology.model_parallel_group(self.groups.rank)[0]

    # data parallel
    def get_data_parallel_rank(self) -> int:
        return self._coords.data

    def get_data_parallel_world_size(self) -> int:
        return self.groups.topology.dp

    def get_data_parallel_group(self):
        return self.groups.dp_group

    def get_data_parallel_group_ranks(self) -> list[int]:
        return self.groups.topology.data_parallel_group(self.groups.rank)

    # pipeline (a single stage when this adapter is used: pipe_parallel_size 0)
    def get_pipe_parallel_rank(self) -> int:
        return self._coords.pipe

    def get_pipe_parallel_world_size(self) -> int:
        return self.groups.topology.pp

    def get_pipe_parallel_group(self):
        return self.groups.pp_group

    get_pipeline_model_parallel_rank = get_pipe_parallel_rank
    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size
    get_pipeline_model_parallel_group = get_pipe_parallel_group

    def get_global_rank(self) -> int:
        return dist.get_rank()
