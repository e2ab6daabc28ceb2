"""The keepalive options tfdist gives TensorFlow's gRPC channels (tfdist.compat.grpc_keepalive).

What they fix (a parameter-server coordinator that waits ~15 minutes on a
worker whose host's cable was pulled) is shown with real hosts by
tests/integration/test_host_faults.py.
"""

from tfdist.compat import grpc_keepalive


def test_keepalive_added_when_unset():
    assert grpc_keepalive.with_keepalive(None) == (
        "grpc.keepalive_time_ms=5000,grpc.keepalive_timeout_ms=5000")


def test_users_own_options_and_values_are_kept():
    got = grpc_keepalive.with_keepalive(
        "grpc.keepalive_time_ms=60000,grpc.max_reconnect_backoff_ms=500")
    assert got == ("grpc.keepalive_time_ms=60000,grpc.max_reconnect_backoff_ms=500,"
                   "grpc.keepalive_timeout_ms=5000")


def test_apply_sets_the_variable_idempotently():
    env = {}
    grpc_keepalive.apply(env)
    grpc_keepalive.apply(env)
    assert env == {"TF_GRPC_DEFAULT_OPTIONS":
                   "grpc.keepalive_time_ms=5000,grpc.keepalive_timeout_ms=5000"}
