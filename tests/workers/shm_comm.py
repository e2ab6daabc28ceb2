"""One rank of a shared-memory Communicator scenario (numpy only, no TensorFlow).

    python shm_comm.py SCENARIO RANK SIZE PORT OUT_DIR

Scenarios:
    collectives: allreduce (sum and mean) of mixed arrays, a broadcast and
        reduce_scatters (sum and mean)
        from the last rank; writes OUT_DIR/rank{R}.npz with inputs and outputs.
    die: rank 1 exits right after the rendezvous; the others wait in a
        barrier and print the error they get.
    alone: only rank 0 is started (short timeout); prints the error.
    barrier: one barrier.
    mismatch: rank 0 all-reduces 8 float32 while rank 1 all-reduces 2 float64;
        each rank prints the error it gets and how long after the call.
    stopped: rank 1 stops itself (SIGSTOP) between two barriers; rank 0 prints
        the wall and CPU seconds its second barrier took (the test sends SIGCONT).
    stress: thousands of random collectives (ops, dtypes, sizes, tensor counts
        drawn from one seed shared by all ranks), each result checked bitwise
        against numpy; prints the count checked.
"""

import os
import resource
import signal
import sys
import time

import numpy as np

from tfdist.errors import CollectiveMismatchError, PeerLostError
from tfdist.shm.comm import Communicator

STRESS_CALLS = {2: 1500, 3: 500}  # 3 ranks share 2 cores on the test machine
# Every collective follows every other: a rank that leaves one early must not write
# what a slower peer of the same call still reads (an all_gather after an allreduce did).
STRESS_OPS = ["sum", "mean", "broadcast", "scatter", "gather"]
STRESS_DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8]


def inputs(rank):
    rng = np.random.default_rng(rank)
    return {
        "f32_big": rng.normal(size=(300, 77)).astype(np.float32),   # several blocks
        "f64": rng.normal(size=(5, 3)),
        "f16": rng.normal(size=(33,)).astype(np.float16),
        "i32": rng.integers(-100, 100, size=(1001,)).astype(np.int32),
        "scalar": np.array(rank + 1.5, np.float32),                     # 0-d stays 0-d
        "empty": np.zeros((0, 4), np.float32),
        "tiny": np.array([rank], np.int64),                             # fewer elements than ranks
    }


def stress_call(i, size):
    """The i-th random collective: (op, root, per-rank input lists); the same on every rank.

    Floats are small multiples of 1/4, so sums are exact in any order and
    the engine must match numpy bit for bit.
    """
    rng = np.random.default_rng([1234, i])
    op = STRESS_OPS[rng.integers(len(STRESS_OPS))]
    root = int(rng.integers(size))
    big = rng.random() < 0.05
    specs = []
    if op in ("scatter", "gather"):  # one dtype: n parts (scatter) or one part (gather)
        dtype = STRESS_DTYPES[rng.integers(len(STRESS_DTYPES))]
        gather_count = int(rng.integers(0, 3000 if big else 70))
        for _ in range(size if op == "scatter" else 1):
            count = int(rng.integers(0, 3000 if big else 70)) if op == "scatter" \
                else gather_count
            specs.append((dtype, (count,)))
    for _ in range(0 if specs else int(rng.integers(1, 5))):
        dtype = STRESS_DTYPES[rng.integers(len(STRESS_DTYPES))]
        count = int(rng.integers(0, 3000 if big else 70))
        shape = (count,) if rng.random() < 0.5 or count == 0 else (1, count)
        specs.append((dtype, shape))
    per_rank = []
    for r in range(size):
        data = np.random.default_rng([99, i, r])
        xs = []
        for dtype, shape in specs:
            if np.dtype(dtype).kind == "f":
                xs.append((data.integers(-16, 17, shape) / 4).astype(dtype))
            elif dtype is np.uint8:
                xs.append(data.integers(0, 256 // size, shape).astype(dtype))
            else:
                xs.append(data.integers(-1000, 1000, shape).astype(dtype))
        per_rank.append(xs)
    return op, root, per_rank


def stress_expected(op, root, per_rank, size, rank):
    """What numpy says each collective returns (to `rank`)."""
    if op == "broadcast":
        return per_rank[root]
    if op == "gather":
        return [np.concatenate([xs[0] for xs in per_rank])]
    if op == "scatter":  # rank's part, summed
        return _sums([[xs[rank]] for xs in per_rank], "sum", size)
    return _sums(per_rank, op, size)


def _sums(per_rank, op, size):
    out = []
    for parts in zip(*per_rank):
        total = parts[0].copy()
        for p in parts[1:]:
            total = total + p
        dtype = parts[0].dtype
        if dtype == np.float16:  # the engine sums and averages 2-byte floats in float32
            total = total.astype(np.float32)
            if op == "mean":
                total = total * np.float32(1.0 / size)
            out.append(total.astype(dtype))
            continue
        total = total.astype(dtype)
        if op == "mean":
            total = (total * np.asarray(1.0 / size, total.dtype) if total.dtype.kind == "f"
                     else total // size)
        out.append(total)
    return out


def run_stress(comm, rank, size, calls):
    for i in range(calls):
        op, root, per_rank = stress_call(i, size)
        mine = per_rank[rank]
        if op == "broadcast":
            got = comm.broadcast(mine, root=root)
        elif op == "gather":
            got = [comm.all_gather(mine[0])]
        elif op == "scatter":
            got = [comm.reduce_scatter(mine)]
        else:
            got = comm.allreduce(mine, average=op == "mean")
        want = stress_expected(op, root, per_rank, size, rank)
        for k, (g, w) in enumerate(zip(got, want)):
            if g.dtype != w.dtype or g.shape != w.shape or g.tobytes() != w.tobytes():
                raise AssertionError(f"call {i} ({op}) tensor {k}: got {g!r}, want {w!r}")
    return calls


def main():
    scenario, rank, size, port, out = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    timeout = 2.0 if scenario == "alone" else 60.0
    try:
        # A 4 KiB chunk forces multi-block reductions on modest arrays.
        # Stress: tensors under 2 KB are fused, larger ones go alone, so both paths run.
        comm = Communicator(rank, size, ("127.0.0.1", port), chunk_bytes=4096,
                            timeout_s=timeout,
                            fusion_threshold_bytes=2048 if scenario == "stress" else 1 << 20)
        if scenario == "collectives":
            x = inputs(rank)
            names = sorted(x)
            before = {k: v.copy() for k, v in x.items()}
            total = comm.allreduce([x[k] for k in names])
            mean = comm.allreduce([x[k] for k in names], average=True)
            bcast = comm.broadcast([x[k] for k in names], root=size - 1)
            # reduce_scatter: rows of several blocks (4 KiB chunks), float32 and int32.
            rows = {k: x[k].reshape(-1)[:size * (x[k].size // size)].reshape(size, -1)
                    for k in ("f32_big", "i32", "f16")}
            for k, v in rows.items():
                result_rs = comm.reduce_scatter(v)
                result_rsm = comm.reduce_scatter(v, average=True)
                x[f"rs_{k}"], x[f"rsm_{k}"] = result_rs, result_rsm
            # Uneven parts, read in place, one of them empty (None): rank 1 gets nothing.
            uneven = [None if q == 1 else x["f32_big"].reshape(-1)[:3000 * (q + 1)]
                      for q in range(size)]
            x["rs_uneven"] = comm.reduce_scatter(uneven)
            # all_gather: every rank's part (several 4 KiB blocks), in rank order.
            x["ag"] = comm.all_gather(x["f32_big"].reshape(-1)[:2500] + rank)
            unchanged = all(np.array_equal(before[k], x[k]) for k in names)
            result = {"unchanged": np.array(unchanged)}
            for k, t, m, b in zip(names, total, mean, bcast):
                result[f"sum_{k}"], result[f"mean_{k}"], result[f"bcast_{k}"] = t, m, b
            for k in rows:
                result[f"rs_{k}"], result[f"rsm_{k}"] = x[f"rs_{k}"], x[f"rsm_{k}"]
            result["rs_uneven"] = x["rs_uneven"]
            result["ag"] = x["ag"]
            np.savez(os.path.join(out, f"rank{rank}.npz"), **result)
        elif scenario == "barrier":
            comm.barrier()
        elif scenario == "stopped":
            comm.barrier()
            if rank == 1:
                os.kill(os.getpid(), signal.SIGSTOP)
                comm.barrier()
            else:
                usage = resource.getrusage(resource.RUSAGE_SELF)
                cpu, wall = usage.ru_utime + usage.ru_stime, time.monotonic()
                comm.barrier()
                usage = resource.getrusage(resource.RUSAGE_SELF)
                print(f"waited {time.monotonic() - wall:.3f} s wall, "
                      f"{usage.ru_utime + usage.ru_stime - cpu:.3f} s CPU", flush=True)
        elif scenario == "mismatch":
            comm.barrier()
            x = np.ones(8, np.float32) if rank == 0 else np.ones(2, np.float64)
            start = time.monotonic()
            try:
                got = comm.allreduce([x])
                print(f"NO ERROR: got {got}", flush=True)
                return 0
            except CollectiveMismatchError as e:
                print(f"CollectiveMismatchError after {time.monotonic() - start:.3f} s: {e}",
                      flush=True)
            try:  # the communicator stays refused, even for a matching call
                comm.barrier()
                print("SECOND CALL PASSED", flush=True)
            except CollectiveMismatchError:
                pass
            return 5
        elif scenario == "stress":
            start = time.monotonic()
            n = run_stress(comm, rank, size, STRESS_CALLS[size])
            print(f"checked {n} collectives in {time.monotonic() - start:.1f} s, "
                  f"{comm._seq} barriers", flush=True)
        elif scenario == "wide":
            import ml_dtypes

            # fp16 values whose sum overflows float16, and bf16 halves a floor would drop.
            f16 = np.full(5, 40000.0 + rank, np.float16)
            bf16 = np.array([1.5, 2.5, -0.75], ml_dtypes.bfloat16)
            mean16, meanb = comm.allreduce([f16, bf16], average=True)
            (sum16,) = comm.allreduce([f16])
            np.savez(os.path.join(out, f"rank{rank}.npz"), mean16=mean16, sum16=sum16,
                     meanb=meanb.astype(np.float32), meanb_dtype=np.array(str(meanb.dtype)))
        elif scenario == "die":
            if rank == 1:
                os._exit(0)
            start = time.monotonic()
            comm.barrier()
            print("NO ERROR")
        comm.close()
    except PeerLostError as e:
        print(f"PeerLostError after {time.monotonic() - start if scenario == 'die' else 0:.1f} s: {e}",
              flush=True)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
