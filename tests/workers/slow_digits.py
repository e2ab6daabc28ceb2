"""Test recipe: digits_mlp, slowed by a sleep per training example.

The same data, model and math as recipes/digits_mlp.py (so its weights must
equal a digits_mlp run's), but slow enough that a test can signal a Slurm job
while it trains. `--example-delay-ms 0` removes the delay.

The sleep is tf.data's own C++ sleep transformation (private API, test only):
a Python sleep in `tf.numpy_function` left the workers hanging at exit after
SIGTERM, their input threads still inside Python while the interpreter shut down.
"""

from tfdist import recipe as recipe_lib

_BASE = recipe_lib.load("digits_mlp")
DEFAULTS = dict(_BASE.DECLARED, example_delay_ms=1.0)
build_model = _BASE.build_model
compile_kwargs = _BASE.compile_kwargs


def build_dataset(cfg, split):
    from tensorflow.python.data.experimental.ops import testing

    ds = _BASE.build_dataset(cfg, split)
    if split != "train" or cfg["example_delay_ms"] <= 0:
        return ds
    return ds.apply(testing.sleep(int(cfg["example_delay_ms"] * 1000)))
