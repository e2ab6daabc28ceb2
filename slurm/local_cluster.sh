#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for tests and for trying the batch scripts.
#
#   slurm/local_cluster.sh install   # apt-get Debian's slurm-wlm + munge (skipped when present)
#   slurm/local_cluster.sh start     # write slurm.conf, start munged, slurmctld, slurmd; wait for idle
#   slurm/local_cluster.sh status    # exit 0 when the node answers and is usable
#   slurm/local_cluster.sh stop      # stop the daemons this script started
#
# Runs as root (as in a container): SlurmUser=root, no cgroups (proctrack/linuxproc,
# task/none), no accounting database. The node is this host with all its CPUs, in one
# partition `local` with OverSubscribe=YES so that `sbatch --oversubscribe` lets two
# jobs share the CPUs (tests run two jobs at once on a 2-core machine).
# It writes /etc/slurm/slurm.conf (the path every Slurm command reads by default) and
# refuses to overwrite one it did not write. State and logs: $TFDIST_SLURM_DIR
# (default /var/lib/tfdist-slurm): slurmctld.log and slurmd.log are there when a job
# does not start.
set -euo pipefail

STATE=${TFDIST_SLURM_DIR:-/var/lib/tfdist-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by tfdist slurm/local_cluster.sh"
PARTITION=local

die() { echo "local_cluster: $*" >&2; exit 1; }
say() { echo "local_cluster: $*"; }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (it installs packages and runs slurmd as root)"; }

installed() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
              && command -v sbatch >/dev/null && command -v munged >/dev/null; }

cmd_install() {
    if installed; then say "slurm and munge already installed ($(slurmd -V))"; return; fi
    need_root
    # Debian's maintainer scripts try to start the daemons; there is no init system in a
    # container, and `start` runs them with our config instead, so forbid it during install.
    local policy=/usr/sbin/policy-rc.d ours=0
    if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; ours=1; fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge >/dev/null
    [ "$ours" = 1 ] && rm -f "$policy"
    installed || die "install finished but slurmctld/slurmd/sbatch/munged are missing"
    say "installed $(slurmd -V)"
}

write_conf() {
    local host cpus
    host=$(hostname -s); cpus=$(nproc)
    if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
        die "$CONF exists and was not written by this script; move it away to use the local cluster"
    fi
    mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d"
    cat >"$CONF" <<EOF
$MARK: a one-node cluster on $host
ClusterName=tfdist-local
# Loopback only: the daemons and the jobs talk over 127.0.0.1 whatever the host name.
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire also delays a requeued job's restart (default 120 s); tests requeue.
AuthInfo=cred_expire=10
# No cgroups in a container: track processes by parent pid, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# Cores are the consumable resource; memory is not (tests must not fight over it).
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Requeue (scontrol requeue, --requeue) is what preempted tfdist jobs use.
JobRequeue=1
ReturnToService=2
MpiDefault=none
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# Finished jobs stay visible to scontrol for 5 minutes (tests read their exit codes).
MinJobAge=300
# Short timeouts: one node on loopback.
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

start_munge() {
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chmod 0400 /etc/munge/munge.key; chmod 0700 /etc/munge
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    # --force: munged refuses some root-owned layouts by default; this is a private test box.
    munged --force
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
    die "munged did not start (see /var/log/munge/munged.log)"
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

node_state() { sinfo -h -N -p "$PARTITION" -o %T 2>/dev/null | head -1; }

cmd_start() {
    need_root
    installed || die "slurm is not installed: run '$0 install' first"
    write_conf
    start_munge
    pid_alive "$STATE/slurmctld.pid" || slurmctld
    pid_alive "$STATE/slurmd.pid" || slurmd
    local state=""
    for _ in $(seq 120); do
        state=$(node_state || true)
        case "$state" in
            idle*|mixed*|allocated*) say "node $(hostname -s) is $state ($(nproc) CPUs, partition $PARTITION)"; return ;;
            down*|drain*) scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.5
    done
    die "node did not become idle within 60 s (state '${state:-no answer}'); see $STATE/slurmctld.log and $STATE/slurmd.log"
}

cmd_status() {
    local state
    state=$(node_state || true)
    echo "munged: $(pgrep -x munged >/dev/null && echo running || echo stopped);" \
         "slurmctld: $(pid_alive "$STATE/slurmctld.pid" && echo running || echo stopped);" \
         "slurmd: $(pid_alive "$STATE/slurmd.pid" && echo running || echo stopped);" \
         "node: ${state:-no answer}"
    case "$state" in idle*|mixed*|allocated*) return 0 ;; *) return 1 ;; esac
}

stop_pidfile() {  # name pidfile: SIGTERM, then wait up to 10 s
    local pid
    pid_alive "$2" || return 0
    pid=$(cat "$2"); kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    echo "local_cluster: $1 ($pid) did not stop within 10 s" >&2; return 1
}

cmd_stop() {
    need_root
    # Jobs first, so no task outlives its slurmd.
    if pid_alive "$STATE/slurmctld.pid"; then scancel --partition="$PARTITION" >/dev/null 2>&1 || true; fi
    stop_pidfile slurmd "$STATE/slurmd.pid"
    stop_pidfile slurmctld "$STATE/slurmctld.pid"
    local mpid=/run/munge/munged.pid
    stop_pidfile munged "$mpid"
    say "stopped"
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    status) cmd_status ;;
    stop) cmd_stop ;;
    *) echo "usage: $0 install|start|status|stop" >&2; exit 2 ;;
esac
