"""`Communicator`: collectives between processes on one host, through shared memory.

Why: on one machine every byte TensorFlow's gRPC ring (MultiWorkerMirrored)
or Horovod's Gloo/MPI engines move is copied through sockets or through
an engine thread that competes with the training threads for the same
cores. Here each rank's own thread does its part of the reduction straight
from and into a shared segment: per all-reduce of S bytes over n ranks a
rank writes S(n-1)/n bytes, sums S/n, and reads S(n-1)/n, the minimum a
reduce-scatter + all-gather can move, with no engine thread at all.

Layout of the segment (all offsets 64-byte aligned)::

    flags   n x 256 B       rank r's barrier counter and call records at r * 256
    sems    n x n x 64 B    sems[q][r]: rank r's arrivals at rank q's barriers
    mailbox n x n x C       mailbox[q][r]: rank r's part of block chunk q
    result  n x C           result[q]: the reduced chunk q

A tensor is processed in blocks of up to `n * C` bytes, so the working set
stays in cache; each block is split into n chunks, chunk q owned by rank q.

Synchronisation: at a barrier a rank writes its counter, posts one
process-shared POSIX semaphore per peer (sems[q][r]) and takes one from each
of its own (sems[r][q]), polling a little (a peer about to arrive costs no
system call) and then sleeping in the kernel (a slow peer costs no CPU; see
`tfdist.shm.semaphores`). Post and wait synchronise memory (POSIX), so
everything a rank wrote before its post, data and call record, is what its
peers read after their wait, on any architecture and whatever instructions
numpy's copies use. Each pair's semaphore holds at most 2: a peer can post
for the next barrier but not the one after, which needs our post.

Collectives are matched by order only, so each rank also writes a record of
the call (its number, op, root, dtype, element and tensor counts, a hash of
the shapes) beside its counter at every barrier, and checks every peer's
record once it has seen the peer's counter: ranks that disagree all raise
`CollectiveMismatchError` naming both calls at the first barrier of the call,
before any data is returned. Records alternate between two slots by barrier
parity: a peer can be at most one barrier ahead (it cannot pass the next one
without us), so the slot we read is not rewritten under us.

Small tensors are fused: each all-reduce costs two barriers per block
whatever its size, so 200 tensors of 4-64 KB would pay 400 barriers where one
tensor of the same 7 MB pays 2. Tensors smaller than `fusion_threshold_bytes`
are grouped into buckets of up to that many bytes (one dtype per bucket) and
reduced as one flat buffer, as with Horovod's HOROVOD_FUSION_THRESHOLD; unlike
Horovod's fusion buffer, the bucket is never packed: each chunk is copied
straight between the tensors and the segment (`_Concat`).

A TCP connection per rank to
rank 0 carries the rendezvous (the segment's name) and tells a waiting rank
when a peer died, so a dead peer is an error, not a hang.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import itertools
import os
import platform
import select
import socket
import struct
import threading
import time
import uuid
import zlib
from multiprocessing import shared_memory

import numpy as np

from tfdist.compat import py_resource_tracker_sigmask
from tfdist.errors import ClusterError, CollectiveMismatchError, PeerLostError
from tfdist.shm import semaphores

_ALIGN = 64
# Per rank: the barrier counter (int64 at 0), then two call records (parity slots).
_LINE = 256
_RECORD = struct.Struct("<qqqqqq16s")  # call, op, root, count, tensors, shapes hash, dtype
_SLOTS = (8, 8 + _RECORD.size)
BARRIER, SUM, MEAN, BROADCAST, SCATTER_SUM, SCATTER_MEAN, GATHER = range(7)
_OP_NAMES = {BARRIER: "barrier", SUM: "allreduce(sum)", MEAN: "allreduce(mean)",
             BROADCAST: "broadcast", SCATTER_SUM: "reduce_scatter(sum)",
             SCATTER_MEAN: "reduce_scatter(mean)", GATHER: "all_gather"}
_MAGIC = b"TFDSHM1"
# Poll a peer's semaphore this many times (~0.2-0.5 us each) before sleeping on it:
# a peer that is about to arrive costs no system call and no wake-up latency.
_SPINS = 200
_LIVENESS_EVERY_S = 0.05
DEFAULT_CHUNK_BYTES = 4 << 20
# Buckets of up to 8 MB: a few hundred 4-64 KB gradients (a real network's)
# fit one or two, so they pay 2-4 barriers instead of hundreds; past a few MB
# the 2 barriers of a tensor of its own are noise next to moving its bytes.
DEFAULT_FUSION_BYTES = 8 << 20
# Docker gives a container 64 MB of /dev/shm by default: stay well inside it by
# shrinking the chunk as ranks grow (2 ranks: 4 MB chunks, 4: 1.5 MB, 8: 448 KB).
SEGMENT_BUDGET_BYTES = 32 << 20
SHM_DIR = "/dev/shm"
_SEGMENT_PREFIX = "tfdist_"  # then the creating pid: see remove_stale_segments


def check_platform() -> None:
    """Raises ClusterError where the C library has no process-shared POSIX semaphores."""
    if not semaphores.available():
        raise ClusterError(
            f"The shared-memory engine needs process-shared POSIX semaphores from the C "
            f"library, which this {platform.system()} machine does not offer through ctypes."
            "\nHINT: use --strategy multi_worker or horovod here.")


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def segment_chunk_bytes(chunk_bytes: int, size: int,
                        budget: int = SEGMENT_BUDGET_BYTES) -> int:
    """Pure function: the chunk actually used, so that the segment fits `budget`.

    The segment holds n x n mailbox chunks and n result chunks.
    """
    fit = budget // (size * (size + 1)) // _ALIGN * _ALIGN
    return max(_ALIGN, min(_align(chunk_bytes), fit))


def fusion_buckets(tensors, threshold: int) -> list[list[int]]:
    """Pure function: how `allreduce` groups tensors, as lists of indices.

    Args:
        tensors: (dtype, nbytes) per tensor, in call order.
        threshold: Bucket capacity in bytes; a tensor of at least this many
            bytes (or any tensor, when 0) is reduced on its own.

    Returns:
        Buckets in the order they are reduced (that of their first tensor),
        each bucket's indices in call order.
    """
    by_dtype: dict = {}
    for i, (dtype, nbytes) in enumerate(tensors):
        by_dtype.setdefault(np.dtype(dtype), []).append((i, nbytes))
    buckets = []
    for items in by_dtype.values():
        current, used = [], 0
        for i, nbytes in items:
            if nbytes >= threshold or threshold <= 0:
                buckets.append([i])
                continue
            if used + nbytes > threshold:
                buckets.append(current)
                current, used = [], 0
            current.append(i)
            used += nbytes
        if current:
            buckets.append(current)
    return sorted(buckets)


def chunk_bounds(nbytes: int, itemsize: int, size: int, chunk_bytes: int):
    """Pure function: the block and chunk split of an `nbytes` buffer.

    Yields (block_start, [(chunk_start, chunk_stop) for each rank]) in
    elements, blocks of at most `size * chunk_bytes` bytes, chunks as equal
    as whole elements allow (the last ones may be empty).
    """
    count = nbytes // itemsize
    per_chunk = max(1, chunk_bytes // itemsize)
    block = per_chunk * size
    for start in range(0, count, block):
        stop = min(count, start + block)
        n = stop - start
        step = -(-n // size)
        yield start, [(start + min(n, q * step), start + min(n, (q + 1) * step))
                      for q in range(size)]


def is_floating(dtype) -> bool:
    """Pure function: True for numpy floats and bfloat16 (ml_dtypes' kind is "V", not "f")."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype.name == "bfloat16"


def accumulator_dtype(dtype):
    """Pure function: float32 for the 2-byte floats (float16, bfloat16), else None.

    Those are what gradient compression sends; summing them in their own type
    loses bits at every add and overflows float16 past 65504 before the mean
    brings the value back in range.
    """
    return np.dtype(np.float32) if is_floating(dtype) and np.dtype(dtype).itemsize == 2 else None


def _exclusive(method):
    """One collective at a time per process: a second one that starts while another
    runs (two unordered ops of one TensorFlow graph) would interleave their barriers
    and data silently; it fails instead, naming both."""
    import functools

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if not self._busy.acquire(blocking=False):
            raise CollectiveMismatchError(
                f"shared-memory engine: rank {self.rank} started {method.__name__} while "
                f"{self._running} was still running in this process: its collectives must "
                "run one after another (each op waiting for the one before it).")
        self._running = method.__name__
        try:
            return method(self, *args, **kwargs)
        finally:
            self._busy.release()

    return run


class Communicator:
    """All-reduce, broadcast and barrier between `size` processes on this host.

    Every rank constructs one with the same `address`; rank 0 listens there
    (it must be an address of this host), creates the segment and tells the
    others its name. Calls are collective: every rank makes the same calls
    in the same order.

    Args:
        rank: This process's rank, 0..size-1.
        size: Number of processes.
        address: (host, port) of rank 0's rendezvous socket.
        chunk_bytes: Bytes of each rank's chunk of a block (cache-sized).
        fusion_threshold_bytes: Tensors smaller than this are reduced
            together in buckets of up to this many bytes; 0 turns fusion off.
            The same on every rank; it may be changed between calls.
        timeout_s: How long to wait for a peer (rendezvous, or a barrier)
            before giving up with PeerLostError.
    """

    def __init__(self, rank: int, size: int, address: tuple[str, int],
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, timeout_s: float = 300.0,
                 fusion_threshold_bytes: int = DEFAULT_FUSION_BYTES):
        if not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, {size}). Received: rank={rank}.")
        check_platform()
        self.rank, self.size, self.address = rank, size, tuple(address)
        self.chunk_bytes = segment_chunk_bytes(int(chunk_bytes), size, SEGMENT_BUDGET_BYTES)
        self.timeout_s = timeout_s
        self.fusion_threshold_bytes = int(fusion_threshold_bytes)
        self.bytes_sent = 0  # all-reduce bytes this rank wrote for its peers (bench, tests)
        self._seq = 0     # barriers passed
        self._calls = 0   # collectives begun
        self._record = b""
        self._shapes: list = []
        self._failed: CollectiveMismatchError | None = None
        # The peer this communicator lost, kept as fields: an error raised inside a
        # tf.numpy_function reaches the trainer as TensorFlow's text only.
        self.lost: PeerLostError | None = None
        self._peers: dict[int, socket.socket] = {}   # rank 0: rank -> socket
        self._root: socket.socket | None = None      # others: socket to rank 0
        self._listener: socket.socket | None = None
        self._shm: shared_memory.SharedMemory | None = None
        n, c = size, self.chunk_bytes
        self._flags_off = 0
        self._sem_off = _align(n * _LINE)
        self._mail_off = self._sem_off + n * n * semaphores.SEM_BYTES
        self._result_off = self._mail_off + n * n * c
        self.nbytes = self._result_off + n * c
        if size > 1:
            self._rendezvous()
            buf = self._shm.buf
            self._lines = np.ndarray((n, _LINE), np.uint8, buf, self._flags_off)
            self._flags = np.ndarray((n, _LINE // 8), np.int64, buf, self._flags_off)
            self._mail = np.ndarray((n, n, c), np.uint8, buf, self._mail_off)
            self._result = np.ndarray((n, c), np.uint8, buf, self._result_off)
            sem = self._lines.ctypes.data + self._sem_off
            size_of = semaphores.SEM_BYTES
            self._post_to = {q: ctypes.c_void_p(sem + (q * n + rank) * size_of)
                             for q in range(n) if q != rank}
            self._recv_from = {q: ctypes.c_void_p(sem + (rank * n + q) * size_of)
                               for q in range(n) if q != rank}
        self._last_liveness = time.monotonic()
        self._busy, self._running = threading.Lock(), ""

    # -- rendezvous -----------------------------------------------------------------
    def _rendezvous(self) -> None:
        try:
            self._connect()
        except BaseException:
            if self._shm is not None:
                # Nothing left in /dev/shm by a failed start: rank 0 created the
                # segment, and a rank that got its name outlives a rank 0 that died.
                shm, self._shm = self._shm, None
                shm.close()
                if self.rank == 0:
                    with contextlib.suppress(FileNotFoundError):
                        shm.unlink()  # also tells the resource tracker
                else:
                    remove_segment(shm.name)
            self.close()
            raise

    def _connect(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        if self.rank == 0:
            remove_stale_segments()
            _check_space(self.nbytes)
            name = f"{_SEGMENT_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:12]}"
            py_resource_tracker_sigmask.ensure_running()  # the signals stay blocked
            self._shm = shared_memory.SharedMemory(name=name, create=True, size=self.nbytes)
            self._shm.buf[:self._mail_off] = bytes(self._mail_off)
            header = np.ndarray((self._mail_off,), np.uint8, self._shm.buf)
            for i in range(self.size * self.size):  # before any peer can see the name
                semaphores.init(header.ctypes.data + self._sem_off + i * semaphores.SEM_BYTES)
            del header
            try:
                self._listener = socket.create_server(self.address, reuse_port=False)
            except OSError as e:
                raise ClusterError(
                    f"shared-memory rendezvous: rank 0 cannot listen on {self.address[0]}:"
                    f"{self.address[1]} ({e.strerror or e}).\nHINT: worker 0's address in "
                    "TF_CONFIG must be a free port on this host (tfdist.launch picks one).") from None
            self._listener.settimeout(max(0.1, deadline - time.monotonic()))
            while len(self._peers) < self.size - 1:
                try:
                    conn, _ = self._listener.accept()
                except socket.timeout:
                    missing = sorted(set(range(1, self.size)) - set(self._peers))
                    raise PeerLostError(
                        f"shared-memory rendezvous: ranks {missing} did not connect to "
                        f"{self.address[0]}:{self.address[1]} within {self.timeout_s:.0f} s.",
                        rank=missing[0] if len(missing) == 1 else None)
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    magic, rank, size = struct.unpack("!7sii", _recv_exact(conn, 15))
                except (OSError, PeerLostError):
                    magic = None  # not one of ours (or it went away): ignore it
                if magic != _MAGIC or size != self.size or rank in self._peers or not 0 < rank < size:
                    conn.close()
                    continue
                self._peers[rank] = conn
            payload = name.encode()
            for conn in self._peers.values():
                conn.sendall(struct.pack("!i", len(payload)) + payload)
            for conn in self._peers.values():
                conn.settimeout(None)
        else:
            while True:
                try:
                    self._root = socket.create_connection(self.address, timeout=1.0)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise PeerLostError(
                            f"shared-memory rendezvous: rank 0 at {self.address[0]}:"
                            f"{self.address[1]} did not answer within {self.timeout_s:.0f} s.",
                            rank=0, address=f"{self.address[0]}:{self.address[1]}")
                    time.sleep(0.05)
            self._root.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                self._root.sendall(struct.pack("!7sii", _MAGIC, self.rank, self.size))
                (length,) = struct.unpack("!i", _recv_exact(self._root, 4))
                name = _recv_exact(self._root, length).decode()
            except socket.timeout:
                raise ClusterError(
                    f"shared-memory rendezvous: {self.address[0]}:{self.address[1]} accepted "
                    f"rank {self.rank}'s connection but sent no segment within "
                    f"{self.timeout_s:.0f} s: another program may hold that port, or a rank "
                    "never started.\nHINT: worker 0's address in TF_CONFIG must be a free port "
                    "on this host (tfdist.launch picks one).") from None
            self._root.settimeout(None)
            py_resource_tracker_sigmask.ensure_running()  # the signals stay blocked
            self._shm = shared_memory.SharedMemory(name=name, create=False)
            _untrack(self._shm)
        # Everyone attached: rank 0 may drop the name, the mapping lives on
        # until the last rank closes it and nothing is left behind on a crash.
        self._barrier_sockets()
        if self.rank == 0:
            self._shm.unlink()

    def _barrier_sockets(self) -> None:
        if self.rank == 0:
            for conn in self._peers.values():
                _recv_exact(conn, 1)
            for conn in self._peers.values():
                conn.sendall(b"k")
        else:
            self._root.sendall(b"k")
            _recv_exact(self._root, 1)

    # -- barrier ----------------------------------------------------------------------
    def _check_liveness(self, seq: int) -> None:
        now = time.monotonic()
        if now - self._last_liveness < _LIVENESS_EVERY_S:
            return
        self._last_liveness = now
        socks = list(self._peers.items()) if self.rank == 0 else [(0, self._root)]
        readable, _, _ = select.select([s for _, s in socks], [], [], 0)
        for rank, sock in socks:
            # A closed connection is a death only for a rank that has not reached
            # this barrier: one that passed it may have finished and exited.
            if sock in readable and not sock.recv(1, socket.MSG_PEEK) and \
                    self._flags[rank, 0] < seq:
                raise self._lose(PeerLostError(f"shared-memory engine: rank {rank} exited "
                                               "(its connection closed).", rank=rank))

    def _lose(self, error: PeerLostError) -> PeerLostError:
        """Records the first peer lost (`lost`) and returns the error to raise."""
        self.lost = self.lost or error
        return error

    @_exclusive
    def barrier(self) -> None:
        """Returns when every rank has called it."""
        if self.size == 1:
            return
        self._begin(BARRIER, 0, None, [])
        self._sync()

    def _begin(self, op: int, root: int, dtype, shapes: list, count: int = 0) -> None:
        """Starts a collective: the record every barrier of it publishes and checks."""
        if self._failed is not None:
            raise self._failed  # a mismatch leaves the ranks out of step for good
        self._calls += 1
        name = b"" if dtype is None else np.dtype(dtype).name.encode()[:16]
        shapes_hash = zlib.crc32(repr([tuple(s) for s in shapes]).encode())
        self._record = _RECORD.pack(self._calls, op, root, count, len(shapes), shapes_hash, name)
        self._shapes = shapes

    def _wait(self, q: int, sem, seq: int) -> None:
        """Takes rank q's post for barrier `seq`: polls, then sleeps in the kernel."""
        for _ in range(_SPINS):
            if semaphores.try_wait(sem):
                return
        start = time.monotonic()
        while not semaphores.wait(sem, _LIVENESS_EVERY_S):
            if time.monotonic() - start > self.timeout_s:
                raise self._lose(PeerLostError(f"shared-memory engine: rank {q} did not "
                                               f"reach barrier {seq} within "
                                               f"{self.timeout_s:.0f} s.", rank=q))
            self._check_liveness(seq)

    def _sync(self) -> None:
        """A barrier that publishes this rank's call record and checks every peer's."""
        self._seq += 1
        seq, flags, lines = self._seq, self._flags, self._lines
        slot = _SLOTS[seq & 1]
        record = self._record
        lines[self.rank, slot:slot + _RECORD.size] = np.frombuffer(record, np.uint8)
        flags[self.rank, 0] = seq  # read by _check_liveness only
        for sem in self._post_to.values():
            semaphores.post(sem)  # releases the data and record written above
        for q, sem in self._recv_from.items():
            self._wait(q, sem, seq)
        for q in range(self.size):
            if q != self.rank:
                theirs = lines[q, slot:slot + _RECORD.size].tobytes()
                if theirs != record:
                    self._failed = CollectiveMismatchError(_mismatch(
                        self.rank, record, self._shapes, q, theirs))
                    raise self._failed

    # -- collectives --------------------------------------------------------------------
    @_exclusive
    def allreduce(self, arrays, average: bool = False, out=None):
        """Sums (or averages) each array across ranks.

        Args:
            arrays: A list of numpy arrays, the same shapes and dtypes in the
                same order on every rank. They are not modified.
            average: Divide the sums by the number of ranks (floor division
                for integers).
            out: Optional list of writable C-contiguous arrays, one per input
                with its shape and dtype, to write the results into; none may
                overlap an input or another output.

        Returns:
            The list of arrays holding the reduced values (`out` when given).
        """
        arrays = [_contiguous(a) for a in arrays]
        outs = [np.empty_like(a) for a in arrays] if out is None else list(out)
        if self.size == 1:
            for a, o in zip(arrays, outs):
                np.copyto(o, a)
            return outs
        op = MEAN if average else SUM
        for bucket in fusion_buckets([(a.dtype, a.nbytes) for a in arrays],
                                     self.fusion_threshold_bytes):
            if len(bucket) == 1:
                (i,) = bucket
                self._begin(op, 0, arrays[i].dtype, [arrays[i].shape], arrays[i].size)
                self._allreduce_one(arrays[i].reshape(-1), outs[i].reshape(-1), average)
            else:
                self._allreduce_fused([arrays[i] for i in bucket], [outs[i] for i in bucket],
                                      op, average)
        return outs

    def _allreduce_fused(self, arrays, outs, op: int, average: bool) -> None:
        self._begin(op, 0, arrays[0].dtype, [a.shape for a in arrays],
                    sum(a.size for a in arrays))
        self._allreduce_one(_Concat([a.reshape(-1) for a in arrays]),
                            _Concat([o.reshape(-1) for o in outs]), average)

    def _allreduce_one(self, x, out, average: bool) -> None:
        """Reduces flat `x` into flat `out`: both ndarrays, or both `_Concat`s (a bucket)."""
        n, r, dt = self.size, self.rank, x.dtype
        mail, result = self._mail, self._result
        wide = accumulator_dtype(dt)
        scale = np.asarray(1.0 / n, dtype=wide or dt) if is_floating(dt) else None
        fused = isinstance(x, _Concat)
        if x.size == 0:
            self._sync()  # nothing to move, but the call is still checked
        for _, chunks in chunk_bounds(x.nbytes, dt.itemsize, n, self.chunk_bytes):
            # 1. hand each peer q my part of its chunk q.
            for q, (lo, hi) in enumerate(chunks):
                if q != r and hi > lo:
                    box = mail[q, r, :(hi - lo) * dt.itemsize].view(dt)
                    self.bytes_sent += box.nbytes
                    if fused:
                        x.read(lo, hi, box)
                    else:
                        box[:] = x[lo:hi]
            self._sync()
            # 2. reduce my chunk: mine + every peer's, then publish it in result[r].
            lo, hi = chunks[r]
            if hi > lo:
                k = hi - lo
                self.bytes_sent += k * dt.itemsize  # result[r], read by every peer
                if fused:  # gathered straight into result[r], reduced there
                    mine = acc = result[r, :k * dt.itemsize].view(dt)
                    x.read(lo, hi, mine)
                else:  # straight into my output; the first add reads my input in place
                    mine, acc = out[lo:hi], x[lo:hi]
                if wide is not None:
                    # 2-byte floats (compressed gradients) travel as they are but are
                    # summed and averaged in float32, rounded once at the end: n fp16
                    # gradients of 40000 average to 40000, not to an overflowed inf.
                    total = acc.astype(wide)
                    for q in range(n):
                        if q != r:
                            np.add(total, mail[r, q, :k * dt.itemsize].view(dt), out=total)
                    if average:
                        np.multiply(total, scale, out=total)
                    mine[:] = total
                else:
                    for q in range(n):
                        if q != r:
                            np.add(acc, mail[r, q, :k * dt.itemsize].view(dt), out=mine)
                            acc = mine
                    if average:
                        if scale is not None:
                            np.multiply(mine, scale, out=mine)
                        else:
                            np.floor_divide(mine, n, out=mine)
                if fused:
                    out.write(lo, hi, mine)
                else:
                    result[r, :k * dt.itemsize].view(dt)[:] = mine
            self._sync()
            # 3. read every peer's reduced chunk.
            for q, (lo, hi) in enumerate(chunks):
                if q != r and hi > lo:
                    reduced = result[q, :(hi - lo) * dt.itemsize].view(dt)
                    if fused:
                        out.write(lo, hi, reduced)
                    else:
                        out[lo:hi] = reduced
        # result[] is rewritten by the next block's step 2 only after every
        # rank passed that block's first barrier, i.e. finished this step 3. No
        # other collective writes result[] (all_gather writes its own mailbox), so
        # none may follow this one without a barrier between.

    @_exclusive
    def reduce_scatter(self, parts, out=None, average: bool = False):
        """Part r summed (or averaged) over ranks, for this rank r only.

        Each rank writes the parts its peers own into their mailboxes, read in
        place (no padding, no copy of the whole), and sums its own: half an
        all-reduce's traffic, and no rank ever holds another's sum
        (`--shard gradients`, `tfdist.zero`).

        Args:
            parts: n numpy arrays (or None for an empty one), one dtype; part q
                is this rank's contribution to rank q's result, of the same
                size on every rank (an [n, width] array is n parts).
            out: Optional writable C-contiguous array of part r's size (not
                overlapping a part) to write this rank's result into.
            average: Divide by the number of ranks (floor division for integers).

        Returns:
            This rank's reduced part, flat (`out` when given).
        """
        n, r = self.size, self.rank
        if len(parts) != n:
            raise ValueError(f"reduce_scatter needs one part per rank ({n}). Received: "
                             f"{len(parts)} parts.")
        flat = [None if p is None else _contiguous(p).reshape(-1) for p in parts]
        dtypes = {f.dtype for f in flat if f is not None}
        if len(dtypes) != 1:
            raise ValueError(f"reduce_scatter needs parts of one dtype. Received: "
                             f"{sorted(map(str, dtypes))}.")
        dt = dtypes.pop()
        sizes = [0 if f is None else f.size for f in flat]
        out = np.empty(sizes[r], dt) if out is None else out.reshape(-1)
        if n == 1:
            np.copyto(out, flat[r] if flat[r] is not None else out)
            return out
        self._begin(SCATTER_MEAN if average else SCATTER_SUM, 0, dt, [(s,) for s in sizes],
                    sum(sizes))
        wide = accumulator_dtype(dt)
        scale = np.asarray(1.0 / n, dtype=wide or dt) if is_floating(dt) else None
        mail, step = self._mail, max(1, self.chunk_bytes // dt.itemsize)
        for lo in range(0, max(1, max(sizes)), step):
            for q in range(n):  # 1. my part of every peer's result, into its mailbox
                k = min(lo + step, sizes[q]) - lo
                if q != r and k > 0:
                    mail[q, r, :k * dt.itemsize].view(dt)[:] = flat[q][lo:lo + k]
                    self.bytes_sent += k * dt.itemsize
            self._sync()
            k = min(lo + step, sizes[r]) - lo
            if k > 0:  # 2. mine: my part + every peer's (2-byte floats summed in float32)
                total = flat[r][lo:lo + k].astype(wide) if wide is not None else out[lo:lo + k]
                if wide is None:
                    np.copyto(total, flat[r][lo:lo + k])
                for q in range(n):
                    if q != r:
                        np.add(total, mail[r, q, :k * dt.itemsize].view(dt), out=total)
                if average:
                    if scale is not None:
                        np.multiply(total, scale, out=total)
                    else:
                        np.floor_divide(total, n, out=total)
                if wide is not None:
                    out[lo:lo + k] = total
            self._sync()  # the mailboxes are rewritten by the next block only after this
        return out

    @_exclusive
    def all_gather(self, part, out=None):
        """Every rank's `part` (one size and dtype on every rank), concatenated in rank
        order: the weights' gather of `--shard parameters` (`tfdist.zero.parameters`).

        Args:
            part: This rank's numpy array (read, not modified).
            out: Optional writable C-contiguous array of n times `part`'s size (not
                overlapping `part`) to write the result into.

        Returns:
            The n parts, flat (`out` when given).
        """
        n, r = self.size, self.rank
        flat = _contiguous(part).reshape(-1)
        dt, k = flat.dtype, flat.size
        out = np.empty(n * k, dt) if out is None else out.reshape(-1)
        out[r * k:(r + 1) * k] = flat
        if n == 1:
            return out
        self._begin(GATHER, 0, dt, [(k,)], k)
        # Each rank's block goes into its own mailbox, mail[r, r] (no other call uses
        # it), not into result[r]: this write comes before the first barrier, and a
        # slower peer may still be reading result[r] in the last step of the
        # allreduce before this call (an allreduce ends without a barrier). Writing
        # result[r] here once handed that peer this block in place of the sum
        # (tests/workers/shm_comm.py's stress, which now mixes every collective).
        mail, step = self._mail, max(1, self.chunk_bytes // dt.itemsize)
        for lo in range(0, max(1, k), step):
            hi = min(k, lo + step)
            if hi > lo:  # 1. my block into my own mailbox
                mail[r, r, :(hi - lo) * dt.itemsize].view(dt)[:] = flat[lo:hi]
                self.bytes_sent += (hi - lo) * dt.itemsize
            self._sync()
            for q in range(n):  # 2. every peer's block, read in place
                if q != r and hi > lo:
                    out[q * k + lo:q * k + hi] = mail[q, q, :(hi - lo) * dt.itemsize].view(dt)
            self._sync()  # mailboxes are rewritten by the next block only after this
        return out

    @_exclusive
    def broadcast(self, arrays, root: int = 0, out=None):
        """Every rank gets `root`'s arrays (same shapes and dtypes everywhere).

        Args:
            arrays: Numpy arrays; only the root's values are read.
            root: The rank whose values everyone gets.
            out: Optional writable C-contiguous arrays, one per input, to receive
                them (on the root, an output that is its input is left as is).

        Returns:
            The arrays holding `root`'s values (`out` when given).
        """
        outs = []
        for i, a in enumerate(arrays):
            a = _contiguous(a)
            if out is None:
                out_i = a.copy()
            else:
                out_i = out[i]
                if self.rank == root and out_i is not a:
                    np.copyto(out_i, a)
            if self.size > 1:
                self._begin(BROADCAST, root, a.dtype, [a.shape], a.size)
                flat, dst = a.reshape(-1), out_i.reshape(-1)
                region = self._mail.reshape(-1)
                step = max(1, region.nbytes // a.itemsize)
                for lo in range(0, max(1, flat.size), step):
                    hi = min(flat.size, lo + step)
                    view = region[:(hi - lo) * a.itemsize].view(a.dtype)
                    if self.rank == root:
                        view[:] = flat[lo:hi]
                    self._sync()
                    if self.rank != root:
                        dst[lo:hi] = view
                    self._sync()
            outs.append(out_i)
        return outs

    def close(self) -> None:
        """Detaches from the segment and closes the sockets (idempotent)."""
        for sock in [*self._peers.values(), self._root, self._listener]:
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass
        self._peers, self._root, self._listener = {}, None, None
        if self._shm is not None:
            self._flags = self._lines = self._mail = self._result = None
            try:
                self._shm.close()
            except BufferError:
                pass  # a numpy view is still alive; the mapping goes with the process
            self._shm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def describe_call(record: bytes) -> str:
    """Pure function: a call record as text, e.g. 'allreduce(sum) #3 of 8 float32 in 1 tensor'."""
    call, op, root, count, tensors, _, dtype = _RECORD.unpack(record)
    text = f"{_OP_NAMES.get(op, f'op {op}')} #{call}"
    if op == BROADCAST:
        text += f" from rank {root}"
    if op != BARRIER:
        text += (f" of {count} {dtype.rstrip(bytes(1)).decode(errors='replace')} in {tensors} "
                 f"tensor{'s' if tensors != 1 else ''}")
    return text


def _mismatch(rank: int, mine: bytes, shapes: list, peer: int, theirs: bytes) -> str:
    a, b = describe_call(mine), describe_call(theirs)
    if a == b:  # only the shapes differ
        a += f" shaped {[tuple(s) for s in shapes]}"
        b += " with other shapes"
    return (f"shared-memory engine: collective mismatch: rank {rank} called {a} but rank "
            f"{peer} called {b}.\nHINT: every rank must make the same collective calls in "
            "the same order, with the same ops, dtypes and shapes (a rank-dependent branch "
            "around an all-reduce or broadcast does this).")


class _Concat:
    """1-d arrays of one dtype seen as their concatenation, without copying them.

    A fused bucket: each block's chunks are copied straight between the
    tensors and the segment, so fusion saves barriers without adding copies.
    """

    def __init__(self, parts):
        self.parts = parts
        self.starts = list(itertools.accumulate([p.size for p in parts], initial=0))
        self.dtype = parts[0].dtype
        self.size = self.starts[-1]
        self.nbytes = self.size * self.dtype.itemsize

    def _spans(self, lo: int, hi: int):
        """(part, start in part, stop in part, offset from lo) covering elements [lo, hi)."""
        i = bisect.bisect_right(self.starts, lo) - 1
        pos = lo
        while pos < hi:
            begin, part = self.starts[i], self.parts[i]
            end = min(begin + part.size, hi)
            if end > pos:
                yield part, pos - begin, end - begin, pos - lo
                pos = end
            i += 1

    def read(self, lo: int, hi: int, dst: np.ndarray) -> None:
        """dst[:hi - lo] = self[lo:hi]."""
        for part, a, b, off in self._spans(lo, hi):
            dst[off:off + b - a] = part[a:b]

    def write(self, lo: int, hi: int, src: np.ndarray) -> None:
        """self[lo:hi] = src[:hi - lo]."""
        for part, a, b, off in self._spans(lo, hi):
            part[a:b] = src[off:off + b - a]


def disjoint(arrays) -> bool:
    """True when no two arrays' memory overlaps (checked by address ranges)."""
    spans = sorted((a.__array_interface__["data"][0], a.nbytes) for a in arrays if a.nbytes)
    return all(start + size <= nxt for (start, size), (nxt, _) in zip(spans, spans[1:]))


def _contiguous(a) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array (a scalar variable) into 1-d.
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy()


def _check_space(nbytes: int) -> None:
    # tmpfs accepts a segment larger than its free space and then kills the
    # process with SIGBUS when a page cannot be backed: check first.
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return  # no /dev/shm to inspect (not Linux): let SharedMemory decide
    free = stat.f_bavail * stat.f_frsize
    if free < nbytes:
        raise ClusterError(
            f"The shared-memory engine needs {nbytes / 2**20:.1f} MiB in {SHM_DIR}, which has "
            f"{free / 2**20:.1f} MiB free.\nHINT: give the container more (docker run "
            "--shm-size=256m) or pass a smaller chunk_bytes.")


def remove_segment(name: str) -> bool:
    """Unlinks /dev/shm/NAME if it is still there; True when it was."""
    try:
        os.remove(os.path.join(SHM_DIR, name))
        return True
    except FileNotFoundError:
        return False


def remove_stale_segments() -> list[str]:
    """Unlinks the segments whose creator (the pid in their name) has exited.

    A rank 0 killed during the rendezvous (its process group killed, say)
    leaves its segment, and no other rank knows its name; the next job's
    rank 0 removes it here.
    """
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(_SEGMENT_PREFIX):
            continue
        try:
            os.kill(int(name[len(_SEGMENT_PREFIX):].split("_")[0]), 0)
        except ProcessLookupError:
            if remove_segment(name):
                removed.append(name)
        except (ValueError, OSError):
            continue  # not our name format, or a process we may not signal: alive
    return removed


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise PeerLostError("shared-memory engine: a peer closed its connection.")
        data += part
    return data


def _untrack(shm: shared_memory.SharedMemory) -> None:
    # Python's resource tracker would unlink an attached (not created) segment
    # when this process exits (cpython#82300); rank 0 owns the name.
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001
    except Exception:  # pragma: no cover - tracker internals differ
        pass
