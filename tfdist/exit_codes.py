"""Process exit statuses of `tfdist.train`, in one place (launchers and Slurm scripts read them)."""

OK = 0
FAILED = 1          # an unexpected error
CONFIG = 2          # bad flags, recipe, backup: fix the input
CLUSTER = 3         # bad TF_CONFIG / Slurm environment
PEER_LOST = 4       # another worker died or became unreachable; rerun to resume
PREEMPTED = 75      # SIGTERM: a backup was saved; rerun (requeue) to continue (EX_TEMPFAIL)
INTERRUPTED = 130    # SIGINT (Ctrl-C): a backup was saved; rerun to continue (128 + SIGINT)
