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


class StorageError(ConfigError):
    """The model dir cannot be written: read-only, full, not a directory, ...

    The message is one line naming the path and the errno.
    """


def describe_os_error(e: OSError, path: str, what: str = "cannot write") -> str:
    """One line for an OSError: '<what>: cannot write PATH: [Errno 28] ENOSPC: ...'."""
    import errno as errno_lib

    name = errno_lib.errorcode.get(e.errno, "?") if e.errno else "?"
    where = e.filename or path
    return (f"{what}: {where}: [Errno {e.errno}] {name}: {e.strerror or e}. The previous "
            "backup (if any) is intact; fix the storage or pass another --model-dir, then "
            "rerun to resume.")


class CollectiveMismatchError(RuntimeError):
    """Ranks made different collective calls (order, op, dtype or size differ).

    Raised on every rank instead of returning data, naming both calls.
    """
