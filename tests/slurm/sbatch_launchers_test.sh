#!/bin/bash
# On a real two-node Slurm (tests/slurm/slurm_local.sh, started here in the test's directory): the
# recipe docs/jobs.md gives for a job across nodes, `sbatch` of one task per node each running
# the per-node launcher (--nnodes $SLURM_NNODES --node-rank $SLURM_NODEID --rendezvous
# tcp:<first node>:PORT), trains a 2-node x 2-rank job to the same losses as the 4-rank job on
# one node. Needs root and `apt-get install slurm-wlm munge` (tools/setup.sh installs them).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin:/usr/bin"  # Bazel's test PATH lacks the daemons' directory
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v slurmctld >/dev/null || fail "no slurmctld: apt-get install -y slurm-wlm munge"
[ "$(id -u)" -eq 0 ] || fail "needs root (slurmd runs the nodes' tasks as root here)"

W=$PWD/worker/ithaca-worker
T=${TEST_TMPDIR:-$(mktemp -d)}
# Short: slurmd's step sockets live in its spool directory, and a unix socket path holds 108
# bytes (Bazel's TEST_TMPDIR is longer than that allows).
S=$(mktemp -d /tmp/ithaca-slurm-XXXXXX)
trap 'tests/slurm/slurm_local.sh stop "$S" >/dev/null 2>&1 || true; rm -rf "$S"' EXIT
tests/slurm/slurm_local.sh start "$S" 2 2 >/dev/null
export SLURM_CONF=$S/slurm.conf

tools/tokenize/ithaca-tokenize --no-progress --output "$T/corpus" \
  engine/data/testdata/tiny_corpus.txt >/dev/null
cat > "$T/job.toml" <<TOML
name = "slurm"
backend = "cpu"
[model]
preset = "tiny"
[data]
path = "$T/corpus/train-00000.tok"
seq_len = 64
[training]
steps = 6
lr = 3e-3
warmup_steps = 2
[parallel]
world = 4
[memory]
recompute = "full"
tile_tokens = 32
[metrics]
log_every = 1
TOML
cat > "$T/job.sbatch" <<SBATCH
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=5
#SBATCH --output=$T/slurm-%j.out
srun bash -c 'exec "$W" --standalone "$T/job.toml" --nproc 2 --nnodes \$SLURM_NNODES \
  --node-rank \$SLURM_NODEID --rendezvous tcp:\$SLURM_LAUNCH_NODE_IPADDR:29511 \
  > "$T/node-\$SLURM_NODEID.log" 2>&1'
SBATCH
timeout 120 sbatch --wait "$T/job.sbatch" >/dev/null || {
  squeue >&2 || true
  tail -n 20 "$T"/slurm-*.out "$T"/node-*.log "$S"/log/*.log >&2 || true
  fail "the sbatch job failed"
}
losses() { grep -oE '^step [0-9]+/6 \| loss [0-9.]+' "$1"; }
two_nodes=$(losses "$T/node-0.log")
[ "$(grep -c . <<<"$two_nodes")" -eq 6 ] || { cat "$T/node-0.log" >&2; fail "node 0 did not log 6 steps"; }
grep -q "node 1" "$T/node-1.log" 2>/dev/null || true  # node 1's launcher log (its ranks 2, 3)

timeout 300 "$W" --standalone "$T/job.toml" --nproc 4 > "$T/one-node.log" 2>&1 \
  || { cat "$T/one-node.log" >&2; fail "the one-node run failed"; }
one_node=$(losses "$T/one-node.log")
echo "2 nodes x 2 ranks (sbatch):"; echo "$two_nodes"
echo "1 node x 4 ranks:"; echo "$one_node"
[ "$two_nodes" = "$one_node" ] || fail "the losses differ"
echo PASS
