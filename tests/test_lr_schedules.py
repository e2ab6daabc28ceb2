"""Warmup and inverse-sqrt (Noam) schedules: the pure formula and the Keras object."""

import pytest

from tfdist import lr_schedules
from tfdist.errors import ConfigError


def test_linear_warmup_then_constant():
    got = [lr_schedules.lr_at(s, 0.4, warmup_steps=4) for s in range(6)]
    assert got == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])


def test_inverse_sqrt_peaks_at_warmup_and_decays():
    lrs = [lr_schedules.lr_at(s, 1.0, warmup_steps=4, decay="inverse_sqrt") for s in range(16)]
    assert lrs[3] == pytest.approx(1.0) and max(lrs) == pytest.approx(1.0)
    assert lrs[15] == pytest.approx((4 / 16) ** 0.5)  # step 16: sqrt(warmup/step)
    assert all(a > b for a, b in zip(lrs[4:], lrs[5:]))


def test_keras_schedule_matches_formula():
    import numpy as np

    sched = lr_schedules.make_schedule(0.5, 10, "noam")
    got = [float(np.asarray(sched(s))) for s in range(30)]
    want = [lr_schedules.lr_at(s, 0.5, 10, "noam") for s in range(30)]
    assert got == pytest.approx(want, rel=1e-6)
    assert lr_schedules.make_schedule(0.5, 0, "constant") == 0.5
    assert type(sched).from_config(sched.get_config()).warmup_steps == 10


@pytest.mark.parametrize("decay, warmup, message", [
    ("cosine", 0, r"Unknown lr schedule 'cosine'; valid: \['constant', 'inverse_sqrt', 'noam'\]"),
    ("inverse_sqrt", 0, r"needs --warmup-steps > 0"),
    ("constant", -1, r"warmup_steps must be >= 0. Received: -1"),
])
def test_bad_schedule(decay, warmup, message):
    with pytest.raises(ConfigError, match=message):
        lr_schedules.check(decay, warmup)
