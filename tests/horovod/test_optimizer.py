"""DistributedOptimizer construction (no Horovod needed until gradients are applied)."""

import pytest

keras = pytest.importorskip("keras")

from tfdist.compat.horovod_keras import check_optimizer_hook  # noqa: E402
from tfdist.horovod import DistributedOptimizer  # noqa: E402


def test_wraps_any_keras_optimizer_keeping_name_and_config():
    for base in (keras.optimizers.SGD(0.1, momentum=0.9), keras.optimizers.Adam(0.01)):
        opt = DistributedOptimizer(base)
        assert isinstance(opt, type(base)) and type(opt) is not type(base)
        assert type(opt).__name__ == type(base).__name__
        assert type(opt).__module__ == type(base).__module__  # saves as the plain optimizer
        assert opt.get_config() == base.get_config()


def test_backward_passes_set_keras_accumulation():
    opt = DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=4)
    assert opt.gradient_accumulation_steps == 4


@pytest.mark.parametrize("kwargs, message", [
    ({"op": "max"}, r"op must be one of \['average', 'sum'\]. Received: op='max'"),
    ({"compression": "int8"}, r"compression must be one of \['none', 'fp16'\]"),
    ({"backward_passes_per_step": 0}, r"backward_passes_per_step must be an integer >= 1"),
])
def test_bad_options_say_what_was_received(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistributedOptimizer(keras.optimizers.SGD(0.1), **kwargs)


def test_refuses_double_wrap_built_and_conflicting_accumulation():
    with pytest.raises(ValueError, match="already a DistributedOptimizer"):
        DistributedOptimizer(DistributedOptimizer(keras.optimizers.SGD(0.1)))
    built = keras.optimizers.SGD(0.1)
    built.build([keras.Variable(1.0)])
    with pytest.raises(ValueError, match="has not been built"):
        DistributedOptimizer(built)
    with pytest.raises(ValueError, match="gradient_accumulation_steps=2, which disagrees"):
        DistributedOptimizer(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                             backward_passes_per_step=3)


def test_hook_check_accepts_keras_optimizers_and_rejects_others():
    check_optimizer_hook(keras.optimizers.SGD)
    with pytest.raises(TypeError, match="wraps Keras 3 optimizers"):
        check_optimizer_hook(object)


class _Times:
    """A stand-in reduction for the wrapper's own mechanics: every rank sent the same gradient."""

    def __init__(self, size):
        self.size = size

    def __call__(self, grads):
        return [g * self.size for g in grads]


def _apply(optimizer, *grads):
    import numpy as np
    import tensorflow as tf

    w = keras.Variable(np.zeros(2, "float32"))
    for g in grads:
        optimizer.apply([tf.fill([2], g)], [w])
    return w.numpy()


def test_from_config_copies_are_working_distributed_optimizers():
    """Horovod's test_from_config, plus: the copies apply the reduction (issue 15)."""
    from tfdist import allreduce_optimizer

    for hopt in (DistributedOptimizer(keras.optimizers.Adam()),
                 allreduce_optimizer.wrap(keras.optimizers.SGD(1.0), _Times(2))):
        cfg = hopt.get_config()
        copy1 = hopt.from_config(cfg)
        copy2 = hopt.__class__.from_config(cfg)
        for copy in (copy1, copy2):
            assert copy.get_config() == cfg
            assert type(copy) is type(hopt) and copy._tfdist_allreduce == hopt._tfdist_allreduce
    sgd = allreduce_optimizer.wrap(keras.optimizers.SGD(1.0), _Times(2))
    copy = type(sgd).from_config(sgd.get_config())
    assert (_apply(copy, 1.0) == -2.0).all()  # before the fix: AttributeError _tfdist_allreduce


def test_equal_options_share_one_class_and_names_come_from_the_class():
    a = DistributedOptimizer(keras.optimizers.SGD(0.1))
    b = DistributedOptimizer(keras.optimizers.SGD(0.2, momentum=0.9))
    assert type(a) is type(b)
    assert a._tfdist_allreduce.prefix == "DistributedSGD"  # not Keras's per-process "sgd_1"
    c = DistributedOptimizer(keras.optimizers.SGD(0.1), op="sum")
    assert type(c) is not type(a)
    assert DistributedOptimizer(keras.optimizers.SGD(0.1), "gen")._tfdist_allreduce.prefix == "gen"
    with pytest.raises(ValueError, match=r"name must be a non-empty string without '/'.*"
                                         r"Received: name='a/b'"):
        DistributedOptimizer(keras.optimizers.SGD(0.1), name="a/b")


def test_aggregated_passes_average_by_default_sum_on_request():
    from tfdist import allreduce_optimizer

    mean = allreduce_optimizer.wrap(keras.optimizers.SGD(1.0), _Times(1), 2)
    total = allreduce_optimizer.wrap(keras.optimizers.SGD(1.0), _Times(1), 2,
                                     average_passes=False)
    assert (_apply(mean, 1.0, 3.0) == -2.0).all()
    assert (_apply(total, 1.0, 3.0) == -4.0).all()


def test_load_model_restores_a_distributed_optimizer_with_its_state(tmp_path):
    import numpy as np

    from tfdist import horovod as thvd

    class TestOptimizer(keras.optimizers.RMSprop):
        pass

    # Saved with plain optimizers (loading does not need Horovod; training would).
    for opt, custom in ((keras.optimizers.SGD(0.01, momentum=0.9), {}),
                        (TestOptimizer(learning_rate=1e-4), {"custom_optimizers": [TestOptimizer]}),
                        (TestOptimizer(learning_rate=1e-4),
                         {"custom_objects": {"TestOptimizer": TestOptimizer}})):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                                  keras.layers.RepeatVector(3),
                                  keras.layers.TimeDistributed(keras.layers.Dense(3))])
        model.compile(loss="mse", optimizer=opt)
        model.train_on_batch(np.random.random((1, 3)), np.random.random((1, 3, 3)))
        path = str(tmp_path / "m.keras")
        model.save(path)
        new_opt = thvd.load_model(path, **custom).optimizer
        assert new_opt._tfdist_distributed and type(new_opt).__name__ == type(opt).__name__
        assert isinstance(new_opt, type(opt))
        assert float(new_opt.learning_rate) == pytest.approx(float(opt.learning_rate))
        assert len(new_opt.variables) == len(opt.variables) > 2
        for a, b in zip(opt.variables, new_opt.variables):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    # Plain Keras with the class in custom_objects does the same.
    model = keras.models.load_model(path, custom_objects={
        "TestOptimizer": thvd.distributed_class(TestOptimizer)})
    assert model.optimizer._tfdist_distributed


def test_loss_scale_optimizer_is_refused_with_a_hint(tmp_path):
    import numpy as np

    from tfdist import horovod as thvd

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(loss="mse", optimizer=keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1)))
    model.train_on_batch(np.ones((1, 3)), np.ones((1, 2)))
    model.save(tmp_path / "m.keras")
    with pytest.raises(ValueError, match="does not restore a LossScaleOptimizer.*HINT"):
        thvd.load_model(tmp_path / "m.keras")
