#!/bin/sh
# test_gpu_train.sh -- `hq train --device cuda` (exit 77 when no GPU can run it): every shipped
# recipe trains on the GPU (the loss falls from the same step-0 loss as on the CPU), the
# high-precision run on the GPU follows the CPU's within the difference of GEMM summation order,
# the GPU run repeats bit for bit (--verify-resume: reloaded mid-run, every later step's loss and
# the final checkpoint identical) with stochastic rounding and with delayed scaling, and --json
# says which device ran. Exit 0 pass, 1 fail, 77 skip (automake's protocol).
set -u
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_gpu_train.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs python3 (json)"; exit 77; }
jget() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

# the generated corpus of test_train.sh (tests/train_corpus.sh)
. "${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/train_corpus.sh"
train_corpus "$tmp/words.txt" || { echo "SKIP: no corpus (no awk and no /usr/share/dict/words)"; exit 77; }
small="--data $tmp/words.txt --steps 60 --batch 256 --hidden 128 --layers 2 --eval-every 30 --log-every 20"

$hq train --device cuda $small --steps 1 --recipe "$conf/examples/high_precision.ini" \
  >/dev/null 2>"$tmp/probe"
if [ $? -ne 0 ]; then
  if grep -q "does not exist\|without CUDA\|no CUDA\|CUDA driver" "$tmp/probe"; then
    echo "SKIP: no CUDA device ($(head -n 1 "$tmp/probe"))"; exit 77
  fi
  cat "$tmp/probe"; fail "--device cuda failed on a machine with a GPU"
fi

# every shipped recipe on the GPU, and the high-precision one on the CPU
set -- --recipe "$conf/recipe.ini"
for r in "$conf"/examples/*.ini; do set -- "$@" --recipe "$r"; done
$hq train --device cuda $small "$@" --json > "$tmp/gpu.json" 2>"$tmp/gpu.err" ||
  { cat "$tmp/gpu.err"; fail "train --device cuda, every shipped recipe"; }
$hq train --device cpu $small --recipe "$conf/examples/high_precision.ini" --json \
  > "$tmp/cpu.json" 2>"$tmp/cpu.err" || { cat "$tmp/cpu.err"; fail "train --device cpu"; }
[ "$(jget "$tmp/gpu.json" "d['config']['device']")" = cuda ] || fail "--json: device"
nrec=$(jget "$tmp/gpu.json" "len(d['recipes'])")
[ "$nrec" -eq $(($# / 2 + 1)) ] || fail "expected every shipped recipe and the FP32 baseline ($(($# / 2 + 1))), got $nrec runs"
i=0
while [ $i -lt "$nrec" ]; do
  name=$(jget "$tmp/gpu.json" "d['recipes'][$i]['name']")
  # the same data and initial weights as the CPU: the same step-0 loss up to summation order
  jget "$tmp/gpu.json" "abs(d['recipes'][$i]['step0_loss'] - $(jget "$tmp/cpu.json" "d['recipes'][0]['step0_loss']")) < 2e-3" |
    grep -q True || fail "$name: step-0 loss differs from the CPU's"
  jget "$tmp/gpu.json" "d['recipes'][$i]['eval_loss'] < d['recipes'][$i]['step0_loss'] - 0.5" |
    grep -q True || fail "$name: the held-out loss did not fall on the GPU"
  i=$((i + 1))
done
# high precision: GPU and CPU differ only in the order of sums
hp_gpu=$(jget "$tmp/gpu.json" "[r['eval_loss'] for r in d['recipes'] if r['name'] == '$(jget "$tmp/cpu.json" "d['recipes'][0]['name']")'][0]")
jget "$tmp/cpu.json" "abs(d['recipes'][0]['eval_loss'] - $hp_gpu) < 0.02" | grep -q True ||
  fail "high precision: GPU eval loss $hp_gpu vs CPU $(jget "$tmp/cpu.json" "d['recipes'][0]['eval_loss']")"

# the GPU run is deterministic: reload mid-run and continue bit for bit (stochastic rounding:
# nvfp4; delayed scaling: fp8_delayed)
for r in nvfp4 fp8_delayed mxfp8; do
  $hq train --device cuda $small --steps 30 --recipe "$conf/examples/$r.ini" --verify-resume \
    --checkpoint "$tmp/$r.safetensors" > "$tmp/v.txt" 2>&1 || { cat "$tmp/v.txt"; fail "$r: --verify-resume on the GPU"; }
  grep -q "identical" "$tmp/v.txt" || { cat "$tmp/v.txt"; fail "$r: --verify-resume did not report identical"; }
done
echo "PASS: hq train --device cuda ($nrec runs)"
exit 0
