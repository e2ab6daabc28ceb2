"""The shared-memory Communicator: its arithmetic and real multi-process collectives."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import WORKERS, clean_env
from tests.workers.shm_comm import STRESS_CALLS, inputs
from tfdist.launch import free_ports
from tfdist.errors import ClusterError
from tfdist.shm import comm as comm_lib
from tfdist.shm.comm import (Communicator, chunk_bounds, disjoint, fusion_buckets,
                             segment_chunk_bytes)

WORKER = os.path.join(WORKERS, "shm_comm.py")


@pytest.mark.parametrize("count,size,chunk", [(10, 2, 8), (1001, 3, 64), (1, 4, 4),
                                              (0, 2, 8), (4096, 2, 4096)])
def test_chunk_bounds_cover_every_element_once(count, size, chunk):
    seen = []
    for start, chunks in chunk_bounds(count * 4, 4, size, chunk):
        assert len(chunks) == size and chunks[0][0] == start
        for lo, hi in chunks:
            assert lo <= hi and hi - lo <= max(1, chunk // 4)
            seen.extend(range(lo, hi))
    assert seen == list(range(count))


def test_segment_stays_inside_its_budget():
    assert segment_chunk_bytes(4 << 20, 2) == 4 << 20
    for size in (2, 4, 8, 64):
        chunk = segment_chunk_bytes(4 << 20, size)
        assert chunk % 64 == 0 and size * (size + 1) * chunk <= comm_lib.SEGMENT_BUDGET_BYTES
    assert segment_chunk_bytes(100, 2) == 128  # aligned up to a cache line


def test_fusion_buckets_pack_small_tensors_by_dtype_in_order():
    f32, f64 = np.float32, np.float64
    tensors = [(f32, 400), (f64, 100), (f32, 700), (f32, 1000), (f32, 50), (f64, 5000),
               (f64, 0)]
    # 1000 bytes is no longer small; 400 + 700 overflow a bucket; float64s fuse apart.
    assert fusion_buckets(tensors, 1000) == [[0], [1, 6], [2, 4], [3], [5]]
    assert fusion_buckets(tensors, 1200) == [[0, 2], [1, 6], [3, 4], [5]]
    assert fusion_buckets(tensors, 0) == [[i] for i in range(7)]
    assert fusion_buckets([], 1000) == []


def test_disjoint():
    a = np.zeros(10)
    assert disjoint([a[:5], a[5:], np.zeros(3)])
    assert not disjoint([a[:6], a[5:]])
    assert disjoint([a[:0], a[:0]])  # empty arrays overlap nothing


def test_too_little_shared_memory_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(comm_lib, "SHM_DIR", "/dev/shm")
    free = os.statvfs("/dev/shm")
    monkeypatch.setattr(comm_lib, "SEGMENT_BUDGET_BYTES", 1 << 62)
    too_big = (free.f_bavail * free.f_frsize) // 6 + (1 << 30)
    with pytest.raises(ClusterError, match="MiB free.*\n.*--shm-size"):
        Communicator(0, 2, ("127.0.0.1", free_ports(1)[0]), chunk_bytes=too_big, timeout_s=5)


def test_bad_rank_is_refused():
    with pytest.raises(ValueError, match="rank must be in"):
        Communicator(2, 2, ("127.0.0.1", 1))


def test_one_rank_needs_no_peer():
    with Communicator(0, 1, ("127.0.0.1", 0)) as comm:
        x = np.arange(5, dtype=np.float32)
        (y,) = comm.allreduce([x], average=True)
        np.testing.assert_array_equal(y, x)
        assert y is not x


def _start(scenario, size, out, ranks=None):
    port = free_ports(1)[0]
    return [subprocess.Popen([sys.executable, WORKER, scenario, str(r), str(size), str(port),
                              str(out)], env=clean_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
            for r in (ranks if ranks is not None else range(size))]


def _segments(procs=None):
    # Segments are named after rank 0's pid: only ours count (other tests may run beside).
    found = set(glob.glob("/dev/shm/tfdist_*"))
    if procs is not None:
        found = {f for f in found if int(f.split("_")[1]) in {p.pid for p in procs}}
    return found


@pytest.mark.integration
@pytest.mark.parametrize("size", [2, 3])
def test_collectives_match_numpy(tmp_path, size):
    procs = _start("collectives", size, tmp_path)
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * size, outs
    xs = [inputs(r) for r in range(size)]
    first = dict(np.load(tmp_path / "rank0.npz"))
    for r in range(size):
        got = dict(np.load(tmp_path / f"rank{r}.npz"))
        assert bool(got["unchanged"]), "allreduce modified its input"
        for k in xs[0]:
            want = sum(x[k] for x in xs)
            assert got[f"sum_{k}"].shape == xs[0][k].shape and got[f"sum_{k}"].dtype == want.dtype
            tol = dict(rtol=1e-3, atol=1e-2) if k == "f16" else dict(rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(got[f"sum_{k}"], want, **tol)
            if want.dtype.kind == "f":
                np.testing.assert_allclose(got[f"mean_{k}"], want / size, **tol)
            else:  # integer mean: floor division, as the dtype can hold
                np.testing.assert_array_equal(got[f"mean_{k}"], want // size)
            np.testing.assert_array_equal(got[f"bcast_{k}"], xs[size - 1][k])
            # Each chunk is reduced once and shared: every rank gets the same bits.
            np.testing.assert_array_equal(got[f"sum_{k}"], first[f"sum_{k}"])
        # reduce_scatter: rank r gets row r of the sum (and of the mean), its shape only.
        for k in ("f32_big", "i32", "f16"):
            rows = [x[k].reshape(-1)[:size * (x[k].size // size)].reshape(size, -1) for x in xs]
            want = sum(rows)[r]
            tol = dict(rtol=1e-3, atol=1e-2) if k == "f16" else dict(rtol=1e-6, atol=1e-6)
            assert got[f"rs_{k}"].shape == want.shape and got[f"rs_{k}"].dtype == want.dtype
            np.testing.assert_allclose(got[f"rs_{k}"], want, **tol)
            if k == "i32":
                np.testing.assert_array_equal(got[f"rsm_{k}"], want // size)
            else:
                np.testing.assert_allclose(got[f"rsm_{k}"], want / size, **tol)
        # Uneven parts (several blocks each), read in place; rank 1's is empty.
        want = 0 if r == 1 else sum(x["f32_big"].reshape(-1)[:3000 * (r + 1)] for x in xs)
        assert got["rs_uneven"].shape == ((0,) if r == 1 else (3000 * (r + 1),))
        np.testing.assert_allclose(got["rs_uneven"], want, rtol=1e-6, atol=1e-6)
        # all_gather: rank q's part (its f32_big[:2500] + q) at [q*2500, (q+1)*2500).
        np.testing.assert_array_equal(
            got["ag"], np.concatenate([x["f32_big"].reshape(-1)[:2500] + q
                                       for q, x in enumerate(xs)]))
    # rank 0 unlinks the segment's name once everyone attached: nothing left behind.
    assert _segments(procs) == set()


@pytest.mark.integration
def test_two_byte_floats_are_reduced_in_float32(tmp_path):
    procs = _start("wide", 2, tmp_path)
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for r in range(2):
        got = np.load(tmp_path / f"rank{r}.npz")
        # 40000 + 40001 overflows float16 (inf); summed in float32 the mean is in range.
        assert got["mean16"].dtype == np.float16
        np.testing.assert_array_equal(got["mean16"], np.float16(40000.5))
        assert np.isinf(got["sum16"]).all()  # the sum itself does not fit: inf, as numpy's
        # bfloat16 (numpy kind "V") is averaged as a float, not floor-divided.
        assert str(got["meanb_dtype"]) == "bfloat16"
        np.testing.assert_array_equal(got["meanb"], [1.5, 2.5, -0.75])


@pytest.mark.integration
def test_dead_peer_is_an_error_not_a_hang(tmp_path):
    procs = _start("die", 2, tmp_path)
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert procs[0].returncode == 4, outs[0]
    assert "PeerLostError" in outs[0] and "rank 1 exited" in outs[0]


@pytest.mark.integration
def test_missing_peer_times_out_naming_it(tmp_path):
    (proc,) = _start("alone", 2, tmp_path, ranks=[0])
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 4, out
    assert "ranks [1] did not connect" in out
    assert _segments([proc]) == set() and "leaked shared_memory" not in out


@pytest.mark.integration
def test_stray_connection_to_the_rendezvous_is_ignored(tmp_path):
    import socket
    import threading

    port, errors = free_ports(1)[0], []

    def rank0():
        try:
            with Communicator(0, 2, ("127.0.0.1", port), timeout_s=20) as c0:
                c0.barrier()
        except Exception as e:  # reported by the assertion below
            errors.append(e)

    t = threading.Thread(target=rank0)
    t.start()
    for _ in range(200):  # the stray client arrives first, while rank 0 waits for ranks
        try:
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"hi\n")  # shorter than a rank's hello, then gone
            break
        except OSError:
            threading.Event().wait(0.05)
    else:
        raise AssertionError("rank 0 never listened")
    rank1 = subprocess.run([sys.executable, WORKER, "barrier", "1", "2", str(port), str(tmp_path)],
                           env=clean_env(), capture_output=True, text=True, timeout=30)
    t.join(timeout=30)
    assert rank1.returncode == 0 and not errors and not t.is_alive(), (rank1.stdout, errors)


@pytest.mark.integration
def test_port_in_use_is_a_clear_error():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        before = _segments()
        with pytest.raises(ClusterError, match=r"cannot listen on 127.0.0.1:(.|\n)*HINT"):
            Communicator(0, 2, busy.getsockname(), timeout_s=5)
        assert _segments() == before  # the segment it made is gone again


@pytest.mark.integration
def test_mismatched_collectives_fail_on_every_rank_naming_both_calls(tmp_path):
    # The scenario: without the call records both ranks got wrong numbers.
    procs = _start("mismatch", 2, tmp_path)
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [5, 5], outs
    for out in outs:
        assert "NO ERROR" not in out and "SECOND CALL PASSED" not in out, out
        assert "allreduce(sum) #2 of 8 float32 in 1 tensor" in out, out
        assert "allreduce(sum) #2 of 2 float64 in 1 tensor" in out, out
        seconds = float(out.split("CollectiveMismatchError after ")[1].split(" s")[0])
        assert seconds < 1.0, out
    assert "rank 0 called allreduce(sum) #2 of 8 float32" in outs[0]
    assert "rank 1 called allreduce(sum) #2 of 2 float64" in outs[1]


def test_call_records_name_the_call():
    rec = comm_lib._RECORD.pack(3, comm_lib.BROADCAST, 2, 10, 2, 0, b"int32")
    assert comm_lib.describe_call(rec) == "broadcast #3 from rank 2 of 10 int32 in 2 tensors"
    rec = comm_lib._RECORD.pack(7, comm_lib.BARRIER, 0, 0, 0, 0, b"")
    assert comm_lib.describe_call(rec) == "barrier #7"


@pytest.mark.integration
@pytest.mark.parametrize("size", [2, 3])
def test_random_collectives_match_numpy_bitwise(tmp_path, size):
    procs = _start("stress", size, tmp_path)
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * size, outs
    for out in outs:
        assert f"checked {STRESS_CALLS[size]} collectives" in out, out


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


@pytest.mark.integration
def test_waiting_for_a_stopped_peer_sleeps(tmp_path):
    # Before the semaphores a rank polled, then slept 20 us at a time: 0.32-0.37 s of
    # CPU for this 2 s wait. Now it sleeps in the kernel, waking 20 times a second.
    import signal
    import time

    procs = _start("stopped", 2, tmp_path)
    try:
        for _ in range(600):
            if _state(procs[1].pid) == "T":
                break
            time.sleep(0.05)
        else:
            raise AssertionError("rank 1 never stopped itself")
        time.sleep(2.0)
    finally:
        procs[1].send_signal(signal.SIGCONT)
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    wall, cpu = (float(w) for w in re.findall(r"waited ([\d.]+) s wall, ([\d.]+) s CPU",
                                              outs[0])[0])
    assert wall >= 1.9, outs[0]  # it really waited for the stopped peer
    assert cpu < 0.1, outs[0]
