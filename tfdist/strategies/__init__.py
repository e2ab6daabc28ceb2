"""Strategy adapters ("how to train"), one class per file, behind `build_strategy`.

Each adapter is a subclass of `Adapter` registered by class (`@register`):
it declares its name, the strategy-specific options it accepts, the general
options it cannot honour, its pre-TensorFlow checks, its loop kind, and how
it builds its `tf.distribute.Strategy` and its trainer `Hooks`. The run
pipeline (`tfdist.run.trainer`) asks the adapter and names no strategy.

Adapter modules import no TensorFlow and no engine (Horovod, the shared-memory
engine) at module level, so registering them all costs nothing and choosing
one never imports the others' dependencies.
"""

from __future__ import annotations

# The package's parts, one job each; their names are the package's API.
from tfdist.strategies.options import ADAPTER_OPTIONS, StrategyOptions
from tfdist.strategies.hooks import Hooks, ProcessReplicaHooks
from tfdist.strategies.adapter import (ALIASES, REGISTRY, Adapter, has_ps_tasks, register,
                                       together_names)
from tfdist.strategies.registry import (Choice, accepting, adapter_class, build, build_hooks,
                                        build_strategy, check_available, check_name, choose,
                                        possible_names, refusal, refused_by, resolve_name,
                                        valid_names)

__all__ = ["ADAPTER_OPTIONS", "ALIASES", "Adapter", "Choice", "REGISTRY", "Hooks",
           "ProcessReplicaHooks", "StrategyOptions", "accepting", "adapter_class", "build",
           "build_hooks", "build_strategy", "check_available", "check_name", "choose",
           "has_ps_tasks", "together_names",
           "possible_names", "refusal", "refused_by", "register", "resolve_name", "valid_names"]

# Importing the adapters registers them (in this order, the order `valid_names` lists).
from tfdist.strategies import (  # noqa: E402,F401  (after Adapter and Hooks exist)
    single, mirrored, multi_worker, model_parallel, pipeline, horovod, shm, parameter_server)
