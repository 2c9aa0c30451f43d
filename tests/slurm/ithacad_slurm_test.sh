#!/bin/bash
# ithacad --cluster slurm on a real two-node Slurm (tests/slurm/slurm_local.sh, started here):
#  1. a 2-node x 2-rank job submitted through ithacad (CPU, Gloo) gives the same losses as the
#     4-rank job on one node; its history, status and metrics name both nodes;
#  2. ithacad killed (-9) mid-job and started again: it re-attaches to the Slurm job by the id
#     in its store, the job goes on and succeeds, and its history has every step once;
#  3. a rank killed on node n2 with [retry] max_restarts = 1: the job is submitted again, resumes
#     from its checkpoint and ends with the loss of a run nothing interrupted;
#  4. `scancel` from Slurm's side: the job is CANCELLED in ithacad with Slurm's reason;
#  5. ithacad stopped with SIGTERM mid-job and started again on another port: the Slurm job runs
#     on, its ranks find the new address in the job's daemon.addr and re-attach, every step is
#     in the history once;
#  6. a real preemption (a job in the higher-tier partition takes the nodes): Slurm's warning
#     signal (--signal=USR1) reaches the ranks, they checkpoint and stop, the job is QUEUED with
#     Slurm's cause (PREEMPTED), submitted again, and resumes: every step once, no restart
#     counted, the final loss of a run nothing interrupted;
#  7. `ithaca drain` of a Slurm job: checkpointed, QUEUED, nothing starts; `--undo`: it resumes;
#  8. a node that never starts (its slurmd stopped): the job fails naming Slurm's reason, in
#     bounded time.
# Needs root and `apt-get install slurm-wlm munge` (tools/setup.sh installs them).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin:/usr/bin"  # Bazel's test PATH lacks the daemons' directory
fail() { echo "FAIL: $*" >&2; dump; exit 1; }
command -v slurmctld >/dev/null || { echo "FAIL: no slurmctld: apt-get install -y slurm-wlm munge" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "FAIL: needs root (slurmd runs the nodes' tasks as root here)" >&2; exit 1; }

ROOT=$PWD
W=$ROOT/worker/ithaca-worker
D=$ROOT/server/ithacad
C=$ROOT/client/ithaca
# Short paths: slurmd's step sockets live under S, and a unix socket path holds 108 bytes.
S=$(mktemp -d /tmp/ithaca-slurm-XXXXXX)
T=$S/t
mkdir -p "$T"
DPID=""
dump() {
  set +e
  echo "---- ithacad" >&2; tail -n 40 "$T/ithacad.out" >&2
  for f in "$T"/state/jobs/*/slurm-*.out "$T"/state/jobs/*/rank-*.log; do
    [ -f "$f" ] && { echo "---- $f" >&2; tail -n 15 "$f" >&2; }
  done
  squeue --states=all >&2
}
cleanup() {
  set +e
  [ -n "$DPID" ] && kill -9 "$DPID" 2>/dev/null
  SLURM_CONF=$S/slurm.conf scancel --user=root 2>/dev/null
  "$ROOT/tests/slurm/slurm_local.sh" stop "$S" $stop_munge >/dev/null 2>&1
  # Anything of ours a killed step left behind (its environment names this test's state).
  for p in $(pgrep -f "ithaca-worker --daemon" 2>/dev/null); do
    grep -qz "ITHACA_ALLOWED_ROOTS=$S" "/proc/$p/environ" 2>/dev/null && kill -9 "$p"
  done
  rm -rf "$S"
}
# munged too, unless it ran before this test.
stop_munge=--munge
munge -n >/dev/null 2>&1 && stop_munge=""
trap cleanup EXIT
"$ROOT/tests/slurm/slurm_local.sh" start "$S" 2 2 >/dev/null
export SLURM_CONF=$S/slurm.conf

"$ROOT/tools/tokenize/ithaca-tokenize" --no-progress --output "$T/corpus" \
  "$ROOT/engine/data/testdata/tiny_corpus.txt" >/dev/null

# spec NAME STEPS NODES [EXTRA]
spec() {
  cat <<TOML
name = "$1"
backend = "cpu"
[model]
preset = "tiny"
[data]
path = "$T/corpus/train-00000.tok"
seq_len = 64
[training]
steps = $2
lr = 3e-3
warmup_steps = 2
[parallel]
world = 4
[memory]
recompute = "full"
tile_tokens = 32
[metrics]
log_every = 1
[slurm]
nodes = $3
time_limit = "10"
${4:-}
TOML
}

# One port for every ithacad of the test: the ranks on the nodes dial it, and a restarted daemon
# must be found where its predecessor was (as a real deployment's fixed address).
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# start_daemon [PORT]: on PORT ($PORT unless given)
start_daemon() {
  rm -f "$T/state/ithacad.addr"
  "$D" --cluster slurm --state-dir "$T/state" --listen "127.0.0.1:${1:-$PORT}" --metrics-listen 127.0.0.1:0 \
    --cpu-slots 2 --allow-root-workers --allowed-roots "$S" --start-timeout-s 30 \
    --heartbeat-interval-ms 200 --slurm-poll-s 0.5 >> "$T/ithacad.out" 2>&1 &
  DPID=$!
  for _ in $(seq 100); do [ -s "$T/state/ithacad.addr" ] && break; sleep 0.1; done
  [ -s "$T/state/ithacad.addr" ] || fail "ithacad did not start"
  export ITHACA_SERVER
  ITHACA_SERVER=$(sed -n 's/^grpc=//p' "$T/state/ithacad.addr")
  METRICS=$(sed -n 's/^metrics=//p' "$T/state/ithacad.addr")
}
# state ID: the job's state, lower case
state() { "$C" status "$1" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"].replace("JOB_STATE_", "").lower())'; }
field() { "$C" status "$1" -o json | python3 -c "import json,sys; j=json.load(sys.stdin); print(j.get('$2', ''))"; }
# wait_state ID STATE SECONDS
wait_state() {
  for _ in $(seq $(($3 * 5))); do
    [ "$(state "$1")" = "$2" ] && return 0
    sleep 0.2
  done
  fail "job $1 is $(state "$1"), not $2, after $3 s: $(field "$1" reason)"
}
# steps ID: "step N loss L" of rank 0, in the history's order
steps() {
  "$C" logs --steps "$1" | python3 -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    s = e.get("step")
    if s and s.get("rank", 0) == 0:
        print("step %d loss %.4f" % (int(s["step"]), s["loss"]))'
}
losses() { grep -oE '^step [0-9]+/[0-9]+ \| loss [0-9.]+' "$1" | sed -E 's#^step ([0-9]+)/[0-9]+ \| loss ([0-9.]+)#step \1 loss \2#'; }

# job_steps_once ID N: rank 0's history is steps 1..N, each once
job_steps_once() {
  local got want
  got=$(steps "$1" | awk '{print $2}' | tr '\n' ' ')
  want=$(seq 1 "$2" | tr '\n' ' ')
  [ "$got" = "$want" ] || fail "job $1's history of rank 0 is [$got], not [$want]"
}
# transitions ID STATE: the reasons of the job's transitions to STATE, one a line
transitions() {
  "$C" status "$1" -o json | python3 -c "
import json, sys
for t in json.load(sys.stdin)['transitions']:
    if t['to'] == 'JOB_STATE_$2': print(t.get('reason', ''))"
}
# same_final_loss ID SPEC: the job's last step equals an uninterrupted run's (standalone)
same_final_loss() {
  local ck="$T/ck-straight-$1"
  sed -E "s#^dir = .*#dir = \"$ck\"#" "$2" > "$T/straight-$1.toml"
  timeout 300 "$W" --standalone "$T/straight-$1.toml" --nproc 4 > "$T/straight-$1.log" 2>&1 \
    || { cat "$T/straight-$1.log" >&2; fail "the uninterrupted run of $2 failed"; }
  local got want
  got=$(steps "$1" | tail -n 1)
  want=$(losses "$T/straight-$1.log" | tail -n 1 | awk '{printf "step %d loss %.4f", $2, $4}')
  echo "$1: $got; uninterrupted: $want"
  [ "$got" = "$want" ] || fail "job $1 ends at \"$got\", not \"$want\""
}

start_daemon

if [ "${1:-}" = time-limit ]; then
  # (its own test target: Slurm checks time limits only every ~30 s, so this takes a minute)
  echo "== a real time limit: Slurm's warning, checkpoint, QUEUED, resumed (maybe more than once)"
  # --time=1 with a warning 55 s ahead: it comes 5..35 s into each attempt, and the job trains
  # for longer than that, so at least its first attempt is warned.
  spec timeout 700 2 "signal_grace = 55
[checkpoint]
dir = \"$T/ck-timeout\"
every = 100000" | sed 's/^time_limit = .*/time_limit = "1"/' > "$T/timeout.toml"
  J=$("$C" submit "$T/timeout.toml" -q)
  "$C" wait "$J" --timeout 280 >/dev/null || fail "job $J: $(state "$J"): $(field "$J" reason)"
  grep -q "^#SBATCH --signal=USR1@55$" "$T/state/jobs/$J/slurm.sbatch" || fail "no --signal=USR1@55 in $J's batch script"
  grep -q "^#SBATCH --time=1$" "$T/state/jobs/$J/slurm.sbatch" || fail "no --time=1 in $J's batch script"
  transitions "$J" QUEUED | sed 1d > "$T/requeues.txt"
  cat "$T/requeues.txt"
  [ -s "$T/requeues.txt" ] || fail "job $J was never warned before its time limit"
  if grep -qv "^Slurm's warning (SIGUSR1): TIMEOUT (used [0-9:]* of its 1:00); checkpointed and stopped" "$T/requeues.txt"; then
    fail "job $J was queued again for something else than its time limit"
  fi
  [ "$(field "$J" restarts)" = 0 ] || fail "the time limit counted as a restart of $J"
  job_steps_once "$J" 700
  same_final_loss "$J" "$T/timeout.toml"
  echo PASS
  exit 0
fi

echo "== 1. a 2-node x 2-rank job through ithacad"
spec two-nodes 6 2 > "$T/two.toml"
J1=$("$C" submit "$T/two.toml" -q)
"$C" wait "$J1" --timeout 180 >/dev/null || fail "job $J1: $(state "$J1"): $(field "$J1" reason)"
two_nodes=$(steps "$J1")
[ "$(grep -c . <<<"$two_nodes")" -eq 6 ] || fail "job $J1 has $(grep -c . <<<"$two_nodes") steps of rank 0, not 6"
"$C" status "$J1" > "$T/status1.txt"
grep -q "Slurm job [0-9]*: ranks 0-1 on n1, 2-3 on n2" "$T/status1.txt" \
  || { cat "$T/status1.txt" >&2; fail "status does not name both nodes"; }
nodes=$("$C" logs --steps "$J1" | python3 -c '
import json, sys
print(" ".join(sorted({json.loads(l)["step"].get("node", "") for l in sys.stdin if "step" in json.loads(l)})))')
[ "$nodes" = "n1 n2" ] || fail "the step reports name nodes \"$nodes\", not n1 n2"
curl -s "http://$METRICS/metrics" > "$T/metrics1.txt"
for n in n1 n2; do
  grep -q "ithaca_rank_node_info{.*job_id=\"$J1\".*node=\"$n\"" "$T/metrics1.txt" \
    || fail "/metrics has no ithaca_rank_node_info of $J1 on $n"
done
[ "$(field "$J1" cluster_job)" != "" ] || fail "job $J1 has no cluster_job"
timeout 300 "$W" --standalone "$T/two.toml" --nproc 4 > "$T/one-node.log" 2>&1 \
  || { cat "$T/one-node.log" >&2; fail "the one-node run failed"; }
one_node=$(losses "$T/one-node.log" | awk '{printf "step %d loss %.4f\n", $2, $4}')
echo "2 nodes x 2 ranks (ithacad on Slurm):"; echo "$two_nodes"
echo "1 node x 4 ranks:"; echo "$one_node"
[ "$two_nodes" = "$one_node" ] || fail "the losses differ"

echo "== 2. ithacad killed (-9) and restarted mid-job"
spec restart 200 2 > "$T/restart.toml"
J2=$("$C" submit "$T/restart.toml" -q)
wait_state "$J2" running 90
for _ in $(seq 300); do [ "$(steps "$J2" | wc -l)" -ge 3 ] && break; sleep 0.2; done
kill -9 "$DPID"; wait "$DPID" 2>/dev/null || true; DPID=""
sleep 2
start_daemon
"$C" wait "$J2" --timeout 240 >/dev/null || fail "job $J2 after the restart: $(state "$J2"): $(field "$J2" reason)"
grep -q "adopting job $J2 .*Slurm job" "$T/ithacad.out" || fail "the new ithacad did not adopt $J2 by its Slurm job"
got=$(steps "$J2" | awk '{print $2}' | tr '\n' ' ')
want=$(seq 1 200 | tr '\n' ' ')
[ "$got" = "$want" ] || fail "job $J2's history of rank 0 is [$got], not [$want]"
[ "$("$C" status "$J2" -o json | python3 -c 'import json,sys; print(sum(1 for t in json.load(sys.stdin)["transitions"] if t["to"] == "JOB_STATE_STARTING"))')" = 1 ] \
  || fail "job $J2 was started more than once"

echo "== 3. a rank killed on node n2, [retry] max_restarts = 1"
spec retry 60 2 "[checkpoint]
dir = \"$T/ck-retry\"
every = 5
[retry]
max_restarts = 1
backoff_seconds = 0" > "$T/retry.toml"
J5=$("$C" submit "$T/retry.toml" -q)
wait_state "$J5" running 90
for _ in $(seq 300); do [ "$(steps "$J5" | wc -l)" -ge 12 ] && break; sleep 0.1; done
victim=""
for p in $(pgrep -f "ithaca-worker --daemon"); do
  env=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null) || continue
  grep -qx "ITHACA_JOB_ID=$J5" <<<"$env" && grep -qx ITHACA_RANK=3 <<<"$env" && grep -qx SLURMD_NODENAME=n2 <<<"$env" && victim=$p
done
[ -n "$victim" ] || fail "no rank 3 of $J5 on n2 to kill"
kill -9 "$victim"
"$C" wait "$J5" --timeout 240 >/dev/null || fail "job $J5 after the kill: $(state "$J5"): $(field "$J5" reason)"
[ "$(field "$J5" restarts)" = 1 ] || fail "job $J5 has $(field "$J5" restarts) restarts, not 1"
# Rank 3's node launcher tells ithacad it was killed (the rank cannot), so the reason names it
# however the other ranks' ends and Slurm's verdict interleave.
"$C" status "$J5" | grep -q "restart 1 of 1 .*rank 3 (node n2) killed by SIGKILL" \
  || { "$C" status "$J5" >&2; fail "the restart does not name rank 3 on n2, killed by SIGKILL"; }
sed "s#$T/ck-retry#$T/ck-straight#" "$T/retry.toml" > "$T/straight.toml"
timeout 300 "$W" --standalone "$T/straight.toml" --nproc 4 > "$T/straight.log" 2>&1 \
  || { cat "$T/straight.log" >&2; fail "the uninterrupted run failed"; }
last_retry=$(steps "$J5" | tail -n 1)
last_straight=$(losses "$T/straight.log" | tail -n 1 | awk '{printf "step %d loss %.4f", $2, $4}')
echo "retried: $last_retry; uninterrupted: $last_straight"
[ "$last_retry" = "$last_straight" ] || fail "the retried job ends at \"$last_retry\", not \"$last_straight\""

echo "== 4. scancel from Slurm's side"
spec cancel 1000 2 > "$T/cancel.toml"
J3=$("$C" submit "$T/cancel.toml" -q)
wait_state "$J3" running 90
sid=$(field "$J3" cluster_job); sid=${sid#slurm:}
scancel "$sid"
wait_state "$J3" cancelled 60
reason=$(field "$J3" reason)
echo "reason: $reason"
grep -q "cancelled in Slurm: Slurm job $sid CANCELLED" <<<"$reason" || fail "the reason is \"$reason\""

echo "== 5. ithacad stopped with SIGTERM and restarted mid-job, on another port"
spec term 150 2 > "$T/term.toml"
J7=$("$C" submit "$T/term.toml" -q)
wait_state "$J7" running 90
for _ in $(seq 300); do [ "$(steps "$J7" | wc -l)" -ge 3 ] && break; sleep 0.2; done
sid7=$(field "$J7" cluster_job)
kill -TERM "$DPID"; wait "$DPID" 2>/dev/null || true; DPID=""
grep -q "ithacad: left 1 running job" "$T/ithacad.out" || fail "ithacad did not leave $J7 running on SIGTERM"
squeue -h -j "${sid7#slurm:}" -o %T | grep -qx RUNNING || fail "the Slurm job of $J7 stopped with ithacad"
sleep 2
# Elsewhere than the ranks were told: they find it in the job's daemon.addr, which it rewrites.
PORT2=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_daemon "$PORT2"
"$C" wait "$J7" --timeout 240 >/dev/null || fail "job $J7 after the TERM restart: $(state "$J7"): $(field "$J7" reason)"
job_steps_once "$J7" 150
[ "$(transitions "$J7" STARTING | wc -l)" = 1 ] || fail "job $J7 was started more than once"
grep -q "ithacad is now at 127.0.0.1:$PORT2" "$T/state/jobs/$J7/rank-0.log" \
  || fail "rank 0 of $J7 did not follow ithacad to port $PORT2"

echo "== 6. a real preemption: Slurm's warning, checkpoint, QUEUED, resumed"
# 400 steps (about 15 s): Slurm's preemption lands well before the end (60 steps of 0.04 s
# could end first).
spec preempt 400 2 "[checkpoint]
dir = \"$T/ck-preempt\"
every = 1000" > "$T/preempt.toml"
J8=$("$C" submit "$T/preempt.toml" -q)
wait_state "$J8" running 90
for _ in $(seq 300); do [ "$(steps "$J8" | wc -l)" -ge 10 ] && break; sleep 0.1; done
sid8=$(field "$J8" cluster_job); sid8=${sid8#slurm:}
urgent=$(sbatch --parsable -p urgent -N2 --exclusive -o /dev/null --wrap 'sleep 3')
"$C" wait "$J8" --timeout 240 >/dev/null || fail "job $J8 after the preemption: $(state "$J8"): $(field "$J8" reason)"
squeue -h --states=all -j "$sid8" -O PreemptTime | grep -q "[0-9]T[0-9]" || fail "Slurm did not preempt $sid8"
queued=$(transitions "$J8" QUEUED | tail -n 1)
echo "requeued: $queued"
grep -q "Slurm's warning (SIGUSR1.*PREEMPTED at .*checkpointed and stopped" <<<"$queued" \
  || fail "job $J8 was not queued again for the preemption: \"$queued\""
[ "$(field "$J8" restarts)" = 0 ] || fail "the preemption counted as a restart of $J8"
[ "$(transitions "$J8" STARTING | wc -l)" = 2 ] || fail "job $J8 did not start twice"
[ "$(squeue -h --states=all -j "$urgent" -o %T)" = COMPLETED ] || fail "the urgent job $urgent did not run"
job_steps_once "$J8" 400
same_final_loss "$J8" "$T/preempt.toml"

echo "== 7. ithaca drain of a Slurm job, then --undo"
spec drain 80 2 "[checkpoint]
dir = \"$T/ck-drain\"
every = 1000" > "$T/drain.toml"
J9=$("$C" submit "$T/drain.toml" -q)
wait_state "$J9" running 90
for _ in $(seq 300); do [ "$(steps "$J9" | wc -l)" -ge 10 ] && break; sleep 0.1; done
"$C" drain --timeout 120 > "$T/drain.out" || { cat "$T/drain.out" >&2; fail "ithaca drain"; }
cat "$T/drain.out"
grep -q "^$J9 drained" "$T/drain.out" || fail "ithaca drain did not drain $J9"
[ "$(state "$J9")" = queued ] || fail "job $J9 is $(state "$J9") after the drain"
ls "$T/ck-drain" | grep -q . || fail "the drain left no checkpoint in $T/ck-drain"
spec after-drain 6 2 > "$T/after.toml"
J10=$("$C" submit "$T/after.toml" -q)
sleep 3
[ "$(state "$J9")" = queued ] && [ "$(state "$J10")" = queued ] || fail "a job started while drained: $J9 $(state "$J9"), $J10 $(state "$J10")"
"$C" node | grep -q "scheduling paused" || fail "ithaca node does not say scheduling is paused"
"$C" drain --undo >/dev/null || fail "ithaca drain --undo"
"$C" wait "$J9" "$J10" --timeout 240 >/dev/null || fail "after the undo: $J9 $(state "$J9"), $J10 $(state "$J10")"
job_steps_once "$J9" 80
[ "$(field "$J9" restarts)" = 0 ] || fail "the drain counted as a restart of $J9"
same_final_loss "$J9" "$T/drain.toml"

echo "== 8. a node that never starts"
"$ROOT/tests/slurm/slurm_local.sh" node-down "$S" n2
spec down 6 2 > "$T/down.toml"
J4=$("$C" submit "$T/down.toml" -q)
t0=$(date +%s)
# ithaca node shows the cluster's view: two nodes (slurmctld notices n2 is gone only after
# SlurmdTimeout), the job pending in Slurm, no local slots.
for _ in $(seq 100); do
  "$C" node > "$T/node8.txt" && grep -q "(1 pending in slurm)" "$T/node8.txt" && break
  sleep 0.2
done
grep -q "jobs run on slurm; 0 running, 1 queued (1 pending in slurm)" "$T/node8.txt" \
  && grep -q "^slurm, every partition: 2 nodes, [0-9]* idle, 0 busy, [0-9]* unavailable" "$T/node8.txt" \
  && ! grep -q "free" "$T/node8.txt" \
  || { cat "$T/node8.txt" >&2; fail "ithaca node does not show Slurm's view with $J4 pending"; }
"$C" wait "$J4" --timeout 150 >/dev/null && fail "job $J4 succeeded with a node down"
reason=$(field "$J4" reason)
echo "reason ($(( $(date +%s) - t0 )) s): $reason"
[ "$(state "$J4")" = failed ] || fail "job $J4 is $(state "$J4")"
grep -q "Slurm job" <<<"$reason" && grep -q "n2" <<<"$reason" || fail "the reason does not name Slurm's view of n2: $reason"
echo PASS
