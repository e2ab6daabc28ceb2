"""Test worker: hvd_checks.py's checks, then collectives_checks.py's on Horovod, in one job.

    horovodrun -np 2 -H localhost:2 --gloo python tests/workers/hvd_checks_then_collectives.py

Each horovodrun start costs seconds (TensorFlow imported by the launcher and
every rank), so tests/integration/test_horovod.py runs both sets of checks in
one job and asserts each set in a test of its own. Every check prints
`CHECK <name> ok rank=<r>` or `CHECK <name> FAIL`; the exit status is 1 when
a check of either set failed.
"""

import os
import sys

import hvd_checks  # noqa: E402 - this script's folder is on sys.path; it starts Horovod

failed = hvd_checks.main()
sys.argv[1:] = ["horovod"]  # collectives_checks reads its engine at import
import collectives_checks  # noqa: E402

_exit = os._exit
os._exit = lambda code: _exit(code or failed)  # collectives_checks ends with os._exit
collectives_checks.main()
