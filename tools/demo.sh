#!/bin/bash
# The main job, through the service: starts ithacad (state under $ITHACA_HOME, default
# ~/.ithaca), submits the built-in demo job (the tiny Llama on a small byte-level corpus, CPU
# backend) with the `ithaca` CLI, follows it to completion, prints its per-tier memory table and
# a snapshot of /metrics, writes the job's report ($RUN/report.html: plots, spec, plan) and its
# step history ($RUN/steps.jsonl), then stops the daemon. Exits 0 only if the job SUCCEEDED.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN="${ITHACA_DEMO_DIR:-$PWD/runs/demo}"
export ITHACA_HOME="${ITHACA_HOME:-$HOME/.ithaca}"
mkdir -p "$RUN" "$ITHACA_HOME"
bazel build //server:ithacad //worker:ithaca-worker //client:ithaca //engine/data:ithaca-tokenize
BIN="$PWD/bazel-bin"
"$BIN/engine/data/ithaca-tokenize" --input engine/data/testdata/tiny_corpus.txt \
  --output "$RUN/corpus.tok"
# CUDA on one GPU where there is one; otherwise two CPU ranks (FSDP + Ulysses over Gloo).
if nvidia-smi -L >/dev/null 2>&1; then
  BACKEND=cuda WORLD=1 SP=1 GPUS=1
else
  BACKEND=cpu WORLD=2 SP=2 GPUS=0
fi
sed -e "s|@RUN@|$RUN|g" -e "s|@BACKEND@|$BACKEND|" -e "s|@WORLD@|$WORLD|" -e "s|@SP@|$SP|" \
  tools/demo_job.toml > "$RUN/job.toml"
echo "job spec: $RUN/job.toml"

# The daemon picks free ports and writes them to $ITHACA_HOME/ithacad.addr.
rm -f "$ITHACA_HOME/ithacad.addr"
# The job reads and writes only under $RUN (--allowed-roots); as root (a container, CI) the
# workers are allowed to run as root too.
ROOT_FLAG=()
[ "$(id -u)" = 0 ] && ROOT_FLAG=(--allow-root-workers)
"$BIN/server/ithacad" --state-dir "$ITHACA_HOME" --gpus "$GPUS" --listen 127.0.0.1:0 \
  --metrics-listen 127.0.0.1:0 --worker-binary "$BIN/worker/ithaca-worker" \
  --allowed-roots "$ITHACA_HOME:$RUN" "${ROOT_FLAG[@]}" \
  > "$ITHACA_HOME/ithacad.log" 2>&1 &
DAEMON=$!
stop_daemon() {
  if kill -0 "$DAEMON" 2>/dev/null; then
    kill -TERM "$DAEMON"
    wait "$DAEMON" || true
  fi
}
trap stop_daemon EXIT
for _ in $(seq 300); do
  [ -s "$ITHACA_HOME/ithacad.addr" ] && break
  kill -0 "$DAEMON" 2>/dev/null || { cat "$ITHACA_HOME/ithacad.log"; exit 1; }
  sleep 0.1
done
head -1 "$ITHACA_HOME/ithacad.log"
GRPC=$(sed -n 's/^grpc=//p' "$ITHACA_HOME/ithacad.addr")
METRICS=$(sed -n 's/^metrics=//p' "$ITHACA_HOME/ithacad.addr")
ithaca() { "$BIN/client/ithaca" --server "$GRPC" "$@"; }

ithaca plan "$RUN/job.toml"
JOB=$(ithaca submit "$RUN/job.toml" -o name)
echo "submitted $JOB; following it (Ctrl-C stops following; \`ithaca cancel $JOB\` stops the job)"
rc=0
ithaca watch "$JOB" || rc=$?
echo
ithaca status "$JOB"
# /metrics goes away with the daemon: keep a snapshot beside the run.
.venv/bin/python - "$METRICS" "$RUN/metrics.txt" <<'PY' || true
import sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=10).read().decode()
open(sys.argv[2], "w").write(text)
PY
echo
echo "metrics: served at http://$METRICS/metrics while ithacad ran (Prometheus text format);"
echo "         snapshot in $RUN/metrics.txt, e.g.:"
grep -E '^ithaca_(tokens_per_second|train_loss|train_step|jobs\{.*state="succeeded")' \
  "$RUN/metrics.txt" | sed 's/^/           /' || true
ithaca logs "$JOB" --steps > "$RUN/steps.jsonl"
ithaca report "$JOB" --out "$RUN/report.html"
echo "report:  $RUN/report.html (open it in a browser); step history: $RUN/steps.jsonl"
echo "logs:    $ITHACA_HOME/jobs/$JOB/rank-0.log   store: $ITHACA_HOME/jobs.db"
echo "checkpoints: $RUN/checkpoints"
exit $rc
