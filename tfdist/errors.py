"""Error types shared by the package."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input: a flag, an environment variable, a recipe.

    Raised before TensorFlow starts wherever possible. The message says what
    was received and what to do.
    """


class ClusterError(RuntimeError):
    """The environment describes a cluster tfdist cannot use.

    The message carries a `HINT:` line saying how to fix the environment.
    """


class CheckpointError(ConfigError):
    """A backup cannot be resumed: corrupt, truncated, or from another run.

    The message names the file and the mismatch, and says how to proceed.
    """


class PeerLostError(RuntimeError):
    """Another worker of the job died or became unreachable."""

    def __init__(self, message: str, peer: str | None = None):
        super().__init__(message)
        self.peer = peer
