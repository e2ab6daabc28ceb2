"""tfdist.gradient_path: the one module overriding a Keras optimizer's hooks (#49)."""

import ast
import dataclasses
import pathlib
import re

import numpy as np
import pytest

TFDIST = pathlib.Path(__file__).resolve().parents[1] / "tfdist"
HOOKS = {"_clip_gradients", "_backend_apply_gradients", "_backend_update_step", "update_step",
         "apply", "_backend_increment_gradient_accumulators", "_apply_weight_decay",
         "_all_reduce_sum_gradients", "check_finite", "_stateful_handle_finite_grads"}


def test_only_the_gradient_path_overrides_an_optimizers_hooks():
    found = []
    for path in TFDIST.rglob("*.py"):
        rel = path.relative_to(TFDIST).as_posix()
        if rel.startswith("compat/") or rel == "gradient_path.py":
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                found += [f"{rel}:{m.lineno} {m.name}" for m in node.body
                          if isinstance(m, ast.FunctionDef) and m.name in HOOKS]
        found += [f"{rel}: sets update_step" for _ in re.finditer(r"\.update_step = ", text)]
        found += [f"{rel}: _tfdist_update_ops" for _ in re.finditer("_tfdist_update_ops", text)]
    assert found == []


def _steps():
    from tfdist import gradient_path

    @dataclasses.dataclass(frozen=True)
    class Times(gradient_path.Step):
        """A step whose reduce multiplies the gradients."""

        factor: float

        def reduce(self, opt, grads, then):
            return then([g * self.factor for g in grads])

    @dataclasses.dataclass(frozen=True)
    class Skip(gradient_path.Step):
        def reduce(self, opt, grads, then):
            return grads  # does not call the rest of the path

    return gradient_path, Times, Skip


def test_steps_run_outermost_first_and_may_end_the_path():
    import keras

    gradient_path, Times, Skip = _steps()

    def one_update(cls):
        v = keras.Variable(np.ones(2, "float32"))
        cls(learning_rate=1.0).apply([np.ones(2, "float32")], [v])
        return v.numpy()

    twice = gradient_path.extended(keras.optimizers.SGD, Times(2.0))
    six = gradient_path.extended(twice, Times(3.0))
    assert six.__mro__[2] is keras.optimizers.SGD and six.__name__ == "SGD"
    assert six.__module__ == keras.optimizers.SGD.__module__
    assert gradient_path.keras_class(six) is keras.optimizers.SGD
    assert [s.factor for s in gradient_path.steps_of(six(), Times)] == [3.0, 2.0]
    assert gradient_path.extended(twice, Times(3.0)) is six  # one class per path
    np.testing.assert_array_equal(one_update(twice), [-1.0, -1.0])
    np.testing.assert_array_equal(one_update(six), [-5.0, -5.0])
    # A step that does not call `then` ends the path: the factors after it never run.
    np.testing.assert_array_equal(one_update(gradient_path.extended(six, Skip())), [0.0, 0.0])
    copy = six.from_config(six(learning_rate=1.0).get_config())
    assert type(copy) is six


def test_a_step_may_set_only_declared_marks():
    import keras

    gradient_path, _, _ = _steps()

    class Marked(gradient_path.Step):
        marks = {"_tfdist_undeclared": True}

    with pytest.raises(TypeError, match="_tfdist_undeclared"):
        gradient_path.extended(keras.optimizers.Adam, Marked())


def test_clip_by_global_norm_is_keras_own_and_splits_across_workers():
    from keras.src.optimizers.base_optimizer import clip_by_global_norm as keras_clip

    from tfdist import gradient_path

    rng = np.random.default_rng(0)
    grads = [rng.normal(size=s).astype("float32") for s in [(3, 4), (4,), (5,)]]
    ours = gradient_path.clip_by_global_norm(grads, 0.5)
    for a, b in zip(ours, keras_clip(grads, 0.5)):  # the same ops: equal to the bit
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Two workers, each counting and scaling its own, the norm summed between them.
    mine = [[True, False, True], [False, True, False]]
    parts = [gradient_path.squared_sum([g for g, m in zip(grads, own) if m]) for own in mine]
    total = float(parts[0]) + float(parts[1])
    for own in mine:
        got = gradient_path.clip_by_global_norm(grads, 0.5, counted=own, scaled=own,
                                                total=lambda local: total)
        for g, o, a, want in zip(grads, own, got, ours):
            np.testing.assert_allclose(np.asarray(a), np.asarray(want) if o else g, rtol=1e-6)
    # Keras's NaN for a norm that is not finite: the step is then skipped, not applied.
    bad = gradient_path.clip_by_global_norm([np.array([np.inf], "float32")], 1.0)
    assert np.isnan(np.asarray(bad[0])).all()
