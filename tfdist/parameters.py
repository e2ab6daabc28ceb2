"""How many parameters some variables hold: the one count the placement table,
the pipeline cut, the bench's model figures and the backup's size all use.

Imports nothing of tfdist, so any module can use it without an import circle.
"""

from __future__ import annotations

import math


def count(variables) -> int:
    """Pure function: the parameters in `variables`, the product of each one's shape, summed.

    Args:
        variables: anything with a `.shape` of whole numbers (Keras or TensorFlow
            variables, numpy arrays); a scalar counts 1.

    Returns:
        The total, as a Python int.
    """
    return sum(math.prod(int(d) for d in v.shape) for v in variables)
