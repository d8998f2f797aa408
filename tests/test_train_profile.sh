#!/bin/sh
# test_train_profile.sh -- `hq train --profile` on the CPU: profiling changes no bit of training
# (the same losses with and without it, for recipes whose amax pass the profile splits off); the
# JSON has every key; the phase counts per step are the model's, counted by hand; the phases and
# the host overhead add up to the step time, and the host overhead stays under 5% of it (the
# phases account for the measured step); --preset's sizes and their overrides. On a machine with
# a CUDA device, also --device cuda: the same losses with and without --profile, times from CUDA
# events, phases plus idle gaps equal to the GPU span with no negative idle (no phase counted
# twice), the 9 GEMMs of a step on GPU paths, a peak device memory of at least the FP32 state's
# 16 bytes a parameter. Exit 0 pass, 1 fail, 77 skip (automake's protocol).
set -u
LC_ALL=C; export LC_ALL
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_train_profile.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 reads the JSON"; exit 77; }
. "${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/train_corpus.sh"
train_corpus "$tmp/words.txt" || { echo "SKIP: no corpus"; exit 77; }

# 40 steps: the profile covers steps 21..40; one hidden layer: fc1 and lm_head
small="--data $tmp/words.txt --steps 40 --batch 128 --hidden 128 --layers 1 --eval-every 20 --log-every 10"
recipes="--recipe $conf/examples/fp8_current.ini --recipe $conf/examples/fp8_delayed.ini --recipe $conf/examples/nvfp4.ini"
$hq train $small $recipes --json > "$tmp/plain.json" 2> "$tmp/e" || { cat "$tmp/e"; fail "train without --profile"; }
$hq train $small $recipes --json --profile > "$tmp/prof.json" 2> "$tmp/e" || { cat "$tmp/e"; fail "train --profile"; }
$hq train $small --recipe $conf/examples/fp8_current.ini --profile > "$tmp/table" 2> "$tmp/e" || { cat "$tmp/e"; fail "train --profile (table)"; }

python3 - "$tmp/plain.json" "$tmp/prof.json" "$tmp/table" <<'PY' || exit 1
import json, sys
plain, prof = (json.load(open(f)) for f in sys.argv[1:3])
table = open(sys.argv[3]).read()
def die(msg):
    print("FAIL:", msg)
    sys.exit(1)
# profiling changes no bit of training: every step's loss and the final eval are the same
for a, b in zip(plain["recipes"], prof["recipes"]):
    if a["train_curve"] != b["train_curve"] or a["eval_curve"] != b["eval_curve"]:
        die("%s: the losses differ with --profile" % a["name"])
    if a["profile"] is not None:
        die("%s: a profile without --profile" % a["name"])
    if a["peak_device_bytes"] is not None or b["peak_device_bytes"] is not None:
        die("%s: a peak device memory on the host" % a["name"])
phases = ["gemm_native", "gemm_emulated", "gemm_fused", "gemm_cpu", "amax", "quantize",
          "trainer_kernels", "optimizer", "scaling_state", "copies"]
# per step, by hand: 2 linear layers (fc1, lm_head), 3 GEMMs each; a quantize of each layer's
# input and output gradient; kernels: embedding, 1 activation, the loss, 2 bias gradients,
# 1 activation gradient, the embedding gradient; Adam: the embedding, 2 x (weight, bias); one
# state update; 2 copies (the batch up, the loss down)
want = {"gemm_native": 0, "gemm_emulated": 0, "gemm_fused": 0, "gemm_cpu": 6, "quantize": 4,
        "trainer_kernels": 7, "optimizer": 5, "scaling_state": 1, "copies": 2}
# the amax pass: fp8_tensor with current scaling takes every amax (max |x|) from the kernel that
# wrote the tensor (embedding, activation, loss and activation gradients), so its one amax call
# is the step's zeroing of those amaxes; nvfp4's columnwise amax is its own (of the
# RHT-transformed values), so one pass per quantize of fc1, lm_head being identity; delayed
# scaling takes its scale from the history, identity has no scale: no amax pass
want_amax = {"fp8-current-e4m3": 1, "fp8-delayed-hybrid": 0, "nvfp4": 2, "fp32": 0}
# the trainer kernels' parts: the embedding and its gradient, 1 activation and its gradient, 2
# bias gradients, the loss
want_parts = {"embedding": 2, "activation_fwd": 1, "activation_bwd": 1, "bias_gradient": 2,
              "loss": 1}
for r in prof["recipes"]:
    p = r["profile"]
    if p is None:
        die("%s: no profile" % r["name"])
    for k in ["timer", "first_step", "steps", "step_ms", "span_ms", "host_overhead_ms", "phases",
              "quantize_calls"]:
        if k not in p:
            die("%s: profile.%s missing" % (r["name"], k))
    if p["timer"] != "host_clock" or p["first_step"] != 21 or p["steps"] != 20:
        die("%s: timer %s, steps %s from %s" % (r["name"], p["timer"], p["steps"], p["first_step"]))
    if sorted(p["phases"]) != sorted(phases):
        die("%s: phases %s" % (r["name"], sorted(p["phases"])))
    calls = {k: v["calls"] for k, v in p["phases"].items()}
    w = dict(want)
    w["amax"] = want_amax[r["name"]]
    for k, v in w.items():
        if calls[k] != v:
            die("%s: %s calls per step %s, expected %s" % (r["name"], k, calls[k], v))
    parts = p["phases"]["trainer_kernels"].get("parts")
    if parts is None or {k: v["calls"] for k, v in parts.items()} != want_parts:
        die("%s: trainer kernels' parts %s" % (r["name"], parts))
    kms = p["phases"]["trainer_kernels"]["ms"]
    if abs(sum(v["ms"] for v in parts.values()) - kms) > 1e-6 * kms + 1e-9:
        die("%s: the parts do not add up to the trainer kernels' %.6f ms" % (r["name"], kms))
    q = p["quantize_calls"]
    if q != {"input": 2, "weight": 0, "grad_output": 2, "weight_write-back": 2}:
        die("%s: quantize calls %s" % (r["name"], q))
    total = sum(v["ms"] for v in p["phases"].values())
    if abs(total + p["host_overhead_ms"] - p["span_ms"]) > 1e-6 * p["span_ms"] + 1e-9:
        die("%s: phases %.6f + overhead %.6f != step %.6f" % (r["name"], total, p["host_overhead_ms"], p["span_ms"]))
    if p["span_ms"] != p["step_ms"]:
        die("%s: span %s != step %s on the host" % (r["name"], p["span_ms"], p["step_ms"]))
    # the phases account for the measured step: the time outside them is under 5% of it
    if not (0 <= p["host_overhead_ms"] < 0.05 * p["step_ms"]):
        die("%s: host overhead %.4f ms of a %.4f ms step" % (r["name"], p["host_overhead_ms"], p["step_ms"]))
    # the profiled steps are some of the steps the run timed
    if p["step_ms"] * p["steps"] > 1e3 * r["train_seconds"] * (1 + 1e-9):
        die("%s: profiled %.3f ms > the run's %.3f ms" % (r["name"], p["step_ms"] * p["steps"], 1e3 * r["train_seconds"]))
for line in ["profile of fp8-current-e4m3: steps 21..40 (20), per step, host clock (clock_gettime)",
             "  quantize calls per step: input 2, weight 0, grad_output 2, weight write-back 2"]:
    if line not in table.split("\n"):
        die("the table lacks %r" % line)
# the parts' lines follow the trainer kernels' line, indented, in this order
lines = table.split("\n")
k = [i for i, l in enumerate(lines) if l.startswith("  trainer kernels ")]
if len(k) != 2:   # fp8-current-e4m3's table and the fp32 baseline's
    die("the tables have %d trainer kernels lines, not 2" % len(k))
for i in k:
    for n, name in enumerate(["embedding", "activation fwd", "activation bwd", "bias gradient",
                              "loss"]):
        if not lines[i + 1 + n].startswith("    " + name + " "):
            die("line %d after trainer kernels is %r, not %s" % (n + 1, lines[i + 1 + n], name))
PY
# --preset fills what no option gives: the sizes of wide, large and gpt2s, with --hidden and --batch
# given (a CPU-sized step); a preset that does not exist is a usage error
for preset in "wide 64 4 0.002" "large 64 6 0.001" "gpt2s 96 8 0.001" "default 16 2 0.006"; do
  set -- $preset
  $hq train --data "$tmp/words.txt" --steps 1 --eval-every 0 --preset $1 --hidden 64 --batch 128 \
    --json > "$tmp/p.json" 2> "$tmp/e" || { cat "$tmp/e"; fail "--preset $1"; }
  got=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['config']; print(c['preset'], c['embed'], c['layers'], c['lr'], c['hidden'], c['batch'], c['context'])" "$tmp/p.json")
  [ "$got" = "$1 $2 $3 $4 64 128 8" ] || fail "--preset $1: config $got"
done
$hq train --data "$tmp/words.txt" --preset huge > "$tmp/o" 2> "$tmp/e"; rc=$?
[ $rc -eq 2 ] || fail "--preset huge: exit status $rc"
[ "$(cat "$tmp/e")" = "hq train: --preset 'huge' is not default, wide, large or gpt2s" ] || { cat "$tmp/e"; fail "--preset huge: message"; }

# --- on a GPU (when there is one): the same with CUDA events ---
small="--data $tmp/words.txt --steps 40 --batch 256 --hidden 256 --layers 2 --eval-every 20 --log-every 10"
$hq train --device cuda $small --steps 1 --recipe "$conf/examples/high_precision.ini" \
  >/dev/null 2>"$tmp/probe"
if [ $? -ne 0 ]; then
  if grep -q "does not exist\|without CUDA\|no CUDA\|CUDA driver" "$tmp/probe"; then
    echo "PASS (the CPU part; no CUDA device for the GPU part: $(head -n 1 "$tmp/probe"))"; exit 0
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
params = prof["config"]["parameters"]
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
    # the trainer kernels' parts add up to them; current scaling's amaxes come from the kernels
    k = p["phases"]["trainer_kernels"]
    if abs(sum(v["ms"] for v in k["parts"].values()) - k["ms"]) > 1e-6 * k["ms"]:
        die("%s: the trainer kernels' parts do not add up" % a["name"])
    if a["name"] == "fp8-current-e4m3" and p["phases"]["amax"]["calls"] != 1:
        die("%s: %s amax calls a step, expected 1 (the fused amaxes' zeroing)" % (a["name"], p["phases"]["amax"]["calls"]))
    # the peak is this process's own (hq's pool): never 0 nor another process's; every run
    # holds its FP32 masters, their gradients and AdamW's two moments on the device from the
    # model's creation to its end, 16 bytes a parameter, all from hq's pool
    for r in (a, b):
        if not (r["peak_device_bytes"] and r["peak_device_bytes"] >= 16 * params):
            die("%s: peak device memory %s, below the %d bytes of 16 per parameter"
                % (a["name"], r["peak_device_bytes"], 16 * params))
    peak[a["name"]] = b["peak_device_bytes"]
# the two recipes' peaks are not compared: at this size the GEMM workspace and the FP32 state
# outweigh the quantized copies, and FP8's (two directions of one byte an element, plus scales,
# amaxes and the quantizers' scratch) are not smaller than BF16's by construction
print("peak device bytes:", peak)
PY
echo "PASS"
