#!/bin/bash
# A run longer than one device call (10 minutes), such as Llama-3-8B's whole step at 512K
# (~10 minutes after a minute of start-up). The device keeps a process that started a new process
# session (setsid) while the machine is held, and a machine stays held while calls follow each
# other within its warm time (30 s): start the run in one call, wait for it in the next.
#
#   bench/device_background.sh start NAME CMD...   CMD in a new session, from this folder; its
#                                                  output in /tmp/ithaca-bg/NAME/log, its exit
#                                                  status in .../rc when it ends
#   bench/device_background.sh wait NAME SECONDS   waits up to SECONDS for it; prints the log's
#                                                  tail and, once it ended, its status (the
#                                                  script's own status: 0 ended, 3 still running)
#   bench/device_background.sh collect NAME DIR    copies /tmp/ithaca-bg/NAME into DIR/NAME.tgz
#
# E.g. the 8B step at 512K with auto's plan, then its lines ($OUT is emptied before each call, so
# the run writes under /tmp and the last call collects it). NODE_HOST_GIB must be this host's
# memory: the rehearse phase's default (2048, a DGX node) makes auto keep every block input on
# the host (348 GiB), which this host does not have; with its own ~125 GiB auto's plan is the
# one predicted at 603 s (docs/benchmarks.md):
#   call 1: B=/tmp/ithaca-bg/s512/out; H=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
#           bench/device_background.sh start s512 env WARMUP=0 NODE_HOST_GIB=$H \
#             STEP_TIMEOUT=1500 bash bench/step_time_session.sh .device/bin $B \
#             rehearse:llama-3-8b:1:524288:--recompute=auto;
#           bench/device_background.sh wait s512 560
#   call 2: bench/device_background.sh wait s512 560; bench/device_background.sh collect s512 $OUT
set -uo pipefail
verb=${1:?start, wait or collect}
name=${2:?a name for the run}
dir=/tmp/ithaca-bg/$name
case "$verb" in
  start)
    shift 2
    mkdir -p "$dir" && rm -f "$dir/rc"
    setsid nohup bash -c '"$@" > "$0/log" 2>&1; echo $? > "$0/rc"' "$dir" "$@" \
      < /dev/null > /dev/null 2>&1 &
    echo "started $name: $*"
    ;;
  wait)
    end=$((SECONDS + ${3:?seconds}))
    while [ ! -f "$dir/rc" ] && [ "$SECONDS" -lt "$end" ]; do sleep 1; done
    tail -5 "$dir/log" 2> /dev/null
    if [ -f "$dir/rc" ]; then
      echo "$name ended: status $(cat "$dir/rc")"
    else
      echo "$name still running"
      exit 3
    fi
    ;;
  collect)
    tar czf "${3:?dir}/$name.tgz" -C /tmp/ithaca-bg "$name" && echo "collected $3/$name.tgz"
    ;;
  *)
    echo "device_background.sh: $verb: start, wait or collect" >&2
    exit 2
    ;;
esac
