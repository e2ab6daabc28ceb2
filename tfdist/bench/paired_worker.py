"""`python -m tfdist.bench.paired_worker SPEC_JSON RECIPE [--key value ...]`: tfdist vs raw in one process.

`bench overhead --compare segments`. Separate runs of tfdist and of the raw
baseline differ by more than the 2% to be resolved: each process gets its own
thread placement, allocator state and compiled step, and 12 rounds of
separate runs spread 0.88-1.12 in tfdist/raw. Here the same worker processes
do both, taking turns: `tfdist.train`'s trainer runs its `fit` on the main
thread and the raw baseline (`tfdist.bench.raw_keras`: the recipe's model,
plain SGD, Keras `fit` on the same engine) runs its own `fit` on a second
thread; every `segment_steps` steps each side hands the turn to the other
and waits. Whatever slows the process slows both alike.

Both sides pause and resume the same way, inside a callback of their own
long-running `fit`: a `fit` nested in the other's callback would make the
outer one pay a slow first step after every turn that the inner one does not
(about 1.5x a steady step). Each segment is timed on rank 0 from the moment its
side got the turn to the end of its last step, so everything in a side's
step cycle (for tfdist its callbacks, the periodic preemption agreement) is
in it. Only one side runs at a time, so their collectives never interleave;
every rank takes the turns at the same steps. The segments holding the
first `warmup_segments` of each side (tracing) are not counted.

With `spec["control"]` (the `raw_vs_raw` variant) the main thread runs a
second raw `fit` instead of the trainer: an A/A control whose ratio is the
benchmark's own bias (main thread against second, first turn against second).

The raw side uses the engine instance the trainer built (MultiWorkerMirrored
cannot be built twice in a process), so it does not see how the engine was
configured (e.g. the collective timeout); `--compare runs` does.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

# A side that does not get the turn back within this long has failed (the other side's
# error is raised on its own thread; this one then stops waiting).
TURN_TIMEOUT_S = 600.0


def segment_times(stamps: list[float], starts: list[float], k: int,
                  warmup: int = 1) -> list[float]:
    """Pure function: seconds per step of each segment after the `warmup` first ones.

    Args:
        stamps: The end of every step of one side (k per segment).
        starts: When that side got the turn for each segment after the first.
        k: Steps per segment.
        warmup: Segments not counted (>= 1: the first has no turn start).
    """
    out = []
    for j, start in enumerate(starts, start=1):
        end_index = (j + 1) * k - 1
        if j >= warmup and end_index < len(stamps):
            out.append((stamps[end_index] - start) / k)
    return out


class Turns:
    """Whose turn it is ("tfdist" or "raw"), handed between two threads."""

    def __init__(self):
        self._cond = threading.Condition()
        self._turn = "tfdist"
        self.error: BaseException | None = None

    def hand_to(self, side: str) -> None:
        with self._cond:
            self._turn = side
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self.error = error
            self._cond.notify_all()

    def wait_for(self, side: str, timeout_s: float = TURN_TIMEOUT_S) -> None:
        """Blocks until it is `side`'s turn.

        Raises:
            RuntimeError: when the other side failed or kept the turn past `timeout_s`.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._turn == side or self.error, timeout_s):
                raise RuntimeError(f"the other side of the paired benchmark kept the turn for "
                                   f"more than {timeout_s:g} s")
            if self.error is not None and self._turn != side:
                raise RuntimeError(f"the other side of the paired benchmark failed: "
                                   f"{type(self.error).__name__}: {self.error}") from self.error


def side_callback(name: str, other: str, turns: Turns, k: int, total_steps: int):
    """A callback that stamps `name`'s steps and hands the turn to `other` every k steps."""
    import keras

    class Side(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.stamps: list[float] = []
            self.starts: list[float] = []
            self.on_first_turn = None  # called once, before the first hand-over

        def on_train_batch_end(self, batch, logs=None):
            self.stamps.append(time.perf_counter())
            n = len(self.stamps)
            if n % k:
                return
            if n == total_steps and name == "raw":
                return  # handed over at the end of fit: see on_train_end
            if self.on_first_turn is not None:
                self.on_first_turn()
                self.on_first_turn = None
            turns.hand_to(other)
            turns.wait_for(name)
            self.starts.append(time.perf_counter())

        def on_train_end(self, logs=None):
            # Only now: the end of raw's fit reads its metrics across the workers, and
            # those collectives must not interleave with tfdist's. (With the hand-over at
            # raw's last step instead, one of the first paired runs failed in a
            # CollectiveReduceV2.)
            if name == "raw":
                turns.hand_to(other)

    return Side()


def paired(spec: dict, engine: str, total_steps: int):
    """(tfdist's callback, raw's callback, a list that holds raw's thread once started)."""
    from tfdist.bench import raw_keras

    k = spec["segment_steps"]
    turns = Turns()
    tfdist_side = side_callback("tfdist", "raw", turns, k, total_steps)
    raw_side = side_callback("raw", "tfdist", turns, k, total_steps)
    thread = []

    def start_raw():
        # Built on the main thread, under the strategy the trainer built, at its first turn.
        tf_config = json.loads(os.environ.get("TF_CONFIG", "null"))
        eng = raw_keras.attach(engine, tfdist_side.model.distribute_strategy, tf_config)
        model, ds = raw_keras.build(spec, engine, eng)

        def fit():
            try:
                turns.wait_for("raw")
                model.fit(ds, epochs=1, steps_per_epoch=total_steps, verbose=0, shuffle=False,
                          callbacks=[*eng.callbacks, raw_side])
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                turns.fail(e)

        thread.append(threading.Thread(target=fit, name="raw-fit", daemon=True))
        thread[0].start()

    tfdist_side.on_first_turn = start_raw
    return tfdist_side, raw_side, thread


def main(spec: dict, argv: list[str]) -> int:
    from tfdist import cluster, train
    from tfdist.run import trainer
    from tfdist.bench import raw_keras, runs

    from tfdist.settings import Settings

    recipe, cfg = train.parse(argv)
    settings = Settings.of(cfg)
    info = cluster.detect()
    engine = raw_keras.resolve_engine({**spec, "engine": settings.strategy}, info.tf_config)
    epochs = settings.training.epochs
    k, total = spec["segment_steps"], settings.training.steps_per_epoch
    if k < 2 or total < 2 * k or total % k or epochs != 1:
        raise SystemExit(f"error: the paired benchmark needs --epochs 1 and --steps-per-epoch a "
                         f"multiple (>= 2) of segment_steps >= 2. Received: --epochs "
                         f"{epochs} --steps-per-epoch {total}, segment_steps {k}.")
    tfdist_side, raw_side, thread = paired(spec, engine, total)
    if spec.get("control"):  # the A/A control: the raw baseline in the trainer's place
        raw_keras.fit_by_hand(spec, engine, total, tfdist_side)
    else:
        trainer.train(recipe, cfg, info, callbacks=[tfdist_side])
    for t in thread:
        t.join()
    if info.is_chief:
        w = spec.get("warmup_segments", 1)
        step_s = {"tfdist": segment_times(tfdist_side.stamps, tfdist_side.starts, k, w),
                  "raw": segment_times(raw_side.stamps, raw_side.starts, k, w)}
        gbs = spec["global_batch_size"]
        runs.emit({"engine": engine, "segment_steps": k, "segments": len(step_s["raw"]),
                   "tfdist_step_s": step_s["tfdist"], "raw_step_s": step_s["raw"],
                   "examples_per_s": {n: gbs * len(v) / sum(v) for n, v in step_s.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1]), sys.argv[2:]))
