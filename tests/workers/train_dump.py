"""Test worker: trains like `python -m tfdist.train`, then dumps what it ended with.

    python tests/workers/train_dump.py DUMP_DIR [FAULT OPTIONS] RECIPE [--key value ...]

Writes DUMP_DIR/worker{INDEX}.npz with the final weights, the host name, the test-set
predictions and the evaluation, so tests can compare strategies and workers.
The dump dir is the test's, never the model dir (which only the chief writes).

Fault options (real faults, for the fault-tolerance tests):
    --step-delay-ms MS       sleep after each step, so a test can act mid-epoch
    --kill-worker I --kill-at-step N --marker PATH
                             worker I SIGKILLs itself after its Nth step of this
                             process, once: PATH records that it happened.
    --fail-start-worker I    once PATH exists, worker I exits 1 at start: a worker
                             that cannot come back (its host is gone).
    --say-first-step 1       print "FIRST STEP done" after this process's first step,
                             so a test can time a recovery to the training again.
"""

import os
import signal
import socket
import sys
import time

import numpy as np

FAULT_FLAGS = {"--step-delay-ms": float, "--kill-worker": int, "--kill-at-step": int,
               "--marker": str, "--fail-start-worker": int, "--say-first-step": int}


def _fault_callback(opts, worker_index):
    import keras

    class Fault(keras.callbacks.Callback):
        steps = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.steps == 1 and opts.get("--say-first-step"):
                print(f"FIRST STEP done by worker {worker_index}", flush=True)
            if opts.get("--step-delay-ms"):
                time.sleep(opts["--step-delay-ms"] / 1000)
            marker = opts.get("--marker")
            if (opts.get("--kill-worker") == worker_index and self.steps == opts["--kill-at-step"]
                    and marker and not os.path.exists(marker)):
                open(marker, "w").close()
                print(f"FAULT: worker {worker_index} SIGKILLs itself at step {self.steps}",
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    return Fault()


def main():
    dump_dir, argv = sys.argv[1], sys.argv[2:]
    opts = {}
    while argv and argv[0] in FAULT_FLAGS:
        opts[argv[0]] = FAULT_FLAGS[argv[0]](argv[1])
        argv = argv[2:]
    from tfdist import cluster, data
    from tfdist.run import trainer
    from tfdist.train import parse

    recipe, cfg = parse(argv)
    info = cluster.detect()
    if (opts.get("--fail-start-worker") == info.worker_index and info.num_workers > 1
            and os.path.exists(opts.get("--marker", ""))):
        print(f"FAULT: worker {info.worker_index} cannot start", file=sys.stderr, flush=True)
        sys.exit(1)
    try:
        result = trainer.train(recipe, cfg, info, callbacks=[_fault_callback(opts, info.worker_index)])
    except Exception as e:
        # Same statuses and messages as `python -m tfdist.train`.
        from tfdist import exit_codes
        from tfdist.errors import ConfigError, PeerLostError

        print(f"error: {e}", file=sys.stderr, flush=True)
        if isinstance(e, trainer.Preempted):
            sys.exit(exit_codes.INTERRUPTED if e.interrupted else exit_codes.PREEMPTED)
        if isinstance(e, PeerLostError):
            from tfdist.train import exit_now

            exit_now(exit_codes.PEER_LOST)
        if isinstance(e, ConfigError):
            sys.exit(exit_codes.CONFIG)
        raise
    test = data.prepare(recipe.build_dataset(cfg, "test"), cfg["global_batch_size"],
                        num_workers=result.cluster.num_workers, training=False)
    preds = result.model.predict(test.map(lambda x, *rest: x), verbose=0)
    ev = result.model.evaluate(test, verbose=0, return_dict=True)
    accuracy = ev.get("accuracy", ev.get("token_accuracy", np.nan))  # the recipe's metric
    os.makedirs(dump_dir, exist_ok=True)
    # The plain model's weights: a tensor-parallel layer's shards gathered.
    from tfdist.model_parallel import surgery

    unsplit = getattr(result.model, "unsplit", None)
    plain = surgery.gather_model(unsplit()) if unsplit else result.model
    from tfdist.zero import parameters

    # --shard parameters: each split weight gathered whole (every worker, in one order).
    arrays = {f"w{i}": (v.numpy() if parameters.rows_of(v) is None
                        else v._tfdist_split.gather(v)) for i, v in enumerate(plain.weights)}
    np.savez(os.path.join(dump_dir, f"worker{result.cluster.worker_index}.npz"),
             predictions=preds, eval_loss=ev["loss"], eval_accuracy=accuracy,
             num_replicas=result.strategy.num_replicas_in_sync, hostname=socket.gethostname(),
             **arrays)


if __name__ == "__main__":
    main()
