"""The checkpoint manager: periodic saves, the last k and the best kept, exact resume.

A checkpoint is a plain weights file, a state file (optimizer, step counts, input position)
and a record naming both, written last; `CheckpointManager` writes them, keeps what its
policy says, and restores the latest whole one with any number of towers.
"""

from towers.checkpoints._manager import CheckpointManager

__all__ = [
    "CheckpointManager",
]
