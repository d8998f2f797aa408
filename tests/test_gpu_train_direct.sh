#!/bin/sh
# test_gpu_train_direct.sh -- `hq train --device cuda --baseline bf16-direct` (exit 77 when no GPU
# can run it): the built-in run whose GEMMs call cuBLASLt directly trains (its loss falls), and it
# computes what the identity BF16 recipe (conf/examples/high_precision.ini) computes through hq:
# the same BF16 operands (round to nearest even), the same cuBLASLt problems and heuristic
# preferences, so the same algorithms and the same bits -- every logged train loss and every
# held-out loss equal, printed to 9 significant digits. Its GEMMs are reported as native BF16 x
# BF16, its --profile counts the same casts and GEMMs per step as the recipe's, and the table and
# --json give every run's tokens/s against it. Exit 0 pass, 1 fail, 77 skip (automake's protocol).
set -u
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_gpu_train_direct.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs python3 (json)"; exit 77; }
. "${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/train_corpus.sh"
train_corpus "$tmp/words.txt" || { echo "SKIP: no corpus (no awk and no /usr/share/dict/words)"; exit 77; }
# 3 hidden layers and lm_head, 40 steps (the profile: steps 21..40), evals at 0, 20 and the end
small="--data $tmp/words.txt --steps 40 --batch 256 --hidden 128 --layers 3 --eval-every 20 --log-every 5"
hp="$conf/examples/high_precision.ini"

$hq train --device cuda $small --steps 1 --recipe "$hp" --baseline none >/dev/null 2>"$tmp/probe"
if [ $? -ne 0 ]; then
  if grep -q "does not exist\|without CUDA\|no CUDA\|CUDA driver" "$tmp/probe"; then
    echo "SKIP: no CUDA device ($(head -n 1 "$tmp/probe"))"; exit 77
  fi
  cat "$tmp/probe"; fail "--device cuda failed on a machine with a GPU"
fi

$hq train --device cuda $small --recipe "$hp" --baseline bf16-direct --profile --json \
  > "$tmp/out.json" 2>"$tmp/err" || { cat "$tmp/err"; fail "--baseline bf16-direct"; }
$hq train --device cuda $small --recipe "$hp" --baseline bf16-direct > "$tmp/table" 2>"$tmp/err" ||
  { cat "$tmp/err"; fail "--baseline bf16-direct (table)"; }

python3 - "$tmp/out.json" "$tmp/table" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
table = open(sys.argv[2]).read()
def die(msg):
    print("FAIL:", msg)
    sys.exit(1)
runs = d["recipes"]
if [r["name"] for r in runs] != ["bf16-baseline", "bf16-direct"]:
    die("runs: %s" % [r["name"] for r in runs])
hq_run, direct = runs
if d["baseline"] != "bf16-direct" or not direct["baseline"] or hq_run["baseline"]:
    die("the baseline is not the bf16-direct run")
if not direct["direct"] or hq_run["direct"] or direct["path"] is not None:
    die("the direct flags: recipe %s, built-in %s" % (hq_run["direct"], direct["direct"]))
if direct["speed_vs_baseline"] != 1:
    die("the baseline's own speed ratio is %s" % direct["speed_vs_baseline"])
want = hq_run["tokens_per_second"] / direct["tokens_per_second"]
if abs(hq_run["speed_vs_baseline"] - want) > 1e-6 * want:
    die("speed_vs_baseline %s, tokens/s give %s" % (hq_run["speed_vs_baseline"], want))
# it trains
tc = direct["train_curve"]
if not tc[-1][1] < tc[0][1] - 0.3:
    die("the direct run's loss did not fall: %s -> %s" % (tc[0][1], tc[-1][1]))
# the same bits as the identity BF16 recipe through hq
for key in ("step0_loss", "train_loss", "eval_loss", "train_curve", "eval_curve"):
    if hq_run[key] != direct[key]:
        a, b = hq_run[key], direct[key]
        if isinstance(a, list):
            diff = max(abs(x[1] - y[1]) for x, y in zip(a, b))
        else:
            diff = abs(a - b)
        die("%s differs from the identity BF16 recipe's (largest difference %.3g): the direct "
            "GEMMs did not take hq's algorithms" % (key, diff))
# 4 layers: 3 GEMMs each, native BF16 x BF16
if len(direct["gemms"]) != 4:
    die("%d layers reported" % len(direct["gemms"]))
for layer in direct["gemms"]:
    for g in ("fprop", "dgrad", "wgrad"):
        x = layer[g]
        if (x["a"], x["b"], x["path"]) != ("bf16", "bf16", "native"):
            die("%s %s: %s" % (layer["layer"], g, x))
    if layer["fprop"]["k"] != (128 if layer["layer"] != "fc1" else 8 * 16):
        die("%s: fprop k %s" % (layer["layer"], layer["fprop"]["k"]))
# the profile: per step, 12 GEMMs on the native path, 8 casts (an input and an output gradient
# per layer) and 4 weight copies after the optimizer, as the identity recipe's quantizes
p, q = direct["profile"], hq_run["profile"]
if p is None or q is None:
    die("no profile")
if p["phases"]["gemm_native"]["calls"] != 12 or q["phases"]["gemm_native"]["calls"] != 12:
    die("native GEMM calls per step: direct %s, hq %s" % (p["phases"]["gemm_native"]["calls"],
                                                         q["phases"]["gemm_native"]["calls"]))
if p["phases"]["quantize"]["calls"] != 8:
    die("casts per step: %s" % p["phases"]["quantize"]["calls"])
if p["quantize_calls"] != q["quantize_calls"]:
    die("quantize counts: direct %s, hq %s" % (p["quantize_calls"], q["quantize_calls"]))
if p["phases"]["amax"]["calls"] != 0 or p["phases"]["scaling_state"]["calls"] != 0:
    die("the direct run has an amax pass or a scaling state")
# the table: the ratio against bf16-direct, 1.000x for itself
if "tokens/s against bf16-direct" not in table:
    die("the table has no speed against bf16-direct")
line = [l for l in table.splitlines() if l.strip().startswith("bf16-direct ") and l.strip().endswith("x")]
if not line or not line[-1].strip().endswith("1.000x"):
    die("the table's ratio line of bf16-direct: %s" % line)
print("ok: bf16-direct equals the identity BF16 recipe bit for bit; hq at %.3fx its tokens/s"
      % hq_run["speed_vs_baseline"])
PY
