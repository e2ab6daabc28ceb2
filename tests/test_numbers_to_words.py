"""recipes/numbers_to_words.py: its data, its held-out split, its model, and one real run."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.conftest import run_py, tail
from tfdist import recipe as recipe_lib
from tfdist.errors import ConfigError

ntw = recipe_lib.load("numbers_to_words")
TINY = dict(ntw.DEFAULTS, max_digits=3, d_model=16, num_heads=2, ff_width=32,
            encoder_layers=2, decoder_layers=2, num_train=300, num_test=50)


# --- data ------------------------------------------------------------------------------------

def test_digit_words_spells_every_digit():
    assert ntw.digit_words(305) == "three zero five"
    assert ntw.digit_words(0) == "zero"
    assert ntw.digit_words(1234567890) == ("one two three four five six seven eight nine "
                                           "zero")
    with pytest.raises(ValueError, match="Received: -1"):
        ntw.digit_words(-1)


def test_encode_teacher_forcing_layout():
    digits, words_in, words_out = ntw.encode([305, 0, 999], max_digits=4)
    assert digits.shape == (3, 4) and words_in.shape == words_out.shape == (3, 5)
    assert digits.tolist()[0] == [4, 1, 6, ntw.ENC_PAD]  # each digit + 1, then padding
    three, zero, five = (ntw.WORD0 + d for d in (3, 0, 5))
    assert words_out.tolist()[0] == [three, zero, five, ntw.END, ntw.PAD]
    assert words_in.tolist()[0] == [ntw.START, three, zero, five, ntw.END]
    np.testing.assert_array_equal(words_in[:, 1:], words_out[:, :-1])
    assert [ntw.to_text(row) for row in words_out] == ["three zero five", "zero",
                                                       "nine nine nine"]
    with pytest.raises(ValueError, match="more than max_digits=2"):
        ntw.encode([305], max_digits=2)


def test_split_is_disjoint_deterministic_and_in_range():
    for max_digits, num_train, num_test in [(6, 40000, 2000), (3, 900, 100), (2, 60, 10)]:
        train, test = ntw.split_numbers(max_digits, num_train, num_test, seed=0)
        assert len(train) == num_train and len(test) == num_test
        assert len(set(train.tolist())) == num_train and len(set(test.tolist())) == num_test
        assert not set(train.tolist()) & set(test.tolist())  # held out: never trained on
        assert train.min() >= 0 and max(train.max(), test.max()) < 10 ** max_digits
        again = ntw.split_numbers(max_digits, num_train, num_test, seed=0)
        np.testing.assert_array_equal(again[0], train)
        np.testing.assert_array_equal(again[1], test)
    other = ntw.split_numbers(6, 40000, 2000, seed=1)[1]
    assert not np.array_equal(other, ntw.split_numbers(6, 40000, 2000, seed=0)[1])


def test_split_too_large_for_the_range_is_a_config_error():
    with pytest.raises(ConfigError, match=r"--num-train 950 \+ --num-test 100 exceeds the 1000 "
                                          r"numbers below 10\*\*3"):
        ntw.split_numbers(3, 950, 100)


def test_exact_match_compares_up_to_the_first_end_only():
    end, pad = ntw.END, ntw.PAD
    target = np.array([[5, 6, end, pad], [7, end, pad, pad]])
    predicted = np.array([[5, 6, end, 9],  # junk after END: still right
                          [7, 7, end, pad]])  # a word too many: wrong
    assert ntw.exact_match(predicted, target) == 0.5
    assert ntw.exact_match(target, target) == 1.0
    no_end = np.array([[5, 6, 6, 6], [7, end, pad, pad]])
    assert ntw.exact_match(no_end, target) == 0.5


def test_dataset_weights_mask_the_padding():
    ds = ntw.build_dataset(TINY, "test")
    (digits, words_in), target, weights = next(iter(ds))
    assert digits.shape == (3,) and words_in.shape == (4,) and target.shape == (4, ntw.DEC_VOCAB)
    labels = np.argmax(target.numpy(), axis=-1)
    np.testing.assert_array_equal(weights.numpy(), (labels != ntw.PAD).astype("float32"))
    assert sum(1 for _ in ds) == TINY["num_test"]


# --- model -----------------------------------------------------------------------------------

def _producer(tensor):
    return tensor._keras_history[0].name


def _edges(model):
    """(producing layer, consuming layer) for every tensor a layer reads."""
    edges = set()
    for layer in model.layers:
        for node in layer._inbound_nodes:
            for tensor in node.input_tensors:
                edges.add((_producer(tensor), layer.name))
    return edges


def _block(name):
    """('enc', 1) for enc_1_attn_norm; None for layers outside the blocks."""
    parts = name.split("_")
    return (parts[0], int(parts[1])) if len(parts) > 2 and parts[1].isdigit() else None


def test_model_shapes_names_and_single_tensor_between_blocks():
    import keras

    model = ntw.build_model(TINY)
    assert [tuple(i.shape) for i in model.inputs] == [(None, 3), (None, 4)]
    assert tuple(model.output.shape) == (None, 4, ntw.DEC_VOCAB)
    names = {layer.name for layer in model.layers}
    assert {"enc_embed", "enc_position", "enc_norm", "dec_embed", "dec_position", "dec_norm",
            "logits"} <= names
    assert {n for n in names if n.startswith("enc_0_")} == {
        "enc_0_attn_norm", "enc_0_attn", "enc_0_attn_add",
        "enc_0_ffn_norm", "enc_0_ffn_in", "enc_0_ffn_out", "enc_0_ffn_add"}
    assert {n for n in names if n.startswith("dec_1_")} == {
        "dec_1_self_norm", "dec_1_self_attn", "dec_1_self_add",
        "dec_1_cross_norm", "dec_1_cross_attn", "dec_1_cross_add",
        "dec_1_ffn_norm", "dec_1_ffn_in", "dec_1_ffn_out", "dec_1_ffn_add"}
    # Attention without biases (a key bias gets no gradient), its kernels shaped by head.
    for layer in model.layers:
        if isinstance(layer, keras.layers.MultiHeadAttention):
            assert not any("bias" in w.path for w in layer.weights), layer.name
            assert tuple(layer._query_dense.kernel.shape) == (16, 2, 8)
            assert tuple(layer._output_dense.kernel.shape) == (2, 8, 16)
    # Between consecutive blocks of a stack only the residual stream crosses; the
    # encoder output (enc_norm) reaches every decoder block through its cross-attention.
    crossing = {}
    for src, dst in _edges(model):
        a, b = _block(src), _block(dst)
        if b is not None and a != b:
            crossing.setdefault(b, set()).add(src)
    for stack, n in (("enc", 2), ("dec", 2)):
        for i in range(n):
            before = f"{stack}_position" if i == 0 else f"{stack}_{i - 1}_ffn_add"
            want = {before} | ({"enc_norm"} if stack == "dec" else set())
            assert crossing[(stack, i)] == want, (stack, i, crossing[(stack, i)])
    assert {src for src, dst in _edges(model) if dst.endswith("_cross_attn")} == {
        "dec_0_cross_norm", "dec_1_cross_norm", "enc_norm"}


def test_mixed_precision_keeps_logits_in_float32():
    import keras

    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = ntw.build_model(TINY)
    finally:
        keras.mixed_precision.set_global_policy(before)
    assert model.get_layer("dec_0_ffn_in").compute_dtype == "float16"
    assert model.output.dtype == "float32"
    digits, words_in, _ = ntw.encode([12, 345], 3)
    assert model((digits, words_in)).dtype == "float32"


def test_greedy_decode_feeds_back_its_own_argmax():
    model = ntw.build_model(TINY)
    digits, _, _ = ntw.encode([7, 42, 305], 3)
    got = ntw.greedy_decode(model, digits, 4, batch_size=2)
    assert got.shape == (3, 4) and got.dtype == np.int32
    # Step by step by hand: each position's argmax given the tokens before it.
    words_in = np.full((3, 4), ntw.PAD, np.int32)
    words_in[:, 0] = ntw.START
    for t in range(4):
        token = np.argmax(model((digits, words_in)).numpy()[:, t], axis=-1)
        np.testing.assert_array_equal(got[:, t], token)
        if t + 1 < 4:
            words_in[:, t + 1] = token


def test_predict_spells_each_input_and_refuses_what_the_model_cannot_read():
    model = ntw.build_model(TINY)  # untrained: the words are wrong, their form is not
    got = ntw.predict(model, ["305", " 7 ", "007"], TINY)
    assert len(got) == 3 and all(isinstance(t, str) for t in got)
    for bad in ("abc", "-5", "1000", "3.5", "", "²"):
        with pytest.raises(ConfigError, match=r"an integer from 0 to 999 \(this model was "
                                              r"trained with --max-digits 3\)"):
            ntw.predict(model, ["1", bad], TINY)


def test_bad_heads_is_a_config_error():
    with pytest.raises(ConfigError, match="--d-model 16 is not a multiple of --num-heads 3"):
        ntw.build_model(dict(TINY, num_heads=3))


# --- one real run ----------------------------------------------------------------------------

@pytest.mark.integration
def test_tiny_run_through_the_cli_writes_exact_match(tmp_path):
    """The real command, mixed precision: metrics.json gets exact_match from greedy decoding,
    `python -m tfdist.predict` translates with the trained model, and model.keras loads
    with Keras alone (uncompiled)."""
    model_dir = str(tmp_path / "run")
    # 150 steps: every number below 1000 learned in about 5 s (seeds 0-4 all ended at
    # exact_match 1.0; 100 steps left seed 1 at 0.85).
    proc = run_py(["-m", "tfdist.train", "numbers_to_words", "--max-digits", "3",
                   "--d-model", "32", "--num-heads", "2", "--ff-width", "64",
                   "--encoder-layers", "1", "--decoder-layers", "1", "--num-train", "800",
                   "--num-test", "100", "--epochs", "6", "--warmup-steps", "10",
                   "--global-batch-size", "32", "--precision", "mixed_float16",
                   "--verbose", "0", "--model-dir", model_dir], timeout=180)
    assert proc.returncode == 0, tail(proc)
    with open(os.path.join(model_dir, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)
    assert 0.0 <= metrics["exact_match"] <= 1.0 and metrics["exact_match_examples"] == 100
    # What tfdist.predict reads back: the recipe and the run's own options.
    assert metrics["recipe"] == "numbers_to_words" and metrics["config"]["max_digits"] == 3
    # Use what was trained: the recipe's predict on model.keras, from another directory.
    proc = run_py(["-m", "tfdist.predict", model_dir, "305", "42"], cwd=str(tmp_path),
                  timeout=120)
    assert proc.returncode == 0, tail(proc)
    assert proc.stdout.splitlines() == ["three zero five", "four two"], tail(proc)
    assert 0.0 <= metrics["test"]["token_accuracy"] <= 1.0
    assert metrics["precision"] == "mixed_float16" and metrics["loss_scaling"] is True
    assert metrics["clipnorm"] == 1.0 and metrics["optimizer"] == "adam"
    # compile=False: the saved optimizer's Noam schedule is tfdist's (tfdist>WarmupSchedule).
    check = ("import sys, keras; m = keras.saving.load_model(sys.argv[1], compile=False); "
             "print(m.name, m.output.shape)")
    proc = run_py(["-c", check, os.path.join(model_dir, "model.keras")], timeout=120)
    assert proc.returncode == 0, tail(proc)
    assert "numbers_to_words (None, 4, 13)" in proc.stdout
