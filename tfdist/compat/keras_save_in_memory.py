"""A `.keras` save buffers the whole weights file in memory when the host has room.

Upstream: keras-team/keras#19989 (Keras 3.4+; measured on Keras 3.15.1).
`saving_lib._save_model_to_fileobj` writes `model.weights.h5` into memory
first, then into the zip, whenever `is_memory_sufficient(model)`: the weights
under half of psutil's available memory. That is the host's memory, not a
memory cgroup's limit, and it counts every weight of the model, not what
this process holds. Otherwise Keras writes the file to a temporary file beside
the target and copies it into the zip.

A pipeline's chief saves the whole model while holding one stage, and a memory
cgroup caps it below what the host has free: in memory, the file of every
stage's weights comes on top of its own stage. `on_disk()` makes Keras take its
temporary-file path inside it; the file written is the same. (Measured on 13 x
4096 x 4096 + Adam in 2 stage processes, 2026-11-28, two runs each: the chief's
final save raised its peak about 200-325 MiB above training (2244 MiB) with the file
in memory, 190-240 MiB through the temporary file; what remains is each other
stage's weight in flight to the chief.)
"""

from __future__ import annotations

import contextlib

UPSTREAM_ISSUES = ("keras-team/keras#19989",)


@contextlib.contextmanager
def on_disk():
    """Keras's `.keras` saves inside write the weights file through a temporary file.

    Yields:
        True where Keras has the choice this replaces (`saving_lib.is_memory_sufficient`),
        False where it moved (saving then works as that Keras decides).
    """
    from keras.src.saving import saving_lib

    original = getattr(saving_lib, "is_memory_sufficient", None)
    if original is None:
        yield False
        return
    saving_lib.is_memory_sufficient = lambda model: False
    try:
        yield True
    finally:
        saving_lib.is_memory_sufficient = original
