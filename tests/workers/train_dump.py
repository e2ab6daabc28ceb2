"""Test worker: trains like `python -m tfdist.train`, then dumps what it ended with.

    python tests/workers/train_dump.py DUMP_DIR RECIPE [--key value ...]

Writes DUMP_DIR/worker{INDEX}.npz with the final weights, the test-set
predictions and the evaluation, so tests can compare strategies and workers.
The dump dir is the test's, never the model dir (which only the chief writes).
"""

import os
import sys

import numpy as np


def main():
    dump_dir, argv = sys.argv[1], sys.argv[2:]
    from tfdist import cluster, data, trainer
    from tfdist.train import parse

    recipe, cfg = parse(argv)
    result = trainer.train(recipe, cfg, cluster.detect())
    test = data.prepare(recipe.build_dataset(cfg, "test"), cfg["global_batch_size"],
                        num_workers=result.cluster.num_workers, training=False)
    preds = result.model.predict(test.map(lambda x, y: x), verbose=0)
    ev = result.model.evaluate(test, verbose=0, return_dict=True)
    os.makedirs(dump_dir, exist_ok=True)
    arrays = {f"w{i}": w for i, w in enumerate(result.model.get_weights())}
    np.savez(os.path.join(dump_dir, f"worker{result.cluster.worker_index}.npz"),
             predictions=preds, eval_loss=ev["loss"], eval_accuracy=ev["accuracy"],
             num_replicas=result.strategy.num_replicas_in_sync, **arrays)


if __name__ == "__main__":
    main()
