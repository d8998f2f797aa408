#!/bin/sh
# test_train_dist.sh -- `mpirun -np N hq train` (train/dist.c, docs/distributed.md) on a small
# generated corpus: with 2 and 4 ranks (the weights sharded by rows, the quantized shards
# gathered, the weight gradients reduce-scattered, the global batch split) the held-out loss of
# every recipe is 1 rank's within 1e-4 (same global batch, same seed) and two runs print the same
# losses to the last digit; the bytes on the wire per step equal what the shapes give; a shard
# that would split a 128-row fp8_block tile and a batch that does not split are refused on every
# rank; a checkpoint written by N ranks resumes with M (4 -> 2, 4 -> 1, 1 -> 4, 2 -> 4: the same
# layout whatever N, the same count continuing byte for byte, another within 1e-4 of 1 rank, two
# resumed runs bit-identical; --verify-resume too), and a corrupt or mismatched one is refused on
# every rank; --grad-dtype bf16 trains within 0.01 of fp32's held-out loss, bit-identically
# twice, with half the gradient bytes, and a bad value or one process is refused;
# --device cuda where it cannot run is refused on every rank, saying why. Skips (77)
# without mpirun, python3, or an hq built with MPI.
set -u
LC_ALL=C; export LC_ALL
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
mpirun=${HQ_MPIRUN:-}
[ -n "$mpirun" ] && command -v "$mpirun" >/dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3 (reads the JSON)"; exit 77; }
. "${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/mpirun_env.sh"   # $flags, sanitizers
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_train_dist.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

. "${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/train_corpus.sh"
train_corpus "$tmp/words.txt" || { echo "SKIP: no corpus"; exit 77; }
# H = 128: every weight is [128, 128] (fc1's input is C*E = 8*16, lm_head's 27 outputs padded to
# 128), so 2 and 4 ranks hold 64 and 32 rows of each: whole MXFP8 blocks (32 rows)
args="train --data $tmp/words.txt --steps 40 --batch 128 --hidden 128 --layers 1 --eval-every 20
      --log-every 10 --recipe $conf/examples/mxfp8.ini --recipe $conf/examples/fp8_current.ini
      --recipe $conf/examples/fp8_delayed.ini --json"
# shellcheck disable=SC2086
"$hq" $args > "$tmp/r1.json" 2> "$tmp/r1.err" || { cat "$tmp/r1.err"; fail "1 rank"; }
# shellcheck disable=SC2086
timeout 300 "$mpirun" $flags -np 2 "$hq" info > /dev/null 2>&1 || { echo "SKIP: mpirun cannot start 2 ranks here"; exit 77; }

# losses NAME.json: every run's held-out loss and both curves, as printed (%.9g)
losses() {
  python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["recipes"]:
    print(r["name"], r["eval_loss"], r["train_curve"], r["eval_curve"])' "$1"
}
losses "$tmp/r1.json" > "$tmp/l1"
for np in 2 4; do
  for k in a b; do
    # shellcheck disable=SC2086
    if ! timeout 600 "$mpirun" $flags -np $np "$hq" $args > "$tmp/r$np$k.json" 2> "$tmp/r$np$k.err"; then
      grep -q "this hq was built without MPI" "$tmp/r$np$k.err" && { echo "SKIP: hq built without MPI"; exit 77; }
      cat "$tmp/r$np$k.err"; fail "mpirun -np $np hq train"
    fi
  done
  losses "$tmp/r${np}a.json" > "$tmp/l${np}a"
  losses "$tmp/r${np}b.json" > "$tmp/l${np}b"
  cmp -s "$tmp/l${np}a" "$tmp/l${np}b" ||
    { diff "$tmp/l${np}a" "$tmp/l${np}b"; fail "-np $np: two runs printed different losses"; }
  # the same global batch and seed as 1 rank: FP32 sums in another order, nothing else (the
  # activations' and gradients' amaxes are shared too), so fp32 and per-tensor FP8 agree within
  # 1e-4; a sum one ulp apart can cross a BF16 rounding boundary (the BF16 head of mxfp8.ini
  # and fp8_delayed.ini), after which the runs part slowly: those within 5e-4 (a wrong shard or
  # reduction moves the loss by 1e-2 or more)
  python3 -c 'import json,sys
one = {r["name"]: r["eval_loss"] for r in json.load(open(sys.argv[1]))["recipes"]}
many = {r["name"]: r["eval_loss"] for r in json.load(open(sys.argv[2]))["recipes"]}
assert sorted(one) == ["fp32", "fp8-current-e4m3", "fp8-delayed-hybrid", "mxfp8"], sorted(one)
assert sorted(many) == sorted(one), sorted(many)
for k in sorted(one):
    d = abs(many[k] - one[k])
    print("%-20s 1 rank %.9g  %s ranks %.9g  difference %.2g" % (k, one[k], sys.argv[3], many[k], d))
    bound = 1e-4 if k in ("fp32", "fp8-current-e4m3") else 5e-4
    if not d <= bound: sys.exit("%s: %s ranks differ from 1 by %.3g" % (k, sys.argv[3], d))' \
    "$tmp/r1.json" "$tmp/r${np}a.json" $np || fail "-np $np: the held-out loss is not 1 rank's"
  # rank 0 alone reports: one JSON document (parsed above), one wire line per run; per step and
  # rank, fp8_current gathers both [128, 128] weights as 1-byte codes with the columnwise copy
  # rebuilt (2 * 128 * 128 = 32768 bytes; BF16: 65536) and reduce-scatters their FP32 gradients
  # (2 * 128 * 128 * 4 = 131072 bytes)
  [ "$(grep -c ' ranks: per step and rank' "$tmp/r${np}a.err")" -eq 4 ] ||
    { cat "$tmp/r${np}a.err"; fail "-np $np: not one wire line per run"; }
  grep -q "^hq train: fp8-current-e4m3: $np ranks: per step and rank, quantized weights gathered 32768 bytes (a BF16 all-gather: 65536, 0.500x), FP32 weight gradients reduce-scattered 131072 bytes$" "$tmp/r${np}a.err" ||
    { cat "$tmp/r${np}a.err"; fail "-np $np: the wire line of fp8_current"; }
done

# --grad-dtype bf16 (docs/distributed.md): each rank's weight gradient rounded to BF16 (RNE),
# reduce-scattered with a BF16 sum, widened back for AdamW. It trains (every run's held-out loss
# falls), its held-out loss is the FP32 reduce-scatter's of the same rank count within 0.01 (the
# gradients carry 8 significant bits instead of 24; the weights, moments and updates stay FP32),
# two runs print the same losses to the last digit (MPI's reduce-scatter adds the ranks' parts in
# an order fixed by the count of ranks), and the gradients' bytes on the wire halve: fp8_current's
# two [128, 128] gradients are 2 * 128 * 128 * 2 = 65536 bytes per step and rank.
for np in 2 4; do
  for k in a b; do
    # shellcheck disable=SC2086
    timeout 600 "$mpirun" $flags -np $np "$hq" $args --grad-dtype bf16 > "$tmp/b$np$k.json" 2> "$tmp/b$np$k.err" ||
      { cat "$tmp/b$np$k.err"; fail "mpirun -np $np hq train --grad-dtype bf16"; }
    losses "$tmp/b$np$k.json" > "$tmp/lb$np$k"
  done
  cmp -s "$tmp/lb${np}a" "$tmp/lb${np}b" ||
    { diff "$tmp/lb${np}a" "$tmp/lb${np}b"; fail "-np $np --grad-dtype bf16: two runs printed different losses"; }
  python3 -c 'import json,sys
fp32 = {r["name"]: r for r in json.load(open(sys.argv[1]))["recipes"]}
bf16 = {r["name"]: r for r in json.load(open(sys.argv[2]))["recipes"]}
assert sorted(bf16) == sorted(fp32), sorted(bf16)
for k in sorted(fp32):
    a, b = fp32[k]["eval_loss"], bf16[k]["eval_loss"]
    first = bf16[k]["eval_curve"][0]
    first = first["loss"] if isinstance(first, dict) else first[-1]
    print("%-20s %s ranks: FP32 gradients %.9g  BF16 %.9g  difference %.2g  (step 0: %.4g)" % (k, sys.argv[3], a, b, abs(a - b), first))
    if not b < first - 0.1: sys.exit("%s: --grad-dtype bf16 did not train (%.4g -> %.4g)" % (k, first, b))
    if not abs(a - b) <= 0.01: sys.exit("%s: BF16 gradients differ from FP32 by %.3g" % (k, abs(a - b)))' \
    "$tmp/r${np}a.json" "$tmp/b${np}a.json" $np || fail "-np $np: --grad-dtype bf16 against fp32"
  grep -q "^hq train: fp8-current-e4m3: $np ranks: per step and rank, quantized weights gathered 32768 bytes (a BF16 all-gather: 65536, 0.500x), BF16 weight gradients reduce-scattered 65536 bytes$" "$tmp/b${np}a.err" ||
    { cat "$tmp/b${np}a.err"; fail "-np $np --grad-dtype bf16: the wire line of fp8_current"; }
done
# a bad value, and bf16 in one process (nothing to reduce), are refused saying why
"$hq" train --data "$tmp/words.txt" --steps 2 --grad-dtype fp16 > "$tmp/o" 2> "$tmp/e" &&
  fail "--grad-dtype fp16 accepted"
grep -qFx "hq train: --grad-dtype 'fp16' is not fp32 or bf16" "$tmp/e" || { cat "$tmp/e"; fail "--grad-dtype fp16: the message"; }
"$hq" train --data "$tmp/words.txt" --steps 2 --batch 128 --hidden 128 --layers 1 --grad-dtype bf16 \
  --recipe "$conf/examples/mxfp8.ini" > "$tmp/o" 2> "$tmp/e" && fail "--grad-dtype bf16 in one process accepted"
grep -qFx "hq train: --grad-dtype bf16 rounds the weight gradients for the reduce-scatter across ranks, and this run has one rank: run it under mpirun -np 2 or more, or leave --grad-dtype out" "$tmp/e" ||
  { cat "$tmp/e"; fail "--grad-dtype bf16 in one process: the message"; }

# refused_matching GREP_FLAGS NP MESSAGE ARGS...: mpirun -np NP hq ARGS fails, and every rank's
# stderr has exactly one line that `grep GREP_FLAGS MESSAGE` matches (each rank's output in its
# own file: mpirun would interleave; under ASan, LeakSanitizer's report of the suppressions
# follows it)
refused_matching() {
  gf=$1 np=$2 msg=$3; shift 3
  rm -rf "$tmp/out"
  # shellcheck disable=SC2086
  timeout 300 "$mpirun" $flags --output-filename "$tmp/out" -np $np "$hq" "$@" > "$tmp/o" 2> "$tmp/e" &&
    fail "mpirun -np $np hq $*: not refused"
  r=0
  while [ $r -lt $np ]; do
    f=$(ls "$tmp"/out/*/rank.$r/stderr 2>/dev/null)
    [ -n "$f" ] && [ "$(grep -c $gf -- "$msg" "$f")" -eq 1 ] ||
      { cat "$tmp/e" $f; fail "mpirun -np $np hq $*: rank $r did not say '$msg'"; }
    r=$((r + 1))
  done
}
# refused_everywhere NP MESSAGE ARGS...: refused, and every rank wrote the line MESSAGE
refused_everywhere() { refused_matching -Fx "$@"; }
# 2-D fp8_block shards of 64 rows would split its 128-row tiles: the gather helper's message
refused_everywhere 2 "hq train: recipe 'fp8-block' ($conf/examples/fp8_block.ini), step 0: layer fc1: the weight's gather: hq_gather_create of linear:weight:fc1: the shard of rank 0, rows [0, 64) (64 rows), would split a 128-row scaling block of w (fp8_block, rowwise, 128x128 blocks): every shard's rows must be a multiple of 128" \
  train --data "$tmp/words.txt" --steps 2 --batch 128 --hidden 128 --layers 1 --recipe "$conf/examples/fp8_block.ini"
refused_everywhere 4 "hq train: recipe 'mxfp8' ($conf/examples/mxfp8.ini), step 0: --batch 130 does not split across 4 ranks: give a multiple of 4" \
  train --data "$tmp/words.txt" --steps 2 --batch 130 --hidden 128 --layers 1 --recipe "$conf/examples/mxfp8.ini"
# --device cuda across ranks where it cannot run (an hq without NCCL, a machine without GPUs):
# refused on every rank, saying why (tests/test_train_dist_nccl.sh runs it where it can)
rm -rf "$tmp/out"
if timeout 300 "$mpirun" $flags --output-filename "$tmp/out" -np 2 "$hq" train --device cuda \
     --data "$tmp/words.txt" --steps 2 --batch 128 --hidden 128 --layers 1 \
     --recipe "$conf/examples/mxfp8.ini" > "$tmp/o" 2> "$tmp/e"; then
  echo "(--device cuda ran on 2 ranks here: GPUs present)"
else
  for r in 0 1; do
    f=$(ls "$tmp"/out/*/rank.$r/stderr 2>/dev/null)
    [ -n "$f" ] && grep -q "^hq train: run by mpirun with 2 ranks and --device cuda, but this hq was built without NCCL\|^hq train: rank $r: --device cuda: no usable GPU\|^hq train: rank $r: --device cuda across ranks takes one GPU per rank" "$f" ||
      { cat "$tmp/e" $f; fail "mpirun -np 2 hq train --device cuda: rank $r did not say why it cannot run"; }
  done
fi

# checkpoints across rank counts (train/checkpoint.c): the file holds every tensor whole, so a
# run saved at step 20 of 40 by N ranks resumes with M ranks. The same count continues
# bit-identically (the final checkpoint is the uninterrupted run's, byte for byte); another count
# sums the gradients in another order, so its held-out loss is 1 rank's within 5e-4, and two
# resumed runs are bit-identical. fp8_delayed: a scaling state (amax histories) and quantized
# weights to carry over, besides the masters and moments.
ck="train --data $tmp/words.txt --steps 40 --batch 128 --hidden 128 --layers 1 --log-every 10
    --recipe $conf/examples/fp8_delayed.ini --baseline none --json"
# mpi NP NAME ARGS...: mpirun -np NP hq $ck ARGS, the JSON in NAME.json
mpi() {
  np=$1 name=$2; shift 2
  # shellcheck disable=SC2086
  timeout 600 "$mpirun" $flags -np $np "$hq" $ck "$@" > "$tmp/$name.json" 2> "$tmp/$name.err" ||
    { cat "$tmp/$name.err"; fail "mpirun -np $np hq $ck $*"; }
}
for np in 1 2 4; do
  mpi $np full$np --checkpoint "$tmp/k$np-{step}.st" --checkpoint-every 20
  [ -s "$tmp/k$np-20.st" ] && [ -s "$tmp/k$np-40.st" ] || fail "-np $np: no checkpoints written"
done
# the files of 1 and 4 ranks hold the same entries (names, dtypes, shapes) and metadata keys: the
# layout does not depend on the count of ranks
entries() {
  python3 -c 'import json,struct,sys
b = open(sys.argv[1], "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
for k in sorted(h):
    print(k, sorted(h[k]) if k == "__metadata__" else (h[k]["dtype"], h[k]["shape"]))' "$1"
}
entries "$tmp/k1-20.st" > "$tmp/e1"
entries "$tmp/k4-20.st" > "$tmp/e4"
cmp -s "$tmp/e1" "$tmp/e4" || { diff "$tmp/e1" "$tmp/e4"; fail "the checkpoints of 1 and 4 ranks differ in layout"; }
grep -q "^fc1.weight.master ('F32', \[128, 128\])$" "$tmp/e4" || { cat "$tmp/e4"; fail "no whole fc1 master"; }
# the same count: the continuation is the uninterrupted run, byte for byte
mpi 4 r4to4 --resume "$tmp/k4-20.st" --checkpoint "$tmp/r4to4.st"
cmp -s "$tmp/r4to4.st" "$tmp/k4-40.st" || fail "4 ranks resumed with 4: the final checkpoint is not the uninterrupted run's"
# eval_loss JSON: the held-out loss after the last step; fp8_delayed.ini's BF16 head parts the
# runs of other rank counts slowly (the bound of the first check above)
eval_loss() { python3 -c 'import json,sys; print("%.9g" % json.load(open(sys.argv[1]))["recipes"][0]["eval_loss"])' "$1"; }
for pair in 4:2 4:1 1:4 2:4 4:2; do
  from=${pair%:*} to=${pair#*:}
  name=r${from}to$to
  [ -e "$tmp/$name.st" ] && name=${name}b   # 4 -> 2 twice: the repeat
  mpi "$to" "$name" --resume "$tmp/k$from-20.st" --checkpoint "$tmp/$name.st"
  grep -q "resumed at step 20" "$tmp/$name.err" || { cat "$tmp/$name.err"; fail "$name: not resumed"; }
  python3 -c 'import sys
one, got = float(sys.argv[1]), float(sys.argv[2])
print("%s: held-out loss %.9g, 1 rank uninterrupted %.9g, difference %.2g" % (sys.argv[3], got, one, abs(got - one)))
if not abs(got - one) <= 5e-4: sys.exit("%s: the resumed run is not 1 rank'"'"'s within 5e-4" % sys.argv[3])' \
    "$(eval_loss "$tmp/full1.json")" "$(eval_loss "$tmp/$name.json")" "$from ranks -> $to" ||
    fail "$from ranks resumed with $to"
done
cmp -s "$tmp/r4to2.st" "$tmp/r4to2b.st" || fail "4 ranks resumed with 2, twice: different final checkpoints"
# --verify-resume across ranks: every rank reloads rank 0's mid-run file and continues bit for bit
for np in 2 4; do
  mpi $np verify$np --verify-resume --checkpoint-every 20
  grep -q "^hq train: fp8-delayed-hybrid: resume verified: the checkpoint of step 20 reloaded into a fresh model gives bit-identical losses for steps 21..40 and a bit-identical final state$" "$tmp/verify$np.err" ||
    { cat "$tmp/verify$np.err"; fail "-np $np --verify-resume"; }
done

# a corrupt or mismatched checkpoint is refused on every rank with the same message: one byte of
# fc1's master (a sharded tensor: every rank reads it whole) flipped
python3 -c 'import json,struct,sys
f = open(sys.argv[1], "r+b")
n = struct.unpack("<Q", f.read(8))[0]
e = json.loads(f.read(n))["fc1.weight.master"]["data_offsets"]
f.seek(8 + n + e[0] + 4 * 128 * 100)   # row 100: rank 3 of 4 holds it, rank 0 of 2 does not
b = f.read(1)
f.seek(-1, 1)
f.write(bytes([b[0] ^ 0x40]))' "$tmp/k4-20.st" || fail "corrupting a checkpoint"
ckr="train --data $tmp/words.txt --steps 40 --batch 128 --hidden 128 --layers 1 --baseline none"
# refused_saying NP TEXT ARGS...: refused, and every rank's stderr has one line holding TEXT
refused_saying() { refused_matching -F "$@"; }
# shellcheck disable=SC2086
refused_saying 2 "hq train: recipe 'fp8-delayed-hybrid' ($conf/examples/fp8_delayed.ini): --resume: hq_ckpt_load_tensor 'fc1.weight.master': checkpoint $tmp/k4-20.st: entry 'fc1.weight.master' is corrupt: " \
  $ckr --recipe "$conf/examples/fp8_delayed.ini" --resume "$tmp/k4-20.st"
# shellcheck disable=SC2086
refused_everywhere 4 "hq train: recipe 'fp8-delayed-hybrid' ($conf/examples/fp8_delayed.ini): --resume $tmp/k2-20.st: model.hidden differs: the checkpoint has model.hidden = 128, this run 64 (--hidden)" \
  $ckr --recipe "$conf/examples/fp8_delayed.ini" --resume "$tmp/k2-20.st" --hidden 64
# shellcheck disable=SC2086
refused_everywhere 2 "hq train: recipe 'fp8-current-e4m3' ($conf/examples/fp8_current.ini): --resume $tmp/k4-40.st: the checkpoint was written with recipe 'fp8-delayed-hybrid' ($conf/examples/fp8_delayed.ini); this run's recipe is 'fp8-current-e4m3' ($conf/examples/fp8_current.ini)" \
  $ckr --recipe "$conf/examples/fp8_current.ini" --resume "$tmp/k4-40.st" --steps 60
# --grad-dtype is recorded (metadata grad_dtype): a run that reduces gradients resumes only in
# the checkpoint's dtype (BF16 sums round: another dtype is another training), and then continues
# bit-identically; one process reduces nothing and resumes either
mpi 2 kb --grad-dtype bf16 --checkpoint "$tmp/kb-{step}.st" --checkpoint-every 20
python3 -c 'import json,struct,sys
b = open(sys.argv[1], "rb").read()
m = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"]
sys.exit(0 if m.get("grad_dtype") == sys.argv[2] else "grad_dtype: %r" % m.get("grad_dtype"))' \
  "$tmp/kb-20.st" bf16 || fail "the checkpoint of --grad-dtype bf16 does not record it"
# shellcheck disable=SC2086
refused_everywhere 2 "hq train: recipe 'fp8-delayed-hybrid' ($conf/examples/fp8_delayed.ini): --resume $tmp/kb-20.st: the checkpoint's weight gradients were reduced across ranks in bf16, this run's in fp32: another reduce dtype is another training; give --grad-dtype bf16 to continue it" \
  $ckr --recipe "$conf/examples/fp8_delayed.ini" --resume "$tmp/kb-20.st"
# shellcheck disable=SC2086
refused_everywhere 2 "hq train: recipe 'fp8-delayed-hybrid' ($conf/examples/fp8_delayed.ini): --resume $tmp/k1-20.st: the checkpoint's weight gradients were reduced across ranks in fp32, this run's in bf16: another reduce dtype is another training; give --grad-dtype fp32 to continue it" \
  $ckr --recipe "$conf/examples/fp8_delayed.ini" --resume "$tmp/k1-20.st" --grad-dtype bf16
mpi 2 rb --grad-dtype bf16 --resume "$tmp/kb-20.st" --checkpoint "$tmp/rb.st"
cmp -s "$tmp/rb.st" "$tmp/kb-40.st" || fail "--grad-dtype bf16 resumed with 2 ranks: the final checkpoint is not the uninterrupted run's"
mpi 1 rb1 --resume "$tmp/kb-20.st"
grep -q "resumed at step 20" "$tmp/rb1.err" || { cat "$tmp/rb1.err"; fail "a --grad-dtype bf16 checkpoint in one process: not resumed"; }
echo "PASS"
