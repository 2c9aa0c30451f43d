#!/bin/bash
# One device call that runs several phases from prebuilt binaries:
# `bench/device_session.sh BIN_DIR OUT_DIR PHASE...`, from the repository root (the training test
# reads engine/data/testdata). BIN_DIR holds the test and bench binaries, built here with
# `bazel build --dynamic_mode=off //engine/backend/cuda:all //engine/comm/nccl:all //tests/gpu:all //bench/...`
# (a build with CUDA: bazel/cuda_configure.bzl),
# and a lib/ folder with the non-CUDA shared libraries they need (Abseil, libgomp) where the GPU
# host lacks them; `.device/bin` (git-ignored) is carried to the device that way. Phases:
#   info    GPU, driver and every libcudnn on the machine
#   tests   the CUDA backend's GPU tests and the NCCL comm test (world 1), logged to
#           OUT_DIR/gpu-tests-<date>.log for bench/results/
#   attn    cuDNN attention at the bar shapes: the default graph (verbose: every plan's time),
#           more heuristic modes, and the newest other libcudnn found on the machine
#   sweep:SHAPES:N  every cuDNN engine/knob configuration (<= N per engine) timed at each shape
#           (head_dim x Hq x Hkv x S, '+' between shapes: 64x32x8x65536+128x32x8x32768), forward
#           and backward; every plan's time in sweep.log
#   sdpa:SHAPES[:N]  attention_bench with the composite, unified and default forward node
#           (attention_bench --cudnn_forward_impl; SDPA_IMPLS picks some) at SHAPES as in sweep, N timed
#           iterations (default 2); sdpa.jsonl, sdpa.log
#   hopperfwd:SHAPES[:N]  attention_bench with the cuDNN and the own Hopper forward side by side
#           (--forward=cudnn,hopper,auto; the backward is cuDNN's in all) at SHAPES as in sweep,
#           N timed iterations (default 3); hopperfwd.jsonl, hopperfwd.log (the per-shape choice)
#   hopper:SHAPES[:N]  attention_bench with cuDNN's and the own Hopper forward and backward side by
#           side (every pair of --forward=$FORWARDS and --backward=$BACKWARDS, default
#           cudnn,hopper each; passes $PASSES, default bwd,fwd+bwd) at SHAPES as in sweep, N timed
#           iterations (default 3); hopper.jsonl, hopper.log (the per-shape choices)
#   kernels  norm_bench (RMSNorm, SwiGLU, RoPE GB/s) and gemm_bench; kernels.jsonl
#   docattn:S:N  attention_bench at hd 64, 32 query / 8 KV heads (Llama-3.2-1B), S tokens: full
#           causal and packed documents of N tokens (document-masked) side by side, for every
#           pair of --forward=$FORWARDS and --backward=$BACKWARDS (default cudnn each); docattn.jsonl
#   winattn:SHAPES:W  attention_bench at SHAPES (as in sweep): full causal and a sliding window of
#           W keys side by side, cuDNN's and the own Hopper kernels (passes $PASSES, default
#           fwd,bwd,fwd+bwd); winattn.jsonl
#   daemon[:SETS]  the demo job through ithacad and the CLI on this machine's GPU(s): without
#           SETS with packed documents (data.document_mask) and a held-out loss ([eval]); with
#           SETS ('+' between key=value, e.g. model.preset=llama-3-8b+data.seq_len=16384) those
#           --set overrides instead, on a corpus of the built-in text repeated CORPUS_REPEAT times
#           (default 1); each job's step lines (`ithaca logs --steps`) go to daemon-steps.log,
#           everything to daemon.log; where transformers is installed, the job's export is scored
#           by tests/golden/verify_export.py (float32) against ithaca-model-loss
#   pin     pin_bench: cudaHostAlloc against mmap + touch + cudaHostRegister; pin.jsonl
#   train:S[:extra flags]  attention-aware train_bench at S (comma list; '+' separates flags;
#           e.g. train:131072:--doc_len=8192 for packed documents)
#   probe:W:S[:extra flags] the memory probe at each S
#   parallel:W:S[:extra flags]  parallel_bench over W GPUs (Ulysses over all W: --sp=W unless a
#           flag says otherwise), attention-aware, at S (comma list; '+' separates flags, e.g.
#           parallel:2:262144:--overlap=false); rank 0's lines in parallel.jsonl, the
#           per-collective timeline of each rank and S in OUT_DIR/timeline.*.jsonl
#   rehearse:W:S[:extra flags]  parallel_bench --rehearse: rank 0 of W ranks (Ulysses over all W
#           unless a flag says otherwise) alone on this GPU, collectives modeled
#           (docs/rehearsal.md), attention-aware, at S (comma list; '+' separates flags, e.g.
#           rehearse:8:131072:--model=llama-3-8b+--planner_settings); rehearsal.jsonl, rehearsal.log;
#           the rehearsal's GPU test (cuda_rehearsal_test) runs first, once, into the same log
#   ckpt:MODEL:N[:DIR]  checkpoint_bench: MODEL (a preset) saved and loaded by N ranks, one per
#           GPU (save and load GB/s, host bytes per rank); the checkpoint (12 bytes per
#           parameter: 96 GB for llama-3-8b) goes to DIR (default /tmp/ithaca-ckpt-bench) and is
#           removed afterwards; checkpoint.jsonl, checkpoint.log
# Lines go to OUT_DIR/{info,attn,train,parallel,checkpoint}.log, OUT_DIR/gpu-tests-<date>.log and
# OUT_DIR/{attn,train,parallel,checkpoint}.jsonl.
set -uo pipefail
BIN=${1:?bin dir}
OUT=${2:?out dir}
shift 2
mkdir -p "$OUT"
# BIN_DIR/cuda-lib (bench/collect_wheel_libs.sh: the pinned wheels' cuDNN and cudart) goes before
# the host's CUDA folders, so that the binaries load the libraries they were built against.
LIBS="$BIN/lib:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu"
[ -d "$BIN/cuda-lib" ] && LIBS="$BIN/cuda-lib:$LIBS"
export LD_LIBRARY_PATH="$LIBS:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
# The newest libcudnn outside the system folders (e.g. PyTorch's wheel), for the attn phase.
# On the H200 image: the system's is 9.14 in /usr/lib/x86_64-linux-gnu; PyTorch's is another.
other_cudnn() {
  find / -xdev -name 'libcudnn.so.9*' -path '*site-packages*' 2>/dev/null | head -1 \
    | xargs -r dirname
}
for phase in "$@"; do
  echo "=== phase $phase ($(date +%T))"
  IFS=: read -r name a1 a2 a3 <<<"$phase"
  case "$name" in
    info)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
      find / -xdev -name 'libcudnn.so.9*' -not -path '/proc/*' 2>/dev/null
      free -g
      ;;
    tests)
      # Every GPU test (the `gpu`-tagged targets of //engine/backend/cuda and //engine/comm/nccl)
      # and the library-version test, into OUT_DIR/gpu-tests-<date>.log: commit that file under
      # bench/results/ (one per run of the GPU suite). It ends with "N passed, N failed", after
      # "N skipped: t:Suite.Case ..." naming the cases a passing binary skipped (GTEST_SKIP).
      log="$OUT/gpu-tests-$(date -u +%F).log"
      # NCCL may live only in a Python wheel there.
      if [ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]; then
        nccl=$(find / -xdev -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)
        [ -n "$nccl" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$nccl")"
      fi
      {
        echo "# GPU test suite, bench/device_session.sh tests"
        echo "date: $(date -u '+%F %T UTC')"
        echo "commit: $(cat "$BIN/COMMIT" 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)"
        echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
          2>/dev/null | head -1)"
      } | tee "$log"
      passed=0
      failed=0
      skipped_cases=()
      for t in library_versions_loaded_test rmsnorm_test cuda_allocator_test cuda_ops_test \
        attention_test hopper_attention_test cuda_train_test copy_stream_test nccl_comm_test \
        host_adamw_gpu_test; do
        start=$(date +%s)
        # hopper_attention_test generates and compares inputs at S = 65536 on the host.
        limit=240
        [ "$t" = hopper_attention_test ] && limit=420
        if timeout "$limit" "$BIN/$t" >"$OUT/t_$t.txt" 2>&1; then
          status=PASSED
          passed=$((passed + 1))
          for c in $(grep -oE '^\[  SKIPPED \] [A-Za-z0-9_/]+\.[A-Za-z0-9_/]+' "$OUT/t_$t.txt" \
            | awk '{print $4}' | sort -u); do
            skipped_cases+=("$t:$c")
          done
        else
          status=FAILED
          failed=$((failed + 1))
        fi
        {
          echo "$status: $t ($(($(date +%s) - start)) s)"
          grep -E -e "^\[  (FAILED|PASSED|SKIPPED) |^\[  +OK|worst relative|Failure|error" \
            -e "^(cuDNN|NCCL) " "$OUT/t_$t.txt" | head -40 | sed 's/^/  /'
        } | tee -a "$log"
        # A failed test's whole output stays (OUT_DIR/t_NAME.txt): the lines above are a digest.
        [ "$status" = PASSED ] && rm -f "$OUT/t_$t.txt"
      done
      echo "${#skipped_cases[@]} skipped:" ${skipped_cases[@]+"${skipped_cases[@]}"} | tee -a "$log"
      echo "$passed passed, $failed failed" | tee -a "$log"
      ;;
    attn)
      exec 3>&2 2>>"$OUT/attn.log"
      timeout 120 "$BIN/attention_bench" | tee -a "$OUT/attn.jsonl"
      timeout 120 "$BIN/attention_bench" --cudnn_heuristics=A,B,FALLBACK \
        | sed 's/"impl": "cudnn"/"impl": "cudnn-heur-A-B-FALLBACK"/' | tee -a "$OUT/attn.jsonl"
      lib=$(other_cudnn)
      if [ -n "$lib" ]; then
        echo "other cuDNN: $lib"
        LD_LIBRARY_PATH="$lib:$LD_LIBRARY_PATH" timeout 120 "$BIN/attention_bench" \
          | sed 's/"impl": "cudnn"/"impl": "cudnn-other-lib"/' | tee -a "$OUT/attn.jsonl"
      fi
      exec 2>&3
      grep -E "chose|cannot|failed" "$OUT/attn.log"
      ;;
    sweep)
      # (The frontend's unified forward node needs cuDNN 9.21 for causal masks: on 9.14 both
      # passes are its composite node, whose engines the sweep enumerates.)
      timeout "${SWEEP_TIMEOUT:-300}" "$BIN/attention_bench" --cudnn_sweep="$a2" \
        --shapes="$(echo "$a1" | tr 'x+' ':,')" --iters=3 --passes=fwd,bwd 2>>"$OUT/sweep.log" \
        | sed 's/"impl": "cudnn"/"impl": "cudnn-sweep"/' | tee -a "$OUT/attn.jsonl"
      grep -E "chose|sweep:" "$OUT/sweep.log"
      ;;
    sdpa)
      # The frontend's forward nodes side by side at SHAPES (head_dim x Hq x Hkv x S, '+' between
      # shapes): composite (forward and backward; the backward has only that node), unified and
      # the frontend's own choice (forward). The unified node needs the binary built against
      # cuDNN >= 9.21 headers (bench/collect_wheel_libs.sh) as well as that library loaded.
      shapes=$(echo "$a1" | tr 'x+' ':,')
      for impl in ${SDPA_IMPLS:-composite unified auto}; do
        passes=fwd
        [ "$impl" = composite ] && passes=fwd,bwd
        echo "--- --cudnn_forward_impl=$impl" >>"$OUT/sdpa.log"
        timeout "${SDPA_TIMEOUT:-150}" "$BIN/attention_bench" --cudnn_forward_impl=${impl/auto/} \
          --shapes="$shapes" --iters="${a2:-2}" --passes=$passes 2>>"$OUT/sdpa.log" \
          | sed "s/\"impl\": \"cudnn\"/\"impl\": \"cudnn-$impl\"/" | tee -a "$OUT/sdpa.jsonl"
      done
      grep -E "chose|cannot|failed|refused|requires" "$OUT/sdpa.log" | head -40
      ;;
    hopperfwd)
      timeout "${TRAIN_TIMEOUT:-420}" "$BIN/attention_bench" --shapes="$(echo "$a1" | tr 'x+' ':,')" \
        --forward=cudnn,hopper,auto --iters="${a2:-3}" --passes=fwd,fwd+bwd \
        2>>"$OUT/hopperfwd.log" | tee -a "$OUT/hopperfwd.jsonl"
      grep -E "attention forward|chose|cannot|failed" "$OUT/hopperfwd.log" | head -40
      ;;
    hopper)
      timeout "${TRAIN_TIMEOUT:-420}" "$BIN/attention_bench" --shapes="$(echo "$a1" | tr 'x+' ':,')" \
        --forward="${FORWARDS:-cudnn,hopper}" --backward="${BACKWARDS:-cudnn,hopper}" \
        --iters="${a2:-3}" --passes="${PASSES:-bwd,fwd+bwd}" \
        2>>"$OUT/hopper.log" | tee -a "$OUT/hopper.jsonl"
      grep -E "attention (forward|backward)|chose|cannot|failed" "$OUT/hopper.log" | head -40
      ;;
    kernels)
      timeout 120 "$BIN/norm_bench" | tee -a "$OUT/kernels.jsonl"
      timeout 120 "$BIN/gemm_bench" | tee -a "$OUT/kernels.jsonl"
      ;;
    daemon)
      D=/tmp/ithaca-daemon-phase
      rm -rf "$D" && mkdir -p "$D/run" "$D/state"
      for _ in $(seq "${CORPUS_REPEAT:-1}"); do cat engine/data/testdata/tiny_corpus.txt; done \
        >"$D/run/corpus.txt"
      tools/tokenize/ithaca-tokenize --no-progress --output "$D/run/corpus" "$D/run/corpus.txt"
      gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
      backend=cuda
      [ "$gpus" = 0 ] && backend=cpu
      sed -e "s|@RUN@|$D/run|g" -e "s|@BACKEND@|$backend|" -e "s|@WORLD@|1|" -e "s|@SP@|1|" \
        tools/demo_job.toml > "$D/run/job.toml"
      sets=()
      if [ -z "$a1" ]; then
        sets=(--set data.document_mask=true --set eval.path="$D/run/corpus/train-00000.tok"
              --set eval.every=20 --set eval.batches=2)
      else
        for kv in ${a1//+/ }; do sets+=(--set "$kv"); done
      fi
      root=(); [ "$(id -u)" = 0 ] && root=(--allow-root-workers)
      "$BIN/ithacad" --state-dir "$D/state" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
        --worker-binary "$BIN/ithaca-worker" --allowed-roots "$D" "${root[@]}" \
        >>"$OUT/daemon.log" 2>&1 &
      dpid=$!
      for _ in $(seq 100); do [ -s "$D/state/ithacad.addr" ] && break; sleep 0.1; done
      export ITHACA_HOME="$D/state"
      job=$("$BIN/ithaca" submit "$D/run/job.toml" -o name "${sets[@]}")
      echo "=== $job: ${sets[*]}" | tee -a "$OUT/daemon.log" "$OUT/daemon-steps.log"
      timeout "${TRAIN_TIMEOUT:-420}" "$BIN/ithaca" watch "$job" 2>&1 | tee -a "$OUT/daemon.log" \
        | tail -12
      "$BIN/ithaca" status "$job" | tee -a "$OUT/daemon.log" | head -40
      "$BIN/ithaca" logs "$job" --steps >>"$OUT/daemon-steps.log" 2>&1
      kill -TERM "$dpid"; wait "$dpid"
      cat "$D/state/jobs/$job/rank-0.log" >>"$OUT/daemon.log" 2>/dev/null
      # The job's export (checkpoint.export) scored by transformers in float32 against
      # ithaca-model-loss on the first 512 tokens, where transformers is installed.
      E=$D/run/checkpoints/export
      if [ -f "$E/config.json" ] && [ -x "$BIN/ithaca-model-loss" ] &&
        python3 -c 'import transformers' 2>/dev/null; then
        python3 -c "import struct, json, sys
b = open(sys.argv[1], 'rb').read()
json.dump({'input_ids': list(struct.unpack('<512I', b[128:128 + 2048]))}, open(sys.argv[2], 'w'))" \
          "$D/run/corpus/train-00000.tok" "$D/ids.json"
        "$BIN/ithaca-model-loss" "$E" "$D/ids.json" >"$D/ithaca_loss.json"
        echo "=== $job export: transformers (float32) against ithaca-model-loss" | tee -a "$OUT/daemon.log"
        python3 tests/golden/verify_export.py "$E" "$D/ids.json" --dtype float32 \
          --compare "$D/ithaca_loss.json" 2>/dev/null | tee -a "$OUT/daemon.log"
      fi
      ;;
    pin)
      timeout 300 "$BIN/pin_bench" --sizes_gib="${PIN_GIB:-4,16}" | tee -a "$OUT/pin.jsonl"
      ;;
    docattn)
      timeout "${TRAIN_TIMEOUT:-420}" "$BIN/attention_bench" --shapes="64:32:8:$a1" \
        --doc_len="$a2" --iters=3 --passes=fwd,bwd --forward="${FORWARDS:-cudnn}" \
        --backward="${BACKWARDS:-cudnn}" 2>>"$OUT/attn.log" | tee -a "$OUT/docattn.jsonl"
      ;;
    winattn)
      timeout "${TRAIN_TIMEOUT:-420}" "$BIN/attention_bench" --shapes="$(echo "$a1" | tr 'x+' ':,')" \
        --window="$a2" --iters=3 --passes="${PASSES:-fwd,bwd,fwd+bwd}" --forward=cudnn,hopper \
        --backward=cudnn,hopper 2>>"$OUT/attn.log" | tee -a "$OUT/winattn.jsonl"
      ;;
    train)
      timeout "${TRAIN_TIMEOUT:-420}" "$BIN/train_bench" --recompute=attention-aware \
        --seq_lens="$a1" ${a2//+/ } 2> >(tee -a "$OUT/train.log" >&2) | tee -a "$OUT/train.jsonl"
      ;;
    probe)
      timeout "${TRAIN_TIMEOUT:-420}" "$BIN/train_bench" --recompute=attention-aware \
        --probe="$a1" --seq_lens="$a2" ${a3//+/ } 2> >(tee -a "$OUT/train.log" >&2) \
        | tee -a "$OUT/train.jsonl"
      ;;
    parallel)
      # NCCL_NVLS_ENABLE=0 (above) holds here too. timeout signals the whole process group, so
      # the forked ranks end with it.
      timeout "${TRAIN_TIMEOUT:-420}" "$BIN/parallel_bench" --world="$a1" --sp="$a1" \
        --recompute=attention-aware --seq_lens="$a2" --timeline="$OUT/timeline" ${a3//+/ } \
        2> >(tee -a "$OUT/parallel.log" >&2) | tee -a "$OUT/parallel.jsonl"
      ;;
    rehearse)
      if [ ! -f "$OUT/.rehearsal_tested" ] && [ -x "$BIN/cuda_rehearsal_test" ]; then
        "$BIN/cuda_rehearsal_test" 2>&1 | tee -a "$OUT/rehearsal.log"
        touch "$OUT/.rehearsal_tested"
      fi
      timeout "${TRAIN_TIMEOUT:-420}" "$BIN/parallel_bench" --rehearse --world="$a1" --sp="$a1" \
        --recompute=attention-aware --seq_lens="$a2" ${a3//+/ } \
        2> >(tee -a "$OUT/rehearsal.log" >&2) | tee -a "$OUT/rehearsal.jsonl"
      ;;
    ckpt)
      df -h "$(dirname "${a3:-/tmp/ithaca-ckpt-bench}")" | tail -1
      timeout "${CKPT_TIMEOUT:-570}" "$BIN/checkpoint_bench" --model="$a1" --backend=cuda \
        --nproc="${a2:-1}" --dir="${a3:-/tmp/ithaca-ckpt-bench}" \
        2> >(tee -a "$OUT/checkpoint.log" >&2) | sed -E 's/^\[rank [0-9]+\] //' \
        | tee -a "$OUT/checkpoint.jsonl"
      ;;
  esac
done
