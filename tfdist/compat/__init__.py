"""Upstream workarounds, one module per upstream bug.

Each module names the upstream issue and checks that the installed library
still has the internals it patches. The patches are applied by `apply_all()`
whenever tfdist builds a strategy; the others are called where they are
needed (`tf_coordination_exit.leave`, at the end of `tfdist.train`).
"""

from __future__ import annotations


def apply_all() -> None:
    """Applies every workaround that the installed libraries need."""
    from tfdist.compat import keras_grad_reduction, keras_mwms, keras_sparse_duplicates

    keras_mwms.apply()
    keras_grad_reduction.apply()
    keras_sparse_duplicates.apply()
