"""One rank of a shared-memory Communicator scenario (numpy only, no TensorFlow).

    python shm_comm.py SCENARIO RANK SIZE PORT OUT_DIR

Scenarios:
    collectives: allreduce (sum and mean) of mixed arrays and a broadcast
        from the last rank; writes OUT_DIR/rank{R}.npz with inputs and outputs.
    die: rank 1 exits right after the rendezvous; the others wait in a
        barrier and print the error they get.
    alone: only rank 0 is started (short timeout); prints the error.
    barrier: one barrier.
"""

import os
import sys
import time

import numpy as np

from tfdist.errors import PeerLostError
from tfdist.shm.comm import Communicator


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


def main():
    scenario, rank, size, port, out = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    timeout = 2.0 if scenario == "alone" else 60.0
    try:
        # A 4 KiB chunk forces multi-block reductions on modest arrays.
        comm = Communicator(rank, size, ("127.0.0.1", port), chunk_bytes=4096,
                            timeout_s=timeout)
        if scenario == "collectives":
            x = inputs(rank)
            names = sorted(x)
            before = {k: v.copy() for k, v in x.items()}
            total = comm.allreduce([x[k] for k in names])
            mean = comm.allreduce([x[k] for k in names], average=True)
            bcast = comm.broadcast([x[k] for k in names], root=size - 1)
            unchanged = all(np.array_equal(before[k], x[k]) for k in names)
            result = {"unchanged": np.array(unchanged)}
            for k, t, m, b in zip(names, total, mean, bcast):
                result[f"sum_{k}"], result[f"mean_{k}"], result[f"bcast_{k}"] = t, m, b
            np.savez(os.path.join(out, f"rank{rank}.npz"), **result)
        elif scenario == "barrier":
            comm.barrier()
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
