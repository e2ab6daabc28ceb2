"""Test worker for Horovod ranks: train like `python -m tfdist.train`, dump the result.

    horovodrun ... python tests/workers/hvd_train_dump.py DUMP_DIR [--seed-by-rank]
        [--no-allreduce] RECIPE [--key value ...]

--seed-by-rank   builds each rank's model from seed + 1000 * rank, so ranks
                 start from different weights (the broadcast must fix that).
--no-allreduce   trains with the plain optimizer (what Horovod's own Keras
                 wrapper amounts to on Keras 3): shows the equality test has teeth.

Writes DUMP_DIR/worker{RANK}.npz: initial (pre-broadcast) and final weights,
per-epoch history, per-batch learning rates, evaluation and the rank's hostname.
"""

import os
import socket
import sys

import numpy as np


def main():
    dump_dir, argv = sys.argv[1], sys.argv[2:]
    seed_by_rank = "--seed-by-rank" in argv
    no_allreduce = "--no-allreduce" in argv
    argv = [a for a in argv if a not in ("--seed-by-rank", "--no-allreduce")]

    import keras

    from tfdist import cluster, strategies
    from tfdist.run import trainer
    from tfdist.train import parse

    recipe, cfg = parse(argv)
    info = cluster.detect()
    initial = {}
    build_model = recipe.build_model

    def seeded_build_model(cfg):
        if seed_by_rank:
            keras.utils.set_random_seed(cfg["seed"] + 1000 * info.worker_index)
        model = build_model(cfg)
        initial["weights"] = model.get_weights()
        return model

    recipe.build_model = seeded_build_model
    if no_allreduce:
        strategies.Hooks.wrap_optimizer = lambda self, opt: opt
        from tfdist.strategies import horovod as hvd_adapter

        hvd_adapter.HorovodHooks.wrap_optimizer = lambda self, opt: opt

    lrs = []

    class RecordLR(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

    fit = keras.Model.fit

    def fit_recording(self, *args, callbacks=None, **kwargs):
        return fit(self, *args, callbacks=[*(callbacks or []), RecordLR()], **kwargs)

    keras.Model.fit = fit_recording
    result = trainer.train(recipe, cfg, info)
    os.makedirs(dump_dir, exist_ok=True)
    arrays = {f"w{i}": w for i, w in enumerate(result.model.get_weights())}
    arrays.update({f"init{i}": w for i, w in enumerate(initial["weights"])})
    arrays.update({f"history_{k}": np.array(v) for k, v in result.metrics["history"].items()})
    np.savez(os.path.join(dump_dir, f"worker{result.cluster.worker_index}.npz"),
             lrs=np.array(lrs), eval_loss=result.metrics["test"]["loss"],
             num_replicas=result.metrics["num_replicas"], source=info.source,
             hostname=socket.gethostname(), **arrays)


if __name__ == "__main__":
    main()
