#!/bin/bash
# A real Slurm cluster on this one machine, for tests and for trying Ithaca's Slurm recipes by
# hand: munged, slurmctld and N slurmd "nodes" (n1..nN), all on 127.0.0.1 with a port each
# (Debian 12's slurm-wlm 22.05; after /work/shared/reference/slurm/two-nodes.sh). Run as root.
#
#   tests/slurm/slurm_local.sh start DIR [NODES [CPUS]]  # NODES (2) nodes of CPUS (2) CPUs each;
#                                                  # prints `export SLURM_CONF=DIR/slurm.conf`
#   tests/slurm/slurm_local.sh stop DIR [--munge]        # stops what start started (and munged)
#   tests/slurm/slurm_local.sh node-down DIR NODE        # stops one slurmd (a node that never starts)
#
# Two partitions on the same nodes: debug (the default) and urgent, whose jobs preempt debug's
# (`sbatch -p urgent --exclusive -N2 --wrap 'sleep 5'` preempts whatever runs there).
# Needs `apt-get install -y slurm-wlm munge`. After start, `sinfo` shows the nodes idle and
# `srun -N2 --ntasks-per-node=1 bash -c 'echo $SLURMD_NODENAME $SLURM_NODEID'` prints n1 0 / n2 1.
# Keep DIR short (say /tmp/slurm-XXXX): slurmd's step sockets live under it, and a unix socket
# path holds 108 bytes. Node names do not resolve in DNS: every node is 127.0.0.1 (a task may use
# $SLURM_LAUNCH_NODE_IPADDR, or `scontrol show node NAME` for NodeAddr).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
cmd=${1:?usage: slurm_local.sh start|stop|node-down DIR ...}
T=${2:?usage: slurm_local.sh $cmd DIR}

slurmd_pid() { echo "$T/run/slurmd-$1.pid"; }

case "$cmd" in
start)
  nodes=${3:-2}
  cpus=${4:-2}
  command -v slurmctld >/dev/null || { echo "slurm_local.sh: no slurmctld: apt-get install -y slurm-wlm munge" >&2; exit 1; }
  mkdir -p "$T"/{state,log,run}
  for n in $(seq "$nodes"); do mkdir -p "$T/spool/n$n"; done
  [ -f /etc/munge/munge.key ] || mungekey --create
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
  munge -n >/dev/null 2>&1 || su -s /bin/sh munge -c /usr/sbin/munged
  for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
  {
    cat <<CONF
ClusterName=ithaca-local
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=16817
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/run/slurmctld.pid
SlurmdPidFile=$T/run/slurmd-%n.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd-%n.log
ReturnToService=2
SlurmdTimeout=10
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# Preemption as clusters run it: a job in "urgent" (PriorityTier 2) cancels the "debug" jobs
# (tier 1) it needs the nodes of, after their GraceTime; the victims get their --signal first
# (preempt_send_user_signal), as a time limit gives it GRACE seconds ahead.
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
SlurmctldParameters=preempt_send_user_signal
CONF
    for n in $(seq "$nodes"); do
      echo "NodeName=n$n NodeAddr=127.0.0.1 NodeHostname=localhost Port=$((17000 + n)) CPUs=$cpus RealMemory=4000 State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=60"
    echo "PartitionName=urgent Nodes=n[1-$nodes] MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF"
  } > "$T/slurm.conf"
  slurmctld -f "$T/slurm.conf"
  for n in $(seq "$nodes"); do slurmd -f "$T/slurm.conf" -N "n$n"; done
  idle=0
  for _ in $(seq 100); do
    idle=$(SLURM_CONF="$T/slurm.conf" sinfo -h -N -o %T 2>/dev/null | grep -c idle || true)
    [ "$idle" -ge "$nodes" ] && break
    sleep 0.2
  done
  if [ "$idle" -lt "$nodes" ]; then
    echo "slurm_local.sh: only $idle of $nodes nodes idle; see $T/log" >&2
    exit 1
  fi
  echo "export SLURM_CONF=$T/slurm.conf"
  ;;
node-down)
  node=${3:?usage: slurm_local.sh node-down DIR NODE}
  f=$(slurmd_pid "$node")
  [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  ;;
stop)
  for f in "$T"/run/slurmd-*.pid "$T"/run/slurmctld.pid; do
    [ -s "$f" ] || continue
    p=$(cat "$f")
    kill "$p" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  if [ "${3:-}" = --munge ] && [ -s /run/munge/munged.pid ]; then
    kill "$(cat /run/munge/munged.pid)" || true
  fi
  ;;
*)
  echo "slurm_local.sh: unknown command $cmd (start, stop, node-down)" >&2
  exit 2
  ;;
esac
