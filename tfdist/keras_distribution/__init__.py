"""Keras 3's own distribution API (`keras.distribution`) on TensorFlow, run by tfdist's engines.

After `import tfdist`, a script written for `keras.distribution` works on the
TensorFlow backend:

    import tfdist  # noqa: F401
    import keras

    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=keras.distribution.list_devices()))
    model = ...; model.compile(...); model.fit(dataset)

* `backend`: the functions Keras calls on its backend (`list_devices`,
  `initialize`, `num_processes`, `process_id`, ...).
* `engine`: what a Distribution becomes (mirrored, multi_worker, or a split model).
* `layouts`: a LayoutMap read as tensor-parallel layers, or refused (pure).
* `split`: the tensor-parallel copy a ModelParallel model trains as.

`tfdist.compat.keras_tf_distribution` joins them to Keras (the upstream gap);
docs/keras_distribution.md shows what maps to what.
"""


class _Hooks:
    """What `tfdist.compat.keras_tf_distribution` calls: the engine and the split model."""

    @staticmethod
    def on_set(distribution):
        from tfdist.keras_distribution import engine

        engine.on_set(distribution)

    @staticmethod
    def distribute_dataset(distribution, dataset, keras_part):
        from tfdist.keras_distribution import engine

        return engine.distribute_dataset(distribution, dataset, keras_part)

    @staticmethod
    def splits(distribution):
        from tfdist.keras_distribution import engine

        return engine.is_split(distribution)

    @staticmethod
    def run(model, method, original, args, kwargs):
        from tfdist.keras_distribution import split

        return split.run(model, method, original, args, kwargs)


def install() -> None:
    """Gives `keras.distribution` its TensorFlow backend (Keras must be importable)."""
    from tfdist.compat import keras_tf_distribution
    from tfdist.keras_distribution import backend

    keras_tf_distribution.install({n: getattr(backend, n) for n in backend.NAMES}, _Hooks)
    from tfdist.cluster import detect_console
    from tfdist.compat import tf_startup_logs

    with tf_startup_logs.filtered_stderr(not detect_console().tf_logs):
        import tensorflow as tf

        tf.config.list_physical_devices()  # platform start-up, its noise hidden (the cuInit line)
    from tfdist.cluster import local_devices_requested

    if local_devices_requested():  # split the CPU now, before any op starts the runtime
        backend.configure_runtime()


def install_on_import() -> None:
    """`install()` now if Keras is imported, else right after it is: what `import tfdist` does."""
    from tfdist.compat import keras_tf_distribution

    keras_tf_distribution.when_keras_imported(install)
