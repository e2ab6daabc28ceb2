"""When a ps/worker server gives up on its chief (pure timing rule)."""

from tfdist.ps.server import CHIEF_GONE_S, CHIEF_START_S, chief_gone


def test_never_seen_chief_counts_as_gone_after_the_start_bound():
    assert not chief_gone(100 + CHIEF_START_S - 0.1, 100, None)
    assert chief_gone(100 + CHIEF_START_S, 100, None)


def test_seen_chief_counts_as_gone_after_it_stops_answering():
    started, seen = 100, 103
    assert not chief_gone(seen + CHIEF_GONE_S - 0.1, started, seen)
    assert chief_gone(seen + CHIEF_GONE_S, started, seen)
    assert CHIEF_GONE_S < CHIEF_START_S  # a chief once up is missed sooner than a slow start


def test_a_pipeline_stage_waits_for_a_chief_never_seen_without_end_and_ends_soon_after_it():
    from tfdist.ps.server import STAGE_GONE_S

    assert not chief_gone(10**6, 0, None, start_s=None)  # the chief may start slowly
    assert not chief_gone(50 + STAGE_GONE_S - 0.1, 0, 50, None, STAGE_GONE_S)
    assert chief_gone(50 + STAGE_GONE_S, 0, 50, None, STAGE_GONE_S)


def test_the_finished_marker_is_named_by_the_chief_and_the_task():
    from tfdist.ps.server import finished_marker

    assert finished_marker("127.0.0.1:5000", "127.0.0.1:5001", "/d") == (
        "/d/tfdist-finished-127.0.0.1_5000-127.0.0.1_5001")
    assert finished_marker("[::1]:5000", "h/x:1", "/d") == "/d/tfdist-finished-___1__5000-h_x_1"


def test_a_chief_that_finished_writes_the_marker_by_an_op_on_the_task_device(tmp_path,
                                                                            monkeypatch):
    # The task here is this process's CPU (a stage task's device is its own host's):
    # the marker appears where the task looks; a task whose port is closed is skipped.
    import socket
    import tempfile

    from tfdist.ps import server

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        task = f"127.0.0.1:{listening.getsockname()[1]}"
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{closed.getsockname()[1]}"
        closed.close()
        told = server.tell_finished("127.0.0.1:1", [("/device:CPU:0", task),
                                                    ("/device:CPU:0", gone)])
    assert told == 1
    marker = server.finished_marker("127.0.0.1:1", task)
    assert marker.startswith(str(tmp_path)) and server._take(marker)
    assert not server._take(marker)  # taken once
    assert not server._take(server.finished_marker("127.0.0.1:1", gone))
