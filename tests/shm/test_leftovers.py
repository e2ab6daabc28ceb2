"""Segments left by a killed rank 0 are removed by the next start (issue 19)."""

import os
import subprocess

import pytest

from tfdist.shm import comm


@pytest.mark.integration
def test_stale_segments_of_exited_creators_are_removed():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"tfdist_{dead.pid}_deadbeef0000"
    live = f"tfdist_{os.getpid()}_alive0000000"
    for name in (stale, live):
        with open(os.path.join(comm.SHM_DIR, name), "wb") as f:
            f.write(b"\0" * 64)
    try:
        removed = comm.remove_stale_segments()
        assert stale in removed and live not in removed
        assert not os.path.exists(os.path.join(comm.SHM_DIR, stale))
        assert os.path.exists(os.path.join(comm.SHM_DIR, live))
    finally:
        for name in (stale, live):
            comm.remove_segment(name)


def test_a_silent_program_on_the_rendezvous_port_is_a_cluster_error_naming_it():
    import socket

    import pytest

    from tfdist.errors import ClusterError

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen(4)  # accepts, never answers
    port = squatter.getsockname()[1]
    try:
        with pytest.raises(ClusterError, match=f"127.0.0.1:{port} accepted rank 1's connection "
                                               "but sent no segment within 2 s"):
            comm.Communicator(1, 2, ("127.0.0.1", port), timeout_s=2)
    finally:
        squatter.close()
