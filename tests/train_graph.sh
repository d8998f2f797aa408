# train_graph.sh -- sourced by test_train_graph.sh (the CPU) and test_gpu_train_graph.sh (CUDA):
# graph_runs DEVICE DIR trains the same recipes with --cuda-graph on and off from one seed
# (--log-every 1: every step's loss in --json; --checkpoint: the final masters, Adam moments,
# quantized weights, scaling state and curves) and fails unless the two agree bit for bit:
# every step's train loss, the held-out losses and every checkpoint file byte for byte. The
# recipes: the FP32 baseline (identity borrowing its source), BF16 identity (a copy), per-tensor
# FP8 with current and with delayed scaling (the state's amaxes and scales), MXFP8, NVFP4 and the
# default recipe.ini (both with stochastic rounding on the gradients: on a GPU its replays must
# draw each step's bits, not the captured step's).
graph_recipes() {
  for r in fp8_current fp8_delayed mxfp8 nvfp4 high_precision; do
    printf ' --recipe %s/examples/%s.ini' "$conf" "$r"
  done
  printf ' --recipe %s/recipe.ini' "$conf"
}

graph_runs() {
  dev=$1 dir=$2
  for g in on off; do
    # shellcheck disable=SC2046
    $hq train --device "$dev" --data "$dir/words.txt" --steps 12 --batch 128 --hidden 64 \
      --layers 2 --eval-every 5 --log-every 1 --cuda-graph $g $(graph_recipes) \
      --checkpoint "$dir/ck_$g.safetensors" --json > "$dir/$g.json" 2> "$dir/$g.err" ||
      { cat "$dir/$g.err"; fail "--device $dev --cuda-graph $g"; }
  done
  python3 - "$dir/on.json" "$dir/off.json" <<'PY' || exit 1
import json, sys
on, off = (json.load(open(p)) for p in sys.argv[1:3])
if on["config"]["cuda_graph"] != "on" or off["config"]["cuda_graph"] != "off":
    print("FAIL: --json config.cuda_graph"); sys.exit(1)
m = on["machine"]
if (on["config"]["device"] == "cpu") != (m["gpu"] is None) or (m["gpu"] and not m["sm"] >= 70):
    print("FAIL: --json machine %s on %s" % (m, on["config"]["device"])); sys.exit(1)
names = [r["name"] for r in on["recipes"]]
if len(names) != 7 or names != [r["name"] for r in off["recipes"]]:
    print("FAIL: runs %s / %s" % (names, [r["name"] for r in off["recipes"]])); sys.exit(1)
for a, b in zip(on["recipes"], off["recipes"]):
    if len(a["train_curve"]) != 13 or a["train_curve"] != b["train_curve"]:
        print("FAIL: %s: the train losses differ with the graph on and off" % a["name"]); sys.exit(1)
    if a["eval_curve"] != b["eval_curve"] or a["eval_loss"] != b["eval_loss"]:
        print("FAIL: %s: the held-out losses differ" % a["name"]); sys.exit(1)
    if b["graph_replays"] != 0 or b["graph_note"] is not None:
        print("FAIL: %s: --cuda-graph off replayed or noted something" % a["name"]); sys.exit(1)
PY
  n=0
  for f in "$dir"/ck_on-*.safetensors; do
    cmp -s "$f" "${f%%ck_on-*}ck_off-${f##*ck_on-}" ||
      fail "$(basename "$f"): the final state differs with the graph on and off"
    n=$((n + 1))
  done
  [ $n -eq 7 ] || fail "expected 7 checkpoints, found $n"
}
