#!/bin/bash
# ithaca-export end to end: a short training run's checkpoint exported as bf16 (several shards)
# and f32, read back by the PyPI safetensors package (tests/python/export_interop.py under the
# project's .venv Python, as tests/python/safetensors_interop_test.sh finds it), scored by
# ithaca-model-loss, and bad input: each a clear error naming the thing, nothing left behind.
# Arguments: <export_test_job> <ithaca-export> <ithaca-model-loss> <corpus> <export_interop.py>.
set -euo pipefail
JOB=$1 EXPORT=$2 LOSS=$3 CORPUS=$4 INTEROP=$5
PY="${ITHACA_PYTHON:-$(cd "$(dirname "$(readlink -f "$INTEROP")")/../.." && pwd)/.venv/bin/python}"
T=$(mktemp -d "${TEST_TMPDIR:-/tmp}/export_cli.XXXXXX")
fail() { echo "FAIL: $*"; exit 1; }

"$JOB" "$T/job" "$CORPUS" > "$T.job.log" || { cat "$T.job.log"; fail "the training run failed"; }
CKPT=$T/job/checkpoints MODEL=$T/job/source_model
mkdir "$T/out"
"$EXPORT" "$CKPT" --out "$T/out/bf16" --dtype bf16 --source-model "$MODEL" \
  --max-shard-bytes 40000
"$EXPORT" --help | grep -q -- "--source-model" || fail "ithaca-export --help lacks --source-model"
"$EXPORT" --help | grep -q -- "--source_model" && fail "ithaca-export --help spells --source_model"
# The old underscore spelling still works, warning with the new one (docs/cli.md).
"$EXPORT" "$CKPT" --out "$T/out/f32" --dtype f32 --source_model "$MODEL" 2> "$T.old.stderr"
grep -qF "warning: ithaca-export: --source_model is the old spelling; use --source-model" \
  "$T.old.stderr" || fail "no deprecation warning for --source_model: $(cat "$T.old.stderr")"
# Without --source-model: the checkpoint records the model the run started from.
"$EXPORT" "$CKPT" --out "$T/recorded" --dtype bf16
for f in tokenizer.json generation_config.json; do
  cmp "$MODEL/$f" "$T/recorded/$f" || fail "$f not copied from the recorded source model"
done
rm -r "$T/recorded"
for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
  cmp "$MODEL/$f" "$T/out/bf16/$f" || fail "$f not copied"
done
[ "$(ls -A "$T/out")" = "$(printf 'bf16\nf32')" ] || fail "leftovers in $T/out: $(ls -A "$T/out")"
"$PY" "$INTEROP" "$T/out/bf16" "$T/out/f32"

# The f32 export scores exactly as the checkpoint does.
python3 -c 'import json,sys; json.dump({"input_ids": list(open(sys.argv[1],"rb").read(150))},
  open(sys.argv[2],"w"))' "$CORPUS" "$T/ids.json"
STEP=$(ls -d "$CKPT"/step-*)
[ "$("$LOSS" "$T/out/f32" "$T/ids.json")" = "$("$LOSS" "$STEP/model" "$T/ids.json")" ] ||
  fail "f32 export loss differs from the checkpoint's"

# Bad input: exit status, a message naming the culprit, nothing new on disk.
expect_error() {  # <status> <message part> <command...>
  local want=$1 part=$2
  shift 2
  local before after rc=0
  before=$(find "$T" | sort)
  "$@" > "$T.stdout" 2> "$T.stderr" || rc=$?
  after=$(find "$T" | sort)
  [ "$rc" = "$want" ] || fail "$* exited $rc, expected $want: $(cat "$T.stderr")"
  grep -qF -- "$part" "$T.stderr" || fail "$* said \"$(cat "$T.stderr")\", lacking \"$part\""
  [ "$before" = "$after" ] || fail "$* left files behind: $(diff <(echo "$before") <(echo "$after"))"
  echo "ok: $(cat "$T.stderr")"
}
expect_error 1 "$T/missing: no such checkpoint directory" "$EXPORT" "$T/missing" --out "$T/x"
cp -r "$STEP" "$T/broken"
echo '{"format": "ithaca-manifest-v1", "files": 7}' > "$T/broken/manifest.json"
expect_error 1 "$T/broken/manifest.json: corrupt" "$EXPORT" "$T/broken" --out "$T/x"
expect_error 1 "$T/out/bf16: exists and is not an empty directory" \
  "$EXPORT" "$CKPT" --out "$T/out/bf16"
expect_error 2 "--dtype fp8: must be bf16 or f32" "$EXPORT" "$CKPT" --out "$T/x" --dtype fp8
expect_error 1 "$T/nomodel: no such source model directory" \
  "$EXPORT" "$CKPT" --out "$T/x" --source-model "$T/nomodel"
expect_error 1 "is not a LoRA run's checkpoint (its state.json records no [lora])" \
  "$EXPORT" "$CKPT" --out "$T/x" --merge-base "$MODEL"
echo PASS
