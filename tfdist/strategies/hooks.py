"""What a strategy adapter may change in the training loop (`Hooks`), and the hooks
of engines that run one replica per process (`ProcessReplicaHooks`)."""

from __future__ import annotations


class Hooks:
    """What an adapter may change in the trainer; these defaults change nothing.

    An adapter whose `hooks()` changes something returns a subclass (Horovod
    does: its replicas are processes TensorFlow never sees).

    Attributes:
        placed_backups: Each process holding variables writes them into the
            backup itself, and resumes read them there (`tfdist.backup_parts`):
            for variables living in processes other than the chief's.
    """

    placed_backups = False

    def num_replicas(self, strategy) -> int:
        """Replicas that share each global batch."""
        return strategy.num_replicas_in_sync

    def layout(self) -> dict:
        """Fields the run's first line adds after num_replicas (e.g. stages, copies)."""
        return {}

    def input_shard(self) -> tuple[int, int] | None:
        """(num_shards, index) when this process must read only its shard."""
        return None

    def wrap_optimizer(self, optimizer):
        """The optimizer to compile with."""
        return optimizer

    def collectives(self, strategy):
        """The job's `tfdist.collectives.HostCollectives` (one per run, built on first use)."""
        if getattr(self, "_collectives", None) is None:
            self._collectives = self._make_collectives(strategy)
        return self._collectives

    def _make_collectives(self, strategy):
        """The strategy's own processes' collectives (MultiWorkerMirrored's, or one process)."""
        from tfdist import collectives

        return collectives.for_strategy(strategy)

    def any_worker(self, strategy, flag: bool) -> bool:
        """True on every process when `flag` is True on any (preemption agreement)."""
        return self.collectives(strategy).any_true(flag)

    def lost_peer(self, strategy, error: BaseException):
        """The `PeerLostError` (with rank) that `error` means, when the engine can tell; else None."""
        return self.collectives(strategy).lost_peer(error)

    def compile_kwargs(self) -> dict:
        """Extra `model.compile` arguments the adapter needs (e.g. no XLA)."""
        return {}

    def build_model(self, build):
        """The recipe's model: `build()`, in the strategy's scope.

        An adapter that places each weight itself (pipeline stages in processes
        of their own) builds it without values, so this process never holds
        the whole model.
        """
        return build()

    def transform_model(self, model, global_batch_size: int = 0):
        """The model to train, from the recipe's (model parallelism splits it).

        Args:
            model: The recipe's built model.
            global_batch_size: Examples a step, all replicas (0: not known); a
                pipeline's planner measures a micro-batch of it.
        """
        return model

    def split_model(self, model) -> None:
        """Splits the built model's weights across the workers, in place, before the
        optimizer is built (`--shard parameters`, `tfdist.zero.parameters`); by default
        every worker keeps every weight."""

    def callbacks(self, learning_rate: float, warmup_epochs: float = 0.0,
                  global_batch_size: int = 0) -> list:
        """Extra Keras callbacks for `fit`, run before the trainer's own.

        Args:
            learning_rate: The run's (scaled) learning rate.
            warmup_epochs: --warmup-epochs (engines with one replica per process).
            global_batch_size: Examples per step, all replicas (0: not known).
        """
        return []


class ProcessReplicaHooks(Hooks):
    """Hooks of engines with one replica per process that TensorFlow never sees.

    Horovod and shm: the cluster's workers are the replicas, each reads its
    shard, the optimizer allreduces, and the callbacks (written once, on the
    engine's host collectives) broadcast rank 0's state, average metrics and
    (with --warmup-epochs) ramp the learning rate from lr/size. Subclasses
    supply `_distributed`, `_all_true` and `_engine_collectives`.
    """

    def __init__(self, cluster, grad_compression: str = "none",
                 shard: str = "none"):
        self.cluster = cluster
        self.grad_compression = grad_compression
        self.shard = shard

    def num_replicas(self, strategy) -> int:
        return self.cluster.num_workers

    def input_shard(self):
        return (self.cluster.num_workers, self.cluster.worker_index)

    def wrap_optimizer(self, optimizer):
        from tfdist import allreduce_optimizer

        distributed = allreduce_optimizer.with_compression(self._distributed(optimizer),
                                                           self.grad_compression)
        if self.shard == "parameters":
            from tfdist.zero import split_optimizer

            distributed = split_optimizer.optimizer(distributed, self._scatter_engine(),
                                                    self.cluster.worker_index,
                                                    self.cluster.num_workers)
        elif self.shard != "none":
            from tfdist.zero.optimizer import shard

            # Compressed gradients keep the all-reduce (`--shard optimizer` only).
            engine = self._scatter_engine() if self.grad_compression == "none" else None
            distributed = shard(distributed, self._owner_gather(), self.cluster.worker_index,
                                self.cluster.num_workers, level=self.shard, engine=engine)
        return allreduce_optimizer.loss_scale_if_float16(distributed, self._all_true)

    def split_model(self, model) -> None:
        if self.shard == "parameters":
            from tfdist.zero import parameters

            parameters.shard_model(model, self._scatter_engine(), self.cluster.worker_index,
                                   self.cluster.num_workers, self.collectives(None))

    def callbacks(self, learning_rate, warmup_epochs=0.0, global_batch_size=0):
        # Broadcast first (no other callback may see a rank's own init), then metrics.
        from tfdist.collectives import keras_callbacks

        engine = lambda: self.collectives(None)  # noqa: E731
        out = [keras_callbacks.BroadcastInitialState(engine, root=0),
               keras_callbacks.MetricAverage(engine)]
        if warmup_epochs:
            # Goyal et al.'s ramp (the callback needs Horovod only when no size is given).
            from tfdist.horovod.lr_callbacks import LearningRateWarmup

            size = self.cluster.num_workers
            out.append(LearningRateWarmup(learning_rate / size, warmup_epochs, size=size))
        return out

    def _distributed(self, optimizer):  # pragma: no cover - interface
        """The engine's DistributedOptimizer around `optimizer`."""
        raise NotImplementedError

    def _all_true(self, flag):  # pragma: no cover - interface
        """True on every rank when the scalar boolean tensor `flag` is True on all."""
        raise NotImplementedError

    def _owner_gather(self):  # pragma: no cover - interface
        """The engine's hashable `gather(variables, owners, rank)` (`tfdist.zero.optimizer`)."""
        raise NotImplementedError

    def _scatter_engine(self):  # pragma: no cover - interface
        """The engine's hashable collectives for `tfdist.zero.scatter.owned_sums`."""
        raise NotImplementedError

    def _make_collectives(self, strategy):
        return self._engine_collectives()

    def _engine_collectives(self):  # pragma: no cover - interface
        """The engine's `tfdist.collectives.HostCollectives`."""
        raise NotImplementedError
