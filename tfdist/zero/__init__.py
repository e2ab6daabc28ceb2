"""Optimizer state split across data-parallel replicas (ZeRO stage 1, `--shard-optimizer-state`).

Rule: every worker all-reduces the whole gradient exactly as without
sharding, so accumulation, global-norm clipping, the loss-scale skip and the
repeated-row rule of sparse gradients see the same numbers. Each trainable
variable then has one owner (`partition.owners`: whole variables, greedy by
size, the same on every worker); only the owner holds that variable's
optimizer slots and runs the unmodified Keras update on it, and every worker
then receives the updated variable from its owner (`optimizer.shard`, with
an engine's gather). A non-owner's slot is a zero-size variable: the slot
lists keep Keras's indexing, and no worker ever holds another's state.

Modules: `partition.py` (pure: owners, byte counts, what is refused),
`optimizer.py` (the Keras optimizer class that updates owned variables only).
"""
