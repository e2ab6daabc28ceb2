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
