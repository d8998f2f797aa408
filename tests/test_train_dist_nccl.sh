#!/bin/sh
# test_train_dist_nccl.sh -- `mpirun -np N hq train --device cuda` (train/dist.c over NCCL, one
# GPU per rank, docs/distributed.md). With one GPU: `mpirun -np 1` takes the NCCL path (a
# communicator of one rank) and reaches one process's held-out loss (within 1e-4 or 5e-4), its
# --verify-resume continues bit for bit, and more ranks than GPUs are refused on every rank.
# With two GPUs or more, also: 2 ranks reach one GPU's held-out loss (the same bounds) and two runs
# print the same losses to the last digit, the wire line, --grad-dtype bf16 (twice the same,
# within 0.01 of FP32 gradients), and a checkpoint of 2 ranks resumes with 2 (the uninterrupted
# run's final file, byte for byte) and with 1. Skips (77) without mpirun, python3, a GPU, or an hq built with CUDA, MPI and NCCL;
# with one GPU it skips after the one-GPU part, saying so.
set -u
LC_ALL=C; export LC_ALL
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
mpirun=${HQ_MPIRUN:-}
[ -n "$mpirun" ] && command -v "$mpirun" >/dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3 (reads the JSON)"; exit 77; }
. "${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/mpirun_env.sh"   # $flags, sanitizers
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_train_nccl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$HQ_TEST_SRCDIR/train_corpus.sh"
train_corpus "$tmp/words.txt" || { echo "SKIP: no corpus"; exit 77; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
# CUDA_VISIBLE_DEVICES narrows what the ranks see (a list of indices or UUIDs)
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  gpus=$(printf '%s\n' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
fi
[ "${gpus:-0}" -ge 1 ] || { echo "SKIP: no GPU (nvidia-smi -L lists none)"; exit 77; }

# an hq without NCCL (or MPI) says so when 2 ranks ask for GPUs
# shellcheck disable=SC2086
timeout 300 "$mpirun" $flags -np 2 "$hq" train --device cuda --data "$tmp/words.txt" --steps 1 \
  --batch 128 --hidden 128 --layers 1 --baseline none > /dev/null 2> "$tmp/probe"
grep -q "built without NCCL\|built without MPI" "$tmp/probe" &&
  { echo "SKIP: $(grep -m1 'built without' "$tmp/probe")"; exit 77; }

# the model of test_train_dist.sh: [128, 128] weights, whole MXFP8 blocks on 2 ranks
args="train --device cuda --data $tmp/words.txt --steps 40 --batch 128 --hidden 128 --layers 1
      --eval-every 20 --log-every 10 --recipe $conf/examples/mxfp8.ini
      --recipe $conf/examples/fp8_current.ini --recipe $conf/examples/fp8_delayed.ini --json"
# shellcheck disable=SC2086
"$hq" $args > "$tmp/r1.json" 2> "$tmp/r1.err" || { cat "$tmp/r1.err"; fail "one process on a GPU"; }

# within NAME.json NAME2.json LABEL: every run's held-out loss within 1e-4 of the reference's
# (fp32, per-tensor FP8), or 5e-4 where a BF16 rounding can amplify a sum's order (the BF16 head
# of mxfp8.ini and fp8_delayed.ini; tests/test_train_dist.sh says why)
within() {
  python3 -c 'import json,sys
one = {r["name"]: r["eval_loss"] for r in json.load(open(sys.argv[1]))["recipes"]}
many = {r["name"]: r["eval_loss"] for r in json.load(open(sys.argv[2]))["recipes"]}
assert sorted(many) == sorted(one), (sorted(one), sorted(many))
for k in sorted(one):
    d = abs(many[k] - one[k])
    print("%-20s one GPU %.9g  %s %.9g  difference %.2g%s" % (k, one[k], sys.argv[3], many[k], d, " (identical)" if d == 0 else ""))
    bound = 1e-4 if k in ("fp32", "fp8-current-e4m3") else 5e-4
    if not d <= bound: sys.exit("%s: %s differs from one GPU by %.3g" % (k, sys.argv[3], d))' "$1" "$2" "$3"
}
# mpirun -np 1: the NCCL path with one rank
# shellcheck disable=SC2086
timeout 600 "$mpirun" $flags -np 1 "$hq" $args > "$tmp/n1.json" 2> "$tmp/n1.err" ||
  { cat "$tmp/n1.err"; fail "mpirun -np 1 hq train --device cuda"; }
grep -q "^hq train: 1 rank on GPUs through NCCL" "$tmp/n1.err" || { cat "$tmp/n1.err"; fail "-np 1 did not take the NCCL path"; }
within "$tmp/r1.json" "$tmp/n1.json" "NCCL, 1 rank" || fail "-np 1: the held-out loss"

# the checkpoints of the NCCL path (rank 0 gathers the shards through host memory): with one
# rank, --verify-resume reloads mid-run and continues bit for bit
ck="train --device cuda --data $tmp/words.txt --steps 40 --batch 128 --hidden 128 --layers 1
    --recipe $conf/examples/fp8_delayed.ini --baseline none --json"
# shellcheck disable=SC2086
timeout 600 "$mpirun" $flags -np 1 "$hq" $ck --verify-resume > "$tmp/v1.json" 2> "$tmp/v1.err" ||
  { cat "$tmp/v1.err"; fail "mpirun -np 1 hq train --device cuda --verify-resume"; }
grep -q "^hq train: fp8-delayed-hybrid: resume verified: the checkpoint of step 20 reloaded" "$tmp/v1.err" ||
  { cat "$tmp/v1.err"; fail "-np 1 --verify-resume on the NCCL path"; }

# more ranks than GPUs: refused on every rank before any NCCL call
np=$((gpus + 1))
rm -rf "$tmp/out"
# shellcheck disable=SC2086
timeout 300 "$mpirun" $flags --output-filename "$tmp/out" -np $np "$hq" $args > /dev/null 2> "$tmp/e" &&
  fail "-np $np on $gpus GPUs: not refused"
r=0
while [ $r -lt $np ]; do
  f=$(ls "$tmp"/out/*/rank.$r/stderr 2>/dev/null)
  [ -n "$f" ] && grep -q "^hq train: rank $r: --device cuda across ranks takes one GPU per rank: this host runs $np ranks but sees $gpus GPU" "$f" ||
    { cat "$tmp/e" $f; fail "-np $np on $gpus GPUs: rank $r did not say why"; }
  r=$((r + 1))
done

[ "$gpus" -ge 2 ] || { echo "SKIP: the one-GPU part passed; the rest needs 2 GPUs (this machine has $gpus)"; exit 77; }
for k in a b; do
  # shellcheck disable=SC2086
  timeout 600 "$mpirun" $flags -np 2 "$hq" $args > "$tmp/n2$k.json" 2> "$tmp/n2$k.err" ||
    { cat "$tmp/n2$k.err"; fail "mpirun -np 2 hq train --device cuda"; }
done
losses() {
  python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["recipes"]:
    print(r["name"], r["eval_loss"], r["train_curve"], r["eval_curve"])' "$1"
}
losses "$tmp/n2a.json" > "$tmp/la"
losses "$tmp/n2b.json" > "$tmp/lb"
cmp -s "$tmp/la" "$tmp/lb" || { diff "$tmp/la" "$tmp/lb"; fail "2 GPUs: two runs printed different losses"; }
within "$tmp/r1.json" "$tmp/n2a.json" "2 GPUs" || fail "2 GPUs: the held-out loss"
grep -q "^hq train: fp8-current-e4m3: 2 ranks: per step and rank, quantized weights gathered 32768 bytes (a BF16 all-gather: 65536, 0.500x), FP32 weight gradients reduce-scattered 131072 bytes$" "$tmp/n2a.err" ||
  { cat "$tmp/n2a.err"; fail "2 GPUs: the wire line of fp8_current"; }

# --grad-dtype bf16 on 2 GPUs (the rounding and widening kernels of train/cast_cuda.cu around
# NCCL's BF16 reduce-scatter): two runs print the same losses, every recipe's held-out loss is
# the FP32 reduce-scatter's within 0.01 (as on the CPU), and half the gradient bytes travel
for k in a b; do
  # shellcheck disable=SC2086
  timeout 600 "$mpirun" $flags -np 2 "$hq" $args --grad-dtype bf16 > "$tmp/g2$k.json" 2> "$tmp/g2$k.err" ||
    { cat "$tmp/g2$k.err"; fail "mpirun -np 2 hq train --device cuda --grad-dtype bf16"; }
done
losses "$tmp/g2a.json" > "$tmp/ga"
losses "$tmp/g2b.json" > "$tmp/gb"
cmp -s "$tmp/ga" "$tmp/gb" || { diff "$tmp/ga" "$tmp/gb"; fail "2 GPUs --grad-dtype bf16: two runs printed different losses"; }
python3 -c 'import json,sys
f = {r["name"]: r["eval_loss"] for r in json.load(open(sys.argv[1]))["recipes"]}
b = {r["name"]: r["eval_loss"] for r in json.load(open(sys.argv[2]))["recipes"]}
for k in sorted(f):
    print("%-20s 2 GPUs: FP32 gradients %.9g  BF16 %.9g  difference %.2g" % (k, f[k], b[k], abs(b[k] - f[k])))
    if not abs(b[k] - f[k]) <= 0.01: sys.exit("%s: BF16 gradients %.6g, FP32 %.6g" % (k, b[k], f[k]))' \
  "$tmp/n2a.json" "$tmp/g2a.json" || fail "2 GPUs --grad-dtype bf16 against fp32"
grep -q "BF16 weight gradients reduce-scattered 65536 bytes$" "$tmp/g2a.err" ||
  { cat "$tmp/g2a.err"; fail "2 GPUs --grad-dtype bf16: the wire line"; }

# checkpoints: saved by 2 GPUs at step 20 of 40, resumed with 2 (byte for byte) and with 1
# shellcheck disable=SC2086
timeout 600 "$mpirun" $flags -np 2 "$hq" $ck --checkpoint "$tmp/k2-{step}.st" --checkpoint-every 20 > "$tmp/c2.json" 2> "$tmp/c2.err" ||
  { cat "$tmp/c2.err"; fail "2 GPUs with --checkpoint"; }
# shellcheck disable=SC2086
timeout 600 "$mpirun" $flags -np 2 "$hq" $ck --resume "$tmp/k2-20.st" --checkpoint "$tmp/r2.st" > "$tmp/r2.json" 2> "$tmp/r2.err" ||
  { cat "$tmp/r2.err"; fail "2 GPUs resumed with 2"; }
cmp -s "$tmp/r2.st" "$tmp/k2-40.st" || fail "2 GPUs resumed with 2: the final checkpoint is not the uninterrupted run's"
# shellcheck disable=SC2086
"$hq" $ck --resume "$tmp/k2-20.st" > "$tmp/r1c.json" 2> "$tmp/r1c.err" || { cat "$tmp/r1c.err"; fail "2 GPUs resumed with 1"; }
within "$tmp/c2.json" "$tmp/r1c.json" "saved by 2 GPUs, resumed with 1" || fail "2 GPUs resumed with 1: the held-out loss"
echo "PASS"
