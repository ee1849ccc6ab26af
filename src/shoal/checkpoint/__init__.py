"""Checkpoints: everything needed to continue a run exactly, written atomically."""

from shoal.checkpoint.manager import CheckpointManager, find_checkpoint

__all__ = ["CheckpointManager", "find_checkpoint"]
