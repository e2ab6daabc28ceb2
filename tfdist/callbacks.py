"""Keras callbacks tfdist adds to `fit`: backups, preemption, chief-only logs.

Keras 3's own ModelCheckpoint, BackupAndRestore, TensorBoard and CSVLogger
write on every worker; these write through the chief-only, atomic paths of
`tfdist.checkpoint`.
"""

from __future__ import annotations

import csv
import io

from tfdist.checkpoint import BackupStore, TrainState
from tfdist.writer import ChiefWriter


def _keras_callback():
    import keras

    return keras.callbacks.Callback


def make_backup_callback(store: BackupStore, state: TrainState, meta: dict, *,
                         steps_per_epoch: int, save_every_steps: int = 0,
                         watcher=None, agree=None, check_every: int = 1):
    """A callback that keeps `state` current and saves backups.

    Saves at every epoch end, every `save_every_steps` steps (0: never
    mid-epoch), and when preemption is agreed (then it stops training and sets
    `callback.preempted`).

    Args:
        store: Where backups go (the chief writes).
        state: Mutated in place as training advances.
        meta: Run identity recorded in each backup.
        steps_per_epoch: Steps in one full epoch.
        save_every_steps: Mid-epoch backup period in steps.
        watcher: A PreemptionWatcher, or None.
        agree: `agree(flag) -> bool`, True on all workers if any is flagged.
        check_every: Steps between preemption agreements.
    """
    base = _keras_callback()

    class BackupCallback(base):
        def __init__(self):
            super().__init__()
            self.preempted = False
            self.last_path = None

        def _save(self):
            self.last_path = store.save(state, self.model.variables,
                                        self.model.optimizer.variables, meta) or self.last_path

        def on_train_batch_end(self, batch, logs=None):
            state.global_step += 1
            state.step_in_epoch += 1
            if watcher is not None and state.global_step % check_every == 0:
                if (agree or (lambda f: f))(watcher.requested):
                    self.preempted = True
                    self._save()
                    self.model.stop_training = True
                    return
            if (save_every_steps and state.global_step % save_every_steps == 0
                    and state.step_in_epoch < steps_per_epoch):
                self._save()

        def on_epoch_end(self, epoch, logs=None):
            if self.preempted or state.step_in_epoch < steps_per_epoch:
                return  # stopped mid-epoch: the epoch is not complete
            for key, value in (logs or {}).items():
                state.history.setdefault(key, []).append(float(value))
            state.epoch += 1
            state.step_in_epoch = 0
            self._save()

    return BackupCallback()


def make_progress_bar(total_epochs: int, steps_per_epoch: int = 0, global_batch_size: int = 0,
                      interval_s: float | None = None):
    """Keras's progress bar, numbering epochs out of the run's `total_epochs`, and
    with verbose 2 (a pipe or a file) a progress line during each epoch.

    A run resumed mid-epoch finishes that epoch in a `fit` of its own
    (`epochs=E + 1`), which Keras's own bar shows as "Epoch E+1/E+1"; this
    one shows "Epoch E+1/TOTAL". Passed to `fit`, it replaces Keras's bar;
    with `verbose=0` it prints nothing, as Keras's would. With `verbose=2`,
    where Keras prints one line per epoch, it also prints a `tfdist.progress`
    line every `interval_s` seconds during an epoch (None: TFDIST_PROGRESS_S,
    30 s by default; 0: none); `steps_per_epoch` 0 leaves them out.
    """
    import keras

    from tfdist import progress

    if interval_s is None:
        from tfdist.cluster import detect_console

        interval_s = detect_console().progress_s
    ticker = (progress.Ticker(total_epochs, steps_per_epoch, global_batch_size, interval_s)
              if steps_per_epoch and interval_s else None)
    lines = progress.make_callback(ticker) if ticker else None

    class RunProgbarLogger(keras.callbacks.ProgbarLogger):
        def set_params(self, params):
            super().set_params({**params, "epochs": total_epochs})
            if lines is not None:
                lines.set_params(params)

        def on_epoch_begin(self, epoch, logs=None):
            super().on_epoch_begin(epoch, logs)
            if lines is not None and self.verbose == 2:
                lines.on_epoch_begin(epoch, logs)

        def on_train_batch_end(self, batch, logs=None):
            super().on_train_batch_end(batch, logs)
            if lines is not None and self.verbose == 2:
                lines.on_train_batch_end(batch, logs)

    return RunProgbarLogger()


def make_csv_logger(writer: ChiefWriter, state: TrainState, name: str = "history.csv"):
    """CSV of the per-epoch history, rewritten atomically each epoch by `writer` (chief only)."""
    base = _keras_callback()

    class CSVHistory(base):
        def on_epoch_end(self, epoch, logs=None):
            if not state.history:
                return
            keys = sorted(state.history)
            buf = io.StringIO()
            rows = csv.writer(buf)
            rows.writerow(["epoch", *keys])
            for i in range(len(state.history[keys[0]])):
                rows.writerow([i, *(state.history[k][i] for k in keys)])
            writer.write_text(name, buf.getvalue())

    return CSVHistory()


def make_tensorboard(writer: ChiefWriter, name: str = "logs"):
    """Keras's TensorBoard callback logging to `writer`'s MODEL_DIR/logs on the chief; None elsewhere."""
    log_dir = writer.log_dir(name)
    if log_dir is None:
        return None
    import keras

    return keras.callbacks.TensorBoard(log_dir=log_dir)
