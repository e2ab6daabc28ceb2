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
    """Another worker of the job died or became unreachable.

    The lost peer travels as fields, never as message text: an engine sets
    `rank` (and `address` when it knows it), and the trainer fills the
    address from the cluster. The message stays readable on its own.

    Args:
        message: What happened and what to do, for the user.
        rank: The lost peer's index in its job (the worker rank), when known.
        address: Its "host:port", when known.
        job: Its job in the cluster spec ("worker", "chief").
    """

    def __init__(self, message: str, rank: int | None = None, address: str | None = None,
                 job: str = "worker"):
        super().__init__(message)
        self.rank, self.address, self.job = rank, address, job

    @property
    def peer(self) -> str | None:
        """'worker 1 (127.0.0.1:5001)', 'worker 1' or None: the lost peer in words."""
        if self.rank is None:
            return None
        return f"{self.job} {self.rank}" + (f" ({self.address})" if self.address else "")


class StorageError(ConfigError):
    """The model dir cannot be written: read-only, full, not a directory, ...

    The message is one line naming the path and the errno.
    """


RESUME_ADVICE = ("The previous backup (if any) is intact; fix the storage or pass another "
                 "--model-dir, then rerun to resume.")


def describe_os_error(e: OSError, path: str, what: str = "cannot write",
                      advice: str = RESUME_ADVICE) -> str:
    """One line for an OSError: '<what>: PATH: [Errno 28] ENOSPC: ... <advice>'.

    The default advice suits a write during training (a backup was written
    before); a check before anything was written passes its own.
    """
    import errno as errno_lib

    name = errno_lib.errorcode.get(e.errno, "?") if e.errno else "?"
    where = e.filename or path
    return f"{what}: {where}: [Errno {e.errno}] {name}: {e.strerror or e}. {advice}"


class CollectiveMismatchError(RuntimeError):
    """Ranks made different collective calls (order, op, dtype or size differ).

    Raised on every rank instead of returning data, naming both calls.
    """
