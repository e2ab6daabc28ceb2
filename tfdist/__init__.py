"""tfdist: distributed training for Keras 3 models on TensorFlow.

In your own script::

    import tfdist
    dist = tfdist.setup()          # a `tfdist.Distributed`: strategy, rank, is_chief, ...

The package is split the way the problem is:

* `tfdist.cluster`: where am I (TF_CONFIG, SLURM, local machine).
* `tfdist.strategies`: how to train (single, mirrored, multi_worker, auto).
* `tfdist.data`, `tfdist.checkpoint`: sharding and batch arithmetic; the one
  chief-only writer.
* `tfdist.compat`: upstream workarounds, one module per upstream bug.
* `recipes/`: what to train.

Importing `tfdist` does not import TensorFlow; the submodules that need it do.
Its first import afterwards (a script's own `import tensorflow`) hides
TensorFlow's C++ start-up lines, as `setup()` does (`TFDIST_TF_LOGS=1` shows them).
"""

__version__ = "0.1.0"

from tfdist.distributed import Distributed, setup  # noqa: E402  (imports no TensorFlow)


def _hide_tensorflow_startup_lines() -> None:
    # A script's `import tensorflow` before `tfdist.setup()` would print the
    # C++ start-up lines setup() hides (tensorflow/tensorflow#79029); shown with
    # TFDIST_TF_LOGS=1, as setup()'s are.
    from tfdist.cluster.console import detect_console
    from tfdist.compat import tf_startup_logs

    if not detect_console().tf_logs:
        tf_startup_logs.install_import_filter()


_hide_tensorflow_startup_lines()


def _keras_distribution_on_tensorflow() -> None:
    # keras.distribution has no TensorFlow backend (keras-team/keras#18473);
    # tfdist gives it one when Keras is imported (tfdist.keras_distribution).
    from tfdist import keras_distribution

    keras_distribution.install_on_import()


_keras_distribution_on_tensorflow()

__all__ = ["Distributed", "setup", "__version__"]
