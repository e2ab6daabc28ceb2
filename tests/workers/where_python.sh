#!/bin/sh
# PYTHON for a batch script: says where this task runs (hostname, network namespace,
# Slurm's step node list), then runs $REAL_PYTHON with the same arguments.
echo "where: rank=${SLURM_PROCID:-?} host=$(hostname) netns=$(readlink /proc/self/ns/net)" \
     "step_nodes=${SLURM_STEP_NODELIST:-?}"
exec "$REAL_PYTHON" "$@"
