"""tfdist's Keras callbacks as a person sees them."""

import pytest

from tfdist import callbacks as cb


def test_progress_bar_numbers_epochs_out_of_the_runs_total(capsys):
    # The fit that finishes a resumed partial epoch 20 asks Keras for epochs=20.
    bar = cb.make_progress_bar(30)
    bar.set_params({"verbose": 2, "epochs": 20, "steps": 5})
    bar.on_epoch_begin(19)
    assert capsys.readouterr().out == "Epoch 20/30\n"
    quiet = cb.make_progress_bar(30)
    quiet.set_params({"verbose": 0, "epochs": 20, "steps": 5})
    quiet.on_epoch_begin(19)
    assert capsys.readouterr().out == ""


@pytest.mark.integration
def test_fit_shows_the_resumed_partial_epoch_out_of_the_total(capsys):
    import numpy as np
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((8, 2), "float32"), np.zeros((8, 1), "float32")
    model.fit(x, y, batch_size=4, initial_epoch=19, epochs=20, verbose=2,
              callbacks=[cb.make_progress_bar(30)])
    out = capsys.readouterr().out
    assert "Epoch 20/30" in out and "Epoch 20/20" not in out  # Keras's own bar is replaced
    assert out.count("Epoch ") == 1 and out.count("2/2 - ") == 1, out
