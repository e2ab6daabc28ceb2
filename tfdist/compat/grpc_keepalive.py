"""TensorFlow's gRPC channels send no keepalive pings: a call to a vanished host waits ~15 min.

No upstream TensorFlow issue found (searched tensorflow/tensorflow for a
ClusterCoordinator that hangs on an unreachable worker); the same class of
bug, fixed the same way, is ray-project/ray#44692, and gRPC's remedy is in
grpc/grpc doc/keepalive.md. TensorFlow creates its channels with gRPC's
defaults, which never ping a busy connection, so when a host's link goes down
(no TCP reset ever comes) a remote call to it stays pending until the
kernel's retransmissions give up (net.ipv4.tcp_retries2: about 15 minutes).
A parameter-server coordinator then never learns that its worker is lost:
measured with tfdist.hosts, a worker host's cable pulled after epoch 1 left
`ClusterCoordinator.join()` waiting for more than 5 minutes, no further epoch.

TensorFlow reads extra channel arguments from the environment variable
TF_GRPC_DEFAULT_OPTIONS ("name=value,..."; tensorflow/core/distributed_runtime/
rpc/grpc_channel.cc) when it opens a channel. `apply` adds keepalive pings
there, keeping any the user set: an unanswered ping closes the connection
after KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS, the pending call fails as
UNAVAILABLE, and the coordinator re-runs it on another worker (measured: the
job finished about 16 s after the pull). gRPC sends at most 2 pings while no
data flows, so a step longer than ~2 x KEEPALIVE_TIME_MS is not cut short by
them. tests/integration/test_host_faults.py pulls the cable.
"""

from __future__ import annotations

import os

VARIABLE = "TF_GRPC_DEFAULT_OPTIONS"
KEEPALIVE_TIME_MS = 5000
KEEPALIVE_TIMEOUT_MS = 5000
KEEPALIVE = {"grpc.keepalive_time_ms": str(KEEPALIVE_TIME_MS),
             "grpc.keepalive_timeout_ms": str(KEEPALIVE_TIMEOUT_MS)}


def with_keepalive(options: str | None) -> str:
    """Pure function: TF_GRPC_DEFAULT_OPTIONS `options` plus KEEPALIVE's names it lacks."""
    items = [item for item in (options or "").split(",") if item.strip()]
    present = {item.split("=", 1)[0].strip() for item in items}
    return ",".join(items + [f"{k}={v}" for k, v in KEEPALIVE.items() if k not in present])


def apply(environ=os.environ) -> None:
    """Sets TF_GRPC_DEFAULT_OPTIONS in this process, before TensorFlow opens its channels."""
    environ[VARIABLE] = with_keepalive(environ.get(VARIABLE))
