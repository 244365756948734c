"""Checkpoints: when to save, saving with DeepSpeed's layout, loading and resuming."""

from megatron.checkpointing.load import load_checkpoint
from megatron.checkpointing.save import save_checkpoint, should_save

__all__ = ["load_checkpoint", "save_checkpoint", "should_save"]
