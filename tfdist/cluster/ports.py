"""Ports for the tasks of a Slurm job step (pure functions, no environment).

Each task of a step listens on one port of its node; every task computes all
of them from the same variables, so they must be a function of the step
alone. In order of preference:

1. Slurm's own reservation (`MpiParams=ports=...` in slurm.conf, or
   `srun --resv-ports`): SLURM_STEP_RESV_PORTS, which slurmctld keeps
   disjoint for every step running on a node. Only this can guarantee that no
   other step anywhere holds the ports.
2. TFDIST_PORT_BASE: the user's first port (range-checked).
3. Derived from SLURM_JOB_ID and SLURM_STEP_ID: a block of SPAN ports in
   11264-31743, below the Linux ephemeral range (32768-60999, where the
   kernel hands out ports to any program's outgoing connections). Blocks
   differ for the steps of one job whose ids differ mod STEP_SLOTS (concurrent
   steps 0-3), and for every step of jobs whose ids are less than JOB_SLOTS
   apart.
"""

from __future__ import annotations

import re

PORT_MIN = 11264
SPAN = 20  # ports per step and node, so at most 20 tasks per node
STEP_SLOTS = 4
JOB_SLOTS = 256
EPHEMERAL = (32768, 60999)  # Linux's default net.ipv4.ip_local_port_range
LOWEST = 1024  # below: privileged ports
_RANGE = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?", re.ASCII)

assert PORT_MIN + JOB_SLOTS * STEP_SLOTS * SPAN <= EPHEMERAL[0]  # the whole block is below


def derived_base(job_id: int, step_id: int) -> int:
    """First port of a step's block, from its job and step ids."""
    slot = (job_id % JOB_SLOTS) * STEP_SLOTS + step_id % STEP_SLOTS
    return PORT_MIN + slot * SPAN


def check_base(base: int, tasks_per_node: int) -> str | None:
    """Why `base .. base + tasks_per_node - 1` cannot be used, or None."""
    if base < LOWEST or base + tasks_per_node - 1 > 65535:
        return (f"ports {base}-{base + tasks_per_node - 1} are needed for {tasks_per_node} "
                f"task(s) per node, but ports must be in {LOWEST}-65535")
    return None


def parse_port_list(text: str) -> list[int]:
    """Ports of a Slurm port list such as '12000-12003' or '12000,12005-12006'.

    Raises:
        ValueError: for anything else, or a port outside 1-65535.
    """
    ports: list[int] = []
    for item in text.strip().split(","):
        m = _RANGE.fullmatch(item.strip())
        if not m:
            raise ValueError(f"bad entry {item[:20]!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if not 0 < lo <= hi <= 65535:
            raise ValueError(f"bad port range {item!r}")
        ports.extend(range(lo, hi + 1))
    return ports
