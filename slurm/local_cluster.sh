#!/usr/bin/env bash
# A local Slurm cluster on this machine, for tests and for trying the batch scripts.
#
#   slurm/local_cluster.sh install            # apt-get Debian's slurm-wlm + munge (skipped when present)
#   slurm/local_cluster.sh start              # one node: this host, over 127.0.0.1
#   slurm/local_cluster.sh start --nodes N    # N nodes h0..hN-1, one per namespaced host (tfdist.hosts)
#   slurm/local_cluster.sh status             # exit 0 when every node answers and is usable
#   slurm/local_cluster.sh stop               # stop the daemons (and the hosts) this script started
#
# Runs as root (as in a container): SlurmUser=root, no cgroups (proctrack/linuxproc,
# task/none), no accounting database. Every node has all this machine's CPUs, in one
# partition `local` with OverSubscribe=YES so that `sbatch --oversubscribe` lets two
# jobs share the CPUs (tests run two jobs at once on a 2-core machine).
#
# With --nodes N, `python -m tfdist.hosts --cluster slurm up N` makes the hosts (each
# its own network namespace, address in 198.18.0.0/15, hostname and /etc/hosts);
# slurmctld runs here and listens on the bridge address, and one slurmd runs on each
# host as node hN with NodeAddr its own address, so `sbatch -N 2` spans two network
# stacks and workers reach each other by node name. munged's socket is a file, so the
# namespaced slurmds share this one. `start` with another layout than the running one
# stops that one first (so plain `start` after `start --nodes 2` is one node again).
#
# It writes /etc/slurm/slurm.conf (the path every Slurm command reads by default) and
# refuses to overwrite one it did not write. State and logs: $TFDIST_SLURM_DIR
# (default /var/lib/tfdist-slurm): slurmctld.log and slurmd*.log are there when a job
# does not start. A second, independent cluster (tests) sets SLURM_CONF (its config
# file; Slurm's own commands read it too), TFDIST_SLURM_DIR, TFDIST_SLURM_PORT
# (slurmctld's port, default 6817; slurmd uses the next one) and TFDIST_SLURM_HOSTS
# (its tfdist.hosts cluster name, default slurm).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
STATE=${TFDIST_SLURM_DIR:-/var/lib/tfdist-slurm}
export SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
CONF=$SLURM_CONF
PORT=${TFDIST_SLURM_PORT:-6817}
HOSTS=${TFDIST_SLURM_HOSTS:-slurm}
MARK="# written by tfdist slurm/local_cluster.sh"
PARTITION=local

die() { echo "local_cluster: $*" >&2; exit 1; }
say() { echo "local_cluster: $*"; }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root (it installs packages and runs slurmd as root)"; }

installed() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
              && command -v sbatch >/dev/null && command -v munged >/dev/null; }

hosts_cli() { PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python}" -m tfdist.hosts --cluster "$HOSTS" "$@"; }

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

# write_conf CTLD_ADDR NODE_LINES NODE_SET DESCRIPTION
write_conf() {
    local host
    host=$(hostname -s)
    if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
        die "$CONF exists and was not written by this script; move it away to use the local cluster"
    fi
    mkdir -p "$(dirname "$CONF")" "$STATE/ctld"
    cat >"$CONF.tmp" <<EOC
$MARK: $4
ClusterName=tfdist-local
SlurmctldHost=$host($1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire also delays a requeued job's restart (default 120 s; 5 is the least
# Slurm takes); tests requeue.
AuthInfo=cred_expire=5
# No cgroups in a container: track processes by parent pid, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# Cores are the consumable resource; memory is not (tests must not fight over it).
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# A job starts as soon as it may: scheduled at submit (batch_sched_delay, default 3 s)
# and, once a requeued job's cred_expire has passed, by the next pass of a scheduler
# that runs every second (the defaults, 60 s and 30 s, held such a job 15-37 s).
SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1
# Requeue (scontrol requeue, --requeue) is what preempted tfdist jobs use.
JobRequeue=1
ReturnToService=2
MpiDefault=none
StateSaveLocation=$STATE/ctld
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmctldLogFile=$STATE/slurmctld.log
# %n: the node name, so slurmds of several nodes on this machine keep apart.
SlurmdSpoolDir=$STATE/d%n
SlurmdPidFile=$STATE/slurmd%n.pid
SlurmdLogFile=$STATE/slurmd%n.log
SlurmctldDebug=info
SlurmdDebug=info
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# Finished jobs stay visible to scontrol for 5 minutes (tests read their exit codes).
MinJobAge=300
# Short timeouts: every node is on this machine.
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
$2
PartitionName=$PARTITION Nodes=$3 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOC
    mv "$CONF.tmp" "$CONF"
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

# One line per node: its state (idle, mixed, down*...).
node_states() { sinfo -h -N -p "$PARTITION" -o %T 2>/dev/null; }

all_usable() {  # every node of the partition answers and can run jobs
    local states
    states=$(node_states || true)
    [ -n "$states" ] && ! grep -qvE '^(idle|mixed|allocated)' <<<"$states"
}

# The layout the running daemons were started with ("1" or "hosts N"), empty when none.
# A cluster started before layouts were recorded is one node.
running_layout() {
    pid_alive "$STATE/slurmctld.pid" || return 0
    cat "$STATE/layout" 2>/dev/null || echo 1
}

start_one_node() {
    local host
    host=$(hostname -s)
    mkdir -p "$STATE/d$host"
    # Loopback only: the daemons and the jobs talk over 127.0.0.1 whatever the host name.
    write_conf 127.0.0.1 "NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN" \
        "$host" "a one-node cluster on $host"
    start_munge
    pid_alive "$STATE/slurmctld.pid" || slurmctld -f "$CONF"
    # (slurmd.pid: a cluster started before node names were in the pid file's name)
    pid_alive "$STATE/slurmd$host.pid" || pid_alive "$STATE/slurmd.pid" || slurmd -f "$CONF"
}

start_nodes() {  # N: nodes h0..hN-1 on the tfdist.hosts cluster $HOSTS
    local n=$1 info root lines="" i addr
    info=$(hosts_cli status --json)
    if ! grep -q '"up": true' <<<"$info"; then
        hosts_cli up "$n" >/dev/null || die "could not make $n namespaced hosts (see above)"
        info=$(hosts_cli status --json)
    fi
    # root address, then one "name address" line per host
    mapfile -t addrs < <("${PYTHON:-python}" -c '
import json, sys
s = json.load(sys.stdin)
print(s["root_address"])
for h in s["hosts"]:
    print(h["name"], h["address"])' <<<"$info")
    root=${addrs[0]}
    [ "$((${#addrs[@]} - 1))" -ge "$n" ] || die "hosts cluster $HOSTS has $((${#addrs[@]} - 1)) host(s), need $n: run 'python -m tfdist.hosts --cluster $HOSTS down'"
    for i in $(seq 0 $((n - 1))); do
        addr=${addrs[$((i + 1))]#* }
        mkdir -p "$STATE/dh$i"
        lines+="NodeName=h$i NodeHostname=h$i NodeAddr=$addr CPUs=$(nproc) State=UNKNOWN"$'\n'
    done
    write_conf "$root" "$lines" "h[0-$((n - 1))]" "$n nodes h0..h$((n - 1)) on namespaced hosts ($HOSTS)"
    start_munge
    pid_alive "$STATE/slurmctld.pid" || slurmctld -f "$CONF"
    # `ip netns exec` mounts a fresh /sys for the host, without /sys/fs/cgroup, and slurmd
    # will not start without one: the hosts get this machine's through a bind mount here.
    local cg="$STATE/cgroup"
    if mountpoint -q /sys/fs/cgroup && ! mountpoint -q "$cg"; then
        mkdir -p "$cg"; mount --rbind /sys/fs/cgroup "$cg"
    fi
    for i in $(seq 0 $((n - 1))); do
        # Inside h$i's namespace, with hostname h$i; it forks into the background there.
        pid_alive "$STATE/slurmdh$i.pid" || hosts_cli exec "h$i" -- sh -c \
            'if mountpoint -q "$0"; then mount --rbind "$0" /sys/fs/cgroup; fi; exec "$@"' \
            "$cg" slurmd -f "$CONF" -N "h$i"
    done
}

cmd_start() {
    local nodes=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) [ $# -ge 2 ] || die "--nodes needs a number"; nodes=$2; shift 2 ;;
            --nodes=*) nodes=${1#--nodes=}; shift ;;
            *) echo "usage: $0 start [--nodes N]" >&2; exit 2 ;;
        esac
    done
    if [ -n "$nodes" ] && ! [[ "$nodes" =~ ^[1-9][0-9]?$ ]]; then
        echo "local_cluster: --nodes must be a number from 1 to 99. Received: '$nodes'" >&2; exit 2
    fi
    need_root
    installed || die "slurm is not installed: run '$0 install' first"
    local want=1 current
    [ -n "$nodes" ] && want="hosts $nodes"
    current=$(running_layout)
    if [ -n "$current" ] && [ "$current" != "$want" ]; then
        say "the running cluster has layout '$current'; stopping it for '$want'"
        cmd_stop
    fi
    mkdir -p "$STATE"
    echo "$want" >"$STATE/layout"
    if [ -n "$nodes" ]; then start_nodes "$nodes"; else start_one_node; fi
    local states=""
    for _ in $(seq 120); do
        if all_usable; then
            say "$(node_states | wc -l) node(s) usable in partition $PARTITION: $(sinfo -h -N -p "$PARTITION" -o '%N=%T' | tr '\n' ' ')"
            return
        fi
        states=$(sinfo -h -N -p "$PARTITION" -o '%N=%T' 2>/dev/null | tr '\n' ' ' || true)
        for down in $(sinfo -h -N -p "$PARTITION" -t down,drain -o %N 2>/dev/null || true); do
            scontrol update nodename="$down" state=resume >/dev/null 2>&1 || true
        done
        sleep 0.5
    done
    die "nodes not usable within 60 s (${states:-no answer}); see $STATE/slurmctld.log and $STATE/slurmd*.log"
}

cmd_status() {
    local d="" p
    for p in "$STATE"/slurmd*.pid; do
        [ -e "$p" ] || continue
        d+="$(basename "$p" .pid | sed 's/^slurmd//')=$(pid_alive "$p" && echo running || echo stopped) "
    done
    echo "munged: $(pgrep -x munged >/dev/null && echo running || echo stopped);" \
         "slurmctld: $(pid_alive "$STATE/slurmctld.pid" && echo running || echo stopped);" \
         "slurmd: ${d:-none};" \
         "nodes: $(sinfo -h -N -p "$PARTITION" -o '%N=%T' 2>/dev/null | tr '\n' ' ' || true)"
    all_usable
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
    local p layout
    layout=$(cat "$STATE/layout" 2>/dev/null || true)
    # Jobs first, so no task outlives its slurmd.
    if pid_alive "$STATE/slurmctld.pid"; then scancel --partition="$PARTITION" >/dev/null 2>&1 || true; fi
    for p in "$STATE"/slurmd*.pid; do
        [ -e "$p" ] && stop_pidfile slurmd "$p"
    done
    stop_pidfile slurmctld "$STATE/slurmctld.pid"
    # The hosts go too, with anything a job left on them, then the cgroup bind mount.
    case "$layout" in hosts*) hosts_cli down ;; esac
    if mountpoint -q "$STATE/cgroup"; then umount -R "$STATE/cgroup" && rmdir "$STATE/cgroup"; fi
    # munged serves every cluster on this machine: keep it while another slurmctld runs.
    if ! pgrep -x slurmctld >/dev/null; then stop_pidfile munged /run/munge/munged.pid; fi
    say "stopped"
}

case "${1:-}" in
    install) cmd_install ;;
    start) shift; cmd_start "$@" ;;
    status) cmd_status ;;
    stop) cmd_stop ;;
    *) echo "usage: $0 install|start [--nodes N]|status|stop" >&2; exit 2 ;;
esac
