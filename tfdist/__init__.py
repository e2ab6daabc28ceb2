"""tfdist: distributed training for Keras 3 models on TensorFlow.

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
