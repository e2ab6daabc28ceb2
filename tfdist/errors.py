"""Error types shared by the package."""


class ConfigError(ValueError):
    """Bad user input: a flag, an environment variable, a recipe.

    Raised before TensorFlow starts wherever possible. The message says what
    was received and what to do.
    """


class ClusterError(RuntimeError):
    """The environment describes a cluster tfdist cannot use.

    The message carries a `HINT:` line saying how to fix the environment.
    """
