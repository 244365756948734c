"""What checkpointing raises: each message names the directory or file and what to do."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or loaded."""


class CheckpointSaveError(CheckpointError):
    """A save was aborted; the previous checkpoint is still the one `latest` names (A20, A21)."""


class CorruptFileError(CheckpointError):
    """A checkpoint file differs from what its manifest recorded (A22, A24)."""


class NoValidCheckpointError(CheckpointError):
    """Checkpoints exist but none of them verified (A24)."""


class CheckpointMismatchError(ValueError):
    """The checkpoint was written by a run of another shape or layout than this one (A23)."""
