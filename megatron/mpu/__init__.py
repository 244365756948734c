"""Parallel layout: the pure rank grid (`Topology`) and the process groups built from it."""

from megatron.mpu.topology import Topology

__all__ = ["Topology"]
