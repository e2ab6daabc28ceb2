"""keras-team/keras#20585: Keras 3 fit under MultiWorkerMirroredStrategy.

The real-process tests reproduce both upstream failures on the installed
Keras, then show the workaround passing; the unit tests check the guard that
refuses to run on a Keras whose internals moved.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import WORKERS, run_py, tail

SCRIPT = os.path.join(WORKERS, "mwms_fit_raw.py")


def _launch(mode):
    return run_py(["-m", "tfdist.launch", "-n", "2", "--timeout", "120", "--",
                   "python", SCRIPT, mode])


@pytest.mark.integration
def test_upstream_fit_fails_without_workaround():
    proc = _launch("none")
    assert proc.returncode != 0, tail(proc)
    assert "Attempt to convert a value (PerReplica" in proc.stderr, tail(proc)
    assert "FIT_EVALUATE_PREDICT_OK" not in proc.stdout


@pytest.mark.integration
def test_second_cause_needs_the_reduce_fix():
    proc = _launch("build")
    assert proc.returncode != 0, tail(proc)
    assert "Invalid reduction dimension 0 for input with 0 dimensions" in proc.stderr, tail(proc)


@pytest.mark.integration
def test_workaround_makes_fit_evaluate_predict_work():
    proc = _launch("all")
    assert proc.returncode == 0, tail(proc)
    assert proc.stdout.count("FIT_EVALUATE_PREDICT_OK") == 2


def test_installed_keras_needs_it_and_apply_is_idempotent():
    from keras.src.backend.tensorflow import trainer

    from tfdist.compat import keras_mwms

    original = trainer.reduce_per_replica
    try:
        assert keras_mwms.is_needed()
        assert keras_mwms.apply() is True
        assert keras_mwms.apply() is True
        assert trainer.reduce_per_replica is keras_mwms._reduce_per_replica
        assert trainer.TensorFlowTrainer._maybe_symbolic_build is keras_mwms._maybe_symbolic_build
    finally:
        keras_mwms.revert()
    assert trainer.reduce_per_replica is original


def test_moved_internals_raise_a_clear_error(monkeypatch):
    from keras.src.backend.tensorflow import trainer

    from tfdist.compat import keras_mwms

    keras_mwms.revert()
    monkeypatch.delattr(trainer, "reduce_per_replica")
    with pytest.raises(keras_mwms.KerasInternalsChanged, match=r"keras-team/keras#20585.*"
                       r"no longer has reduce_per_replica"):
        keras_mwms.apply()
