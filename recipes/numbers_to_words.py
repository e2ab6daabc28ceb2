"""numbers_to_words: an encoder-decoder Transformer that spells integers digit by digit.

"305" -> "three zero five", for every integer below 10**max_digits. The
encoder reads the number's digits, the decoder writes one word per digit and
an end token. The training and test numbers are disjoint (a seeded
permutation of the whole range is cut in two), so the exact-match rate of
greedy decoding, written into metrics.json as `exact_match`, is measured on
numbers the model never saw. Nothing is downloaded.

Defaults are the lessons' Transformer: d_model 128, 4 heads, 2 encoder and 2
decoder layers (feed-forward 512, 4 x d_model); Adam with the Noam schedule
(linear warmup to --learning-rate, then 1/sqrt(step)), label smoothing 0.1,
clipping at global norm 1.0. `--precision mixed_float16` computes in float16 with the
logits (and so the softmax and the loss) in float32 and loss scaling.

The model is a Keras functional model of built-in layers only, so its
model.keras loads with Keras alone (`compile=False`: the saved optimizer's
schedule is tfdist's). Its layers are named by block:

    digits -> enc_embed -> enc_position -> enc_0_* -> enc_1_* -> enc_norm (encoder output)
    words_in -> dec_embed -> dec_position -> dec_0_* -> dec_1_* -> dec_norm -> logits

Each block is pre-LayerNorm with its residuals inside it, so exactly one
tensor (the residual stream) passes from one block to the next; every
decoder block's cross-attention also reads the encoder output. Attention is
keras.layers.MultiHeadAttention without biases: its kernels are shaped by
head ((d_model, heads, head_dim) and (heads, head_dim, d_model)), so they
split by heads; an attention key bias would get no gradient (softmax ignores
a constant shift) and carry only rounding noise. There is no padding mask:
the encoder's PAD is a token like the others (the numbers are left-aligned,
so it only ever follows the last digit), the decoder's self-attention is
causal, and the loss and token accuracy weigh PAD targets 0.

Launch:
    python -m tfdist.train numbers_to_words                     # about 2 minutes on 2 cores
    python -m tfdist.train numbers_to_words --precision mixed_float16
    python -m tfdist.train numbers_to_words --strategy mirrored --devices 2
    python -m tfdist.launch -n 2 -- python -m tfdist.train numbers_to_words --strategy multi_worker
    python -m tfdist.train numbers_to_words --strategy model_parallel --devices 2 \\
        --tensor-parallel 2                    # one stage, split by heads over 2 devices
    python -m tfdist.train numbers_to_words --strategy pipeline --devices 4 --tensor-parallel 2 \\
        --microbatches 4                       # 2 stages, each split by heads over 2 devices
    python -m tfdist.train numbers_to_words --max-digits 4 --d-model 32 --ff-width 64 \\
        --num-train 2000 --num-test 200 --epochs 3 --warmup-steps 20   # seconds

Use: `python -m tfdist.predict runs/numbers_to_words/single 305 42` prints
"three zero five" and "four two" (`predict`, greedy decoding). A model that
learns every number below 1000 in about 5 s here:
    python -m tfdist.train numbers_to_words --max-digits 3 --d-model 32 --num-heads 2 \\
        --ff-width 64 --encoder-layers 1 --decoder-layers 1 --num-train 800 --num-test 100 \\
        --epochs 6 --global-batch-size 32 --warmup-steps 10
"""

from __future__ import annotations

from tfdist.errors import ConfigError
from tfdist.option import Option

DEFAULTS = dict(
    epochs=2,
    global_batch_size=128,
    optimizer="adam",
    lr_schedule="noam",
    learning_rate=2e-3,  # the Noam schedule's peak, reached at the end of the warmup
    # About the first epoch (312 steps); the lessons' 4,000 suit the 100,000 steps of
    # Vaswani et al., not this run's 624.
    warmup_steps=300,
    clipnorm=1.0,
    d_model=Option(128, "model width (embeddings, attention, residual stream)", ge=1),
    num_heads=Option(4, "attention heads; d_model must be a multiple of it", ge=1),
    encoder_layers=Option(2, "encoder blocks", ge=1, le=1000),
    decoder_layers=Option(2, "decoder blocks", ge=1, le=1000),
    ff_width=Option(512, "units of each block's feed-forward hidden layer", ge=1),
    max_digits=Option(6, "numbers are below 10**max_digits; the decoder runs max_digits + 1 "
                         "steps", ge=1, le=15),
    num_train=Option(40000, "training numbers", ge=1),
    num_test=Option(2000, "held-out test numbers, none of them in training", ge=1),
    label_smoothing=Option(0.1, "label smoothing of the cross-entropy", ge=0, lt=1),
    split_seed=Option(0, "seed of the permutation that splits the numbers into train and test",
                      ge=0, le=2**32 - 1),
)

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# Encoder tokens: PAD, then the digits 0-9 as 1-10.
ENC_PAD = 0
ENC_VOCAB = 11
# Decoder tokens: PAD, START, END, then the words of 0-9 as 3-12.
PAD, START, END = 0, 1, 2
WORD0 = 3
DEC_VOCAB = 13


# --- data: pure numpy, no TensorFlow ---------------------------------------------------------

def digit_words(number: int) -> str:
    """'three zero five' for 305."""
    if number < 0:
        raise ValueError(f"numbers_to_words spells non-negative integers. Received: {number}.")
    return " ".join(WORDS[int(c)] for c in str(number))


def split_numbers(max_digits: int, num_train: int, num_test: int, seed: int = 0):
    """Disjoint train and test numbers below 10**max_digits.

    A permutation of the whole range, seeded by `seed`, is cut: its first
    `num_test` numbers are the test split, the next `num_train` the training
    split. The same arguments give the same split on every worker.

    Returns:
        (train, test): int64 arrays.

    Raises:
        ConfigError: when the range holds fewer than num_train + num_test numbers.
    """
    import numpy as np

    size = 10 ** max_digits
    if num_train + num_test > size:
        raise ConfigError(f"numbers_to_words: --num-train {num_train} + --num-test {num_test} "
                         f"exceeds the {size} numbers below 10**{max_digits}; lower them or "
                         "raise --max-digits.")
    rng = np.random.default_rng(seed)
    if size <= 4 * (num_train + num_test):
        order = rng.permutation(size)
    else:  # sparse: draw distinct numbers without a permutation of the whole range
        order = rng.choice(size, num_train + num_test, replace=False)
    order = order.astype(np.int64)
    return order[num_test:num_test + num_train], order[:num_test]


def encode(numbers, max_digits: int):
    """Token arrays for `numbers`.

    Returns:
        (digits, words_in, words_out): int32 arrays of shape (n, max_digits),
        (n, max_digits + 1) and (n, max_digits + 1). `digits` holds each digit
        + 1, then ENC_PAD; `words_out` the words (WORD0 + digit), END, then
        PAD; `words_in` is START followed by `words_out` shifted right (what
        the decoder reads under teacher forcing).
    """
    import numpy as np

    n = len(numbers)
    digits = np.full((n, max_digits), ENC_PAD, np.int32)
    words_out = np.full((n, max_digits + 1), PAD, np.int32)
    for i, number in enumerate(numbers):
        text = str(int(number))
        if len(text) > max_digits:
            raise ValueError(f"numbers_to_words: {number} has more than max_digits="
                             f"{max_digits} digits.")
        values = np.frombuffer(text.encode("ascii"), np.uint8).astype(np.int32) - ord("0")
        digits[i, :len(text)] = values + 1
        words_out[i, :len(text)] = values + WORD0
        words_out[i, len(text)] = END
    words_in = np.concatenate([np.full((n, 1), START, np.int32), words_out[:, :-1]], axis=1)
    return digits, words_in, words_out


def cut_at_end(tokens):
    """`tokens` (n, length) with everything after each row's first END set to PAD."""
    import numpy as np

    tokens = np.asarray(tokens)
    is_end = tokens == END
    after = np.cumsum(is_end, axis=1) - is_end > 0  # strictly after the first END
    return np.where(after, PAD, tokens)


def exact_match(predicted, target) -> float:
    """The fraction of rows whose words up to and with the first END equal the target's."""
    import numpy as np

    predicted, target = cut_at_end(predicted), cut_at_end(target)
    return float(np.mean(np.all(predicted == target, axis=1)))


def to_text(tokens) -> str:
    """The words of one decoded row, up to its first END."""
    words = []
    for t in tokens:
        if t == END:
            break
        words.append(WORDS[t - WORD0] if WORD0 <= t < WORD0 + 10 else f"<{t}>")
    return " ".join(words)


def arrays(cfg, split: str):
    """(digits, words_in, words_out) of the split's numbers."""
    train, test = split_numbers(cfg["max_digits"], cfg["num_train"], cfg["num_test"],
                                cfg["split_seed"])
    return encode(train if split == "train" else test, cfg["max_digits"])


def build_dataset(cfg, split):
    """((digits, words_in), one-hot words_out, token weights): the weights are 0 on PAD,
    so neither the loss nor token accuracy counts the padding."""
    import numpy as np
    import tensorflow as tf

    digits, words_in, words_out = arrays(cfg, split)
    target = np.eye(DEC_VOCAB, dtype=np.float32)[words_out]  # one-hot: label smoothing
    weights = (words_out != PAD).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(((digits, words_in), target, weights))


# --- model -----------------------------------------------------------------------------------

def _embed(tokens, vocab, cfg, length, prefix):
    """Token embedding * sqrt(d_model) + a learned position embedding, in built-in layers."""
    import keras

    d = cfg["d_model"]
    x = keras.layers.Embedding(vocab, d, name=f"{prefix}_embed")(tokens)
    # EinsumDense as (scale, position table): x * kernel + bias[position]. The kernel, one
    # value per channel, starts at sqrt(d_model) (the Transformer's embedding scale); the
    # (length, d_model) bias is the position embedding. Built in, so model.keras needs no code.
    return keras.layers.EinsumDense(
        "btd,d->btd", output_shape=(length, d), bias_axes="td",
        kernel_initializer=keras.initializers.Constant(d ** 0.5),
        bias_initializer=keras.initializers.RandomNormal(stddev=1.0),
        name=f"{prefix}_position")(x)


def _attention(cfg, name):
    import keras

    heads = cfg["num_heads"]
    return keras.layers.MultiHeadAttention(heads, cfg["d_model"] // heads, use_bias=False,
                                           name=name)


def _feed_forward(x, cfg, prefix):
    import keras

    h = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{prefix}_ffn_norm")(x)
    h = keras.layers.Dense(cfg["ff_width"], activation="relu", name=f"{prefix}_ffn_in")(h)
    h = keras.layers.Dense(cfg["d_model"], name=f"{prefix}_ffn_out")(h)
    return keras.layers.Add(name=f"{prefix}_ffn_add")([x, h])


def encoder_block(x, cfg, prefix):
    """x + self-attention(norm(x)), then + feed-forward(norm(.)): one tensor in, one out."""
    import keras

    h = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{prefix}_attn_norm")(x)
    h = _attention(cfg, f"{prefix}_attn")(h, h)
    x = keras.layers.Add(name=f"{prefix}_attn_add")([x, h])
    return _feed_forward(x, cfg, prefix)


def decoder_block(x, encoded, cfg, prefix):
    """Causal self-attention, cross-attention to `encoded`, feed-forward; each pre-norm with
    its residual. Reads x and the encoder output; passes one tensor on."""
    import keras

    h = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{prefix}_self_norm")(x)
    h = _attention(cfg, f"{prefix}_self_attn")(h, h, use_causal_mask=True)
    x = keras.layers.Add(name=f"{prefix}_self_add")([x, h])
    h = keras.layers.LayerNormalization(epsilon=1e-6, name=f"{prefix}_cross_norm")(x)
    h = _attention(cfg, f"{prefix}_cross_attn")(h, encoded)
    x = keras.layers.Add(name=f"{prefix}_cross_add")([x, h])
    return _feed_forward(x, cfg, prefix)


def build_model(cfg):
    """(digits, words_in) -> logits of the next word at each decoder position (float32)."""
    import keras

    if cfg["d_model"] % cfg["num_heads"]:
        raise ConfigError(f"numbers_to_words: --d-model {cfg['d_model']} is not a multiple of "
                         f"--num-heads {cfg['num_heads']}.")
    n = cfg["max_digits"]
    digits = keras.Input((n,), dtype="int32", name="digits")
    words_in = keras.Input((n + 1,), dtype="int32", name="words_in")

    x = _embed(digits, ENC_VOCAB, cfg, n, "enc")
    for i in range(cfg["encoder_layers"]):
        x = encoder_block(x, cfg, f"enc_{i}")
    encoded = keras.layers.LayerNormalization(epsilon=1e-6, name="enc_norm")(x)

    y = _embed(words_in, DEC_VOCAB, cfg, n + 1, "dec")
    for i in range(cfg["decoder_layers"]):
        y = decoder_block(y, encoded, cfg, f"dec_{i}")
    y = keras.layers.LayerNormalization(epsilon=1e-6, name="dec_norm")(y)
    # float32 under mixed precision: the softmax and the loss need float32's range.
    logits = keras.layers.Dense(DEC_VOCAB, dtype="float32", name="logits")(y)
    return keras.Model([digits, words_in], logits, name="numbers_to_words")


def compile_kwargs(cfg):
    import keras

    return dict(loss=keras.losses.CategoricalCrossentropy(
                    from_logits=True, label_smoothing=cfg["label_smoothing"]),
                weighted_metrics=[keras.metrics.CategoricalAccuracy(name="token_accuracy")])


# --- greedy decoding -------------------------------------------------------------------------

def greedy_decode(model, digits, length: int, batch_size: int = 500):
    """The decoder's tokens, one at a time from START, each step feeding back its argmax.

    Args:
        model: Takes (digits, words_in) and returns logits (batch, length, DEC_VOCAB).
        digits: Encoder tokens (n, max_digits), as `encode` makes them.
        length: Decoder steps (max_digits + 1).
        batch_size: Numbers decoded together.

    Returns:
        int32 array (n, length): the words and END as written (after END: anything).
    """
    import numpy as np
    import tensorflow as tf

    @tf.function
    def decode(batch):
        n = tf.shape(batch)[0]
        words_in = tf.concat([tf.fill([n, 1], START), tf.fill([n, length - 1], PAD)], axis=1)
        out = []
        for t in range(length):  # unrolled: the causal mask ignores positions after t
            logits = model((batch, words_in), training=False)
            token = tf.argmax(logits[:, t], axis=-1, output_type=tf.int32)
            out.append(token)
            if t + 1 < length:
                words_in = tf.concat([words_in[:, :t + 1], token[:, None],
                                      words_in[:, t + 2:]], axis=1)
        return tf.stack(out, axis=1)

    parts = [decode(tf.constant(digits[i:i + batch_size]))
             for i in range(0, len(digits), batch_size)]
    return np.concatenate([p.numpy() for p in parts], axis=0)


def evaluate(model, cfg):
    """metrics.json's `exact_match`: greedy decoding of every held-out number."""
    digits, _, words_out = arrays(cfg, "test")
    predicted = greedy_decode(model, digits, cfg["max_digits"] + 1)
    return {"exact_match": exact_match(predicted, words_out),
            "exact_match_examples": len(digits)}


def predict(model, inputs, cfg):
    """`python -m tfdist.predict`: the words of each number in `inputs` ("305" -> "three zero
    five"), by greedy decoding.

    Raises:
        ConfigError: for an input that is not a non-negative integer of at most
            max_digits digits (what the model was trained on).
    """
    n = cfg["max_digits"]
    numbers = []
    for text in inputs:
        text = str(text).strip()
        if not (text.isascii() and text.isdigit()) or len(str(int(text))) > n:
            raise ConfigError(f"numbers_to_words: an input is an integer from 0 to "
                              f"{10 ** n - 1} (this model was trained with --max-digits {n}). "
                              f"Received: {text!r}.")
        numbers.append(int(text))
    digits, _, _ = encode(numbers, n)
    return [to_text(row) for row in greedy_decode(model, digits, n + 1)]
