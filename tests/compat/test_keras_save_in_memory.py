"""keras-team/keras#19989: a `.keras` save buffers its weights file in memory where the
host has room; `compat.keras_save_in_memory.on_disk` makes it write a temporary file."""

import tempfile

import numpy as np


def _model():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.layers[0].kernel.assign(np.arange(6, dtype="float32").reshape(3, 2))
    return model


def _temp_files_during_save(monkeypatch, model, path) -> list:
    made = []
    original = tempfile.NamedTemporaryFile

    def recording(*args, **kwargs):
        made.append(kwargs.get("dir"))
        return original(*args, **kwargs)

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", recording)
    model.save(path)
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", original)
    return made


def test_keras_buffers_in_memory_and_on_disk_writes_a_temporary_file(tmp_path, monkeypatch):
    import keras
    from keras.src.saving import saving_lib

    from tfdist.compat import keras_save_in_memory

    model = _model()
    # Weights over 8 bytes are written in row ranges (the kernel: one row at a time).
    monkeypatch.setattr(keras_save_in_memory, "PIECE_BYTES", 8)
    # Upstream: the host has room for this model's weights, so Keras keeps the file in memory.
    assert saving_lib.is_memory_sufficient(model)
    assert _temp_files_during_save(monkeypatch, model, tmp_path / "memory.keras") == []
    with keras_save_in_memory.on_disk() as applied:
        assert applied
        made = _temp_files_during_save(monkeypatch, model, tmp_path / "disk.keras")
    assert [str(d) for d in made] == [str(tmp_path)]  # beside the target, as Keras does
    assert saving_lib.is_memory_sufficient(model)  # restored on leaving
    for name in ("memory.keras", "disk.keras"):  # the same weights either way
        loaded = keras.models.load_model(tmp_path / name)
        for got, want in zip(loaded.weights, model.weights):
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert _arrays(tmp_path / "memory.keras") == _arrays(tmp_path / "disk.keras")


def _arrays(path) -> dict:
    """{dataset path: (shape, dtype, bytes)} of a .keras file's weights."""
    import io
    import zipfile

    import h5py

    out = {}
    with zipfile.ZipFile(path) as z, h5py.File(io.BytesIO(z.read("model.weights.h5"))) as f:
        f.visititems(lambda k, v: out.__setitem__(k, (v.shape, str(v.dtype), v[()].tobytes()))
                     if isinstance(v, h5py.Dataset) else None)
    return out
