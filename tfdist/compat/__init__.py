"""Upstream workarounds, one module per upstream bug.

Each module names the upstream issue, checks that the installed library still
has the internals it patches, and is applied by `apply_all()` whenever tfdist
builds a strategy.
"""

from __future__ import annotations


def apply_all() -> None:
    """Applies every workaround that the installed libraries need."""
    from tfdist.compat import keras_grad_reduction, keras_mwms, keras_sparse_duplicates

    keras_mwms.apply()
    keras_grad_reduction.apply()
    keras_sparse_duplicates.apply()
