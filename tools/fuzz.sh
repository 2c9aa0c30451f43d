#!/bin/bash
# Fuzzes the parsers of untrusted input with libFuzzer under AddressSanitizer and
# UndefinedBehaviorSanitizer (leaks are reported too). The harnesses are in fuzz/, their seed
# corpora in fuzz/corpus/<fuzzer>/.
#
#   tools/fuzz.sh [-t SECONDS] [FUZZER...]     each fuzzer runs SECONDS (default 30)
#   tools/fuzz.sh -b                           build only
#
# FUZZERS: the harnesses fuzz/*_fuzzer.cc, by name without the suffix (`all` below; default: all,
# and an unknown name lists them). Built with clang++ outside
# Bazel (which builds with gcc) into $FUZZ_OUT (default /tmp/ithaca-fuzz-$USER); new inputs are
# kept in $FUZZ_OUT/corpus/<fuzzer>, never in the seed directory. One line per fuzzer:
# "fuzz: <fuzzer> PASSED in Ns" or "fuzz: <fuzzer> FAILED in Ns: <artifact>", where the artifact
# is the input that crashed, leaked, hung (-timeout) or allocated too much (-rss_limit_mb). Turn
# such an input into a regression test in the parser's test file and add it to the corpus. A
# failure also prints the harness's own message ("fuzz check: ...") and the input in hex.
# Exit status 1 when any fuzzer failed or the build failed.
set -o pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-30}
build_only=0
while getopts "t:b" opt; do
  case $opt in
    t) seconds=$OPTARG ;;
    b) build_only=1 ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
all=(job_spec config_json safetensors token_file data_pattern utf8)
fuzzers=("$@")
[ ${#fuzzers[@]} -gt 0 ] || fuzzers=("${all[@]}")

CXX=${FUZZ_CXX:-$(command -v clang++-14 || command -v clang++)}
if [ -z "$CXX" ]; then echo "fuzz: clang++ not found (apt-get install clang)"; exit 1; fi
out=${FUZZ_OUT:-/tmp/ithaca-fuzz-${USER:-$(id -u)}}
mkdir -p "$out/obj" "$out/corpus" "$out/artifacts"

# The engine sources each harness needs: the .cc files of its Bazel library and everything
# that depends on, asked of Bazel (so a file split in the build is followed here).
bazel() { command bazel ${ITHACA_OUTPUT_BASE:+--output_base="$ITHACA_OUTPUT_BASE"} "$@"; }
targets_job_spec="//engine/spec:job_spec + //engine/spec:overrides"
targets_config_json="//engine/model:config"
targets_safetensors="//engine/model:safetensors"
targets_token_file="//engine/data:token_file + //engine/data:data_loader"
targets_data_pattern="//engine/core:path_policy"
targets_utf8="//engine/core:utf8"
sources() {  # fuzzer name -> its engine sources, one per line
  local -n targets="targets_$1"
  bazel query --noshow_progress "kind('source file', deps($targets))" 2>/dev/null |
    grep -E '^//engine/.*\.cc$' | sed 's#^//##; s#:#/#'
}

flags=(-std=c++17 -g -O1 -fno-omit-frame-pointer -I. $(pkg-config --cflags absl_strings)
  -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined)
libs=$(pkg-config --libs absl_status absl_statusor absl_strings absl_str_format absl_time \
  protobuf) || {
  echo "fuzz: pkg-config found no absl (apt-get install libabsl-dev)"; exit 1; }

# Objects are rebuilt when their source or any header of the repository is newer.
newest_header=$(git ls-files -- '*.h' | xargs ls -t 2>/dev/null | head -1)
compile() {  # source -> object path on stdout
  local src=$1 obj="$out/obj/${1//\//_}.o"
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ "$newest_header" -nt "$obj" ]; then
    "$CXX" "${flags[@]}" -c "$src" -o "$obj" >&2 || return 1
  fi
  echo "$obj"
}

build() {  # fuzzer name -> binary
  local name=$1 objs=() src obj extra
  extra=${srcs[$name]}
  [ -n "$extra" ] || { echo "fuzz: bazel query found no sources" >&2; return 1; }
  for src in "fuzz/${name}_fuzzer.cc" $extra; do
    obj=$(compile "$src") || return 1
    objs+=("$obj")
  done
  "$CXX" -fsanitize=fuzzer,address,undefined "${objs[@]}" $libs -o "$out/${name}_fuzzer"
}

# Every fuzzer's sources are asked of Bazel before any is built or run, so that the runs need no
# Bazel server (tools/test.sh runs them beside the sanitizers' Bazel builds).
declare -A srcs
for name in "${fuzzers[@]}"; do
  if [[ ! " ${all[*]} " == *" $name "* ]]; then
    echo "fuzz: unknown fuzzer '$name' (one of: ${all[*]})"; exit 2
  fi
  srcs[$name]=$(sources "$name")
done

failed=0
for name in "${fuzzers[@]}"; do
  if ! build "$name"; then
    echo "fuzz: $name FAILED TO BUILD"
    failed=1
    continue
  fi
  [ "$build_only" -eq 1 ] && { echo "fuzz: built $out/${name}_fuzzer"; continue; }
  mkdir -p "$out/corpus/$name"
  log="$out/$name.log"
  start=$SECONDS
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: a parser that allocates
  # without bound on a small input is a bug, not a big file. -max_len: headers are small.
  # FUZZ_SEED fixes libFuzzer's random seed (tools/test.sh does, so CI is reproducible); unset,
  # every run explores differently.
  "$out/${name}_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    ${FUZZ_SEED:+-seed="$FUZZ_SEED"} \
    -max_len=8192 -print_final_stats=1 -artifact_prefix="$out/artifacts/$name-" \
    "$out/corpus/$name" "fuzz/corpus/$name" >"$log" 2>&1
  rc=$?
  took=$((SECONDS - start))
  if [ $rc -eq 0 ]; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "fuzz: $name PASSED in ${took}s (${execs:-?} inputs)"
  else
    failed=1
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|fuzz check:)' "$log" | head -5
    echo "fuzz: $name FAILED in ${took}s: ${artifact:-see $log}"
    # CI keeps only this output: the input itself, so that it can be rebuilt from the log
    # (xxd -r -p) and run again (<fuzzer> FILE).
    if [ -n "$artifact" ] && [ -f "$artifact" ]; then
      echo "fuzz: $name input ($(stat -c %s "$artifact") bytes, hex, first 2048):" \
        "$(head -c 2048 "$artifact" | od -An -v -tx1 | tr -d ' \n')"
    fi
  fi
done
exit $failed
