#!/bin/sh
# test_gpu_train_profile.sh -- `hq train --device cuda --profile` (exit 77 when no GPU can run
# it): the profile changes no bit of a GPU run (the same losses with and without it), its times
# come from CUDA events, the phases and the idle gaps add up to the GPU span of a step with no
# negative idle (no phase counted twice), the 9 GEMMs of a step are all timed on a GPU path, and
# the peak device memory is reported.
# Exit 0 pass, 1 fail, 77 skip (automake's protocol).
set -u
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_gpu_train_profile.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 reads the JSON"; exit 77; }
. "${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/train_corpus.sh"
train_corpus "$tmp/words.txt" || { echo "SKIP: no corpus"; exit 77; }
small="--data $tmp/words.txt --steps 40 --batch 256 --hidden 256 --layers 2 --eval-every 20 --log-every 10"

$hq train --device cuda $small --steps 1 --recipe "$conf/examples/high_precision.ini" \
  >/dev/null 2>"$tmp/probe"
if [ $? -ne 0 ]; then
  if grep -q "does not exist\|without CUDA\|no CUDA\|CUDA driver" "$tmp/probe"; then
    echo "SKIP: no CUDA device ($(head -n 1 "$tmp/probe"))"; exit 77
  fi
  cat "$tmp/probe"; fail "--device cuda failed on a machine with a GPU"
fi
recipes="--recipe $conf/examples/fp8_current.ini --recipe $conf/examples/high_precision.ini"
$hq train --device cuda $small $recipes --json > "$tmp/plain.json" 2> "$tmp/e" || { cat "$tmp/e"; fail "train"; }
$hq train --device cuda $small $recipes --json --profile > "$tmp/prof.json" 2> "$tmp/e" || { cat "$tmp/e"; fail "train --profile"; }
python3 - "$tmp/plain.json" "$tmp/prof.json" <<'PY' || exit 1
import json, sys
plain, prof = (json.load(open(f)) for f in sys.argv[1:3])
def die(msg):
    print("FAIL:", msg)
    sys.exit(1)
peak = {}
for a, b in zip(plain["recipes"], prof["recipes"]):
    if a["train_curve"] != b["train_curve"] or a["eval_curve"] != b["eval_curve"]:
        die("%s: the losses differ with --profile" % a["name"])
    p = b["profile"]
    if p["timer"] != "cuda_events" or p["steps"] != 20 or "idle_ms" not in p:
        die("%s: profile %s" % (a["name"], p))
    total = sum(v["ms"] for v in p["phases"].values())
    if abs(total + p["idle_ms"] - p["span_ms"]) > 1e-6 * p["span_ms"]:
        die("%s: phases + idle != span" % a["name"])
    if p["idle_ms"] < -1e-3 * p["span_ms"]:
        die("%s: negative idle %.4f ms" % (a["name"], p["idle_ms"]))
    if p["phases"]["gemm_cpu"]["calls"] != 0:
        die("%s: CPU GEMMs on the GPU" % a["name"])
    gpu_gemms = sum(p["phases"][k]["calls"] for k in ["gemm_native", "gemm_emulated", "gemm_fused"])
    if gpu_gemms != 9:
        die("%s: %s GEMMs a step on the GPU paths, expected 9" % (a["name"], gpu_gemms))
    if not (b["peak_device_bytes"] and b["peak_device_bytes"] > 0):
        die("%s: peak device memory %s" % (a["name"], b["peak_device_bytes"]))
    peak[a["name"]] = b["peak_device_bytes"]
print("peak device bytes:", peak)
PY
echo PASS
