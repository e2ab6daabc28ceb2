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
"""

__version__ = "0.1.0"

from tfdist.distributed import Distributed, setup  # noqa: E402  (imports no TensorFlow)

__all__ = ["Distributed", "setup", "__version__"]
