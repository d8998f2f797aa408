#!/bin/sh
# test_gpu_train_graph.sh -- `hq train --device cuda --cuda-graph on|off` (exit 77 when no GPU can
# run it): with the graph on, every recipe runs 2 warm steps eagerly, captures the third (the
# optimizer included, its constants read from device slots the host refills before each launch) and
# replays it at every later step, and its losses and final state equal the eager run's bit for bit
# (train_graph.sh: fp32, BF16 identity, per-tensor FP8 current and delayed, MXFP8, and with
# stochastic rounding NVFP4 and the default recipe.ini; the learning rate and bias corrections
# change at every step and the replays draw each step's random bits from the step set on the device,
# so a replay with the captured constants or bits would part from the eager run; NVFP4's rowwise
# copies then take the amax of the kernel that wrote them, its columnwise copies on the second
# stream computing their own). The bf16-direct baseline is captured the same way and its losses
# equal its eager run's; --profile runs eagerly with a note; at hidden 1024 the large wgrad on the
# main stream keeps the losses too. --graph-dot writes each run's captured step as Graphviz dot,
# one file per run (FILE-NAME.ext), holding the step's kernels (the batch upload among them).
# Exit 0 pass, 1 fail, 77 skip.
set -u
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_gpu_train_graph.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs python3 (json)"; exit 77; }
. "${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/train_corpus.sh"
. "$HQ_TEST_SRCDIR/train_graph.sh"
train_corpus "$tmp/words.txt" || { echo "SKIP: no corpus (no awk and no /usr/share/dict/words)"; exit 77; }
hp="$conf/examples/high_precision.ini"

$hq train --device cuda --data "$tmp/words.txt" --steps 1 --batch 64 --hidden 64 --recipe "$hp" \
  --baseline none >/dev/null 2>"$tmp/probe"
if [ $? -ne 0 ]; then
  if grep -q "does not exist\|without CUDA\|no CUDA\|CUDA driver" "$tmp/probe"; then
    echo "SKIP: no CUDA device ($(head -n 1 "$tmp/probe"))"; exit 77
  fi
  cat "$tmp/probe"; fail "--device cuda failed on a machine with a GPU"
fi

graph_runs cuda "$tmp"
python3 - "$tmp/on.json" <<'PY' || exit 1
import json, sys
for r in json.load(open(sys.argv[1]))["recipes"]:
    if r["graph_replays"] != 12 - 3 + 1 or r["graph_note"] is not None:
        sys.exit("FAIL: %s: expected 10 replays (12 steps, 2 warm), got %s (note: %s)"
                 % (r["name"], r["graph_replays"], r["graph_note"]))
    # a step launches the next one's replay ahead when it is replayed itself (from step 2, the
    # capture, on) and nothing comes between them: every step from 2 to 10 but 4 and 9 (an
    # evaluation after 5 and 10 steps done), so the replays of steps 3, 4, 6, 7, 8, 9 and 11
    if r["graph_replays_ahead"] != 7:
        sys.exit("FAIL: %s: %s replays launched ahead, expected 7"
                 % (r["name"], r["graph_replays_ahead"]))
    # the graph holds at least the step's GEMMs (2 layers and the head: fprop, dgrad, wgrad
    # each) and the kernel that reads the batch and the optimizer's constants in place from
    # their page-locked staging buffers: no copy node (the losses above equal the eager run's,
    # which copies them) but the FP32 baseline's, whose weights' F32 copies are device-to-device
    # copies, and no memset node but NVFP4's (its quantize zeroes the padding of a block-scale
    # buffer with a memset; the buffer's rows are rounded up to 128, and at hidden 64 some have)
    copies = 0 if r["name"].startswith("fp32") else r["graph_copies"]
    memsets = 0 if "nvfp4" in r["name"] else r["graph_memsets"]
    if (r["graph_kernels"] < 10 or not r["graph_batch_mapped"] or copies != 0
            or memsets != 0):
        sys.exit("FAIL: %s: the graph's nodes: %s kernels, %s copies, %s memsets, batch read "
                 "in place: %s" % (r["name"], r["graph_kernels"], r["graph_copies"],
                                   r["graph_memsets"], r["graph_batch_mapped"]))
    # every captured step has the second stream with its three wgrads (2^19-2^20 multiply-adds:
    # under the size limit); the two layers' inputs and output gradients split their directions
    # where each is a storage of its own (tensors of 2^13-2^14 elements: under the limit), never
    # an identity copy's shared buffer
    splits = {"nvfp4": 4, "mxfp8": 4, "mxfp8-forward-nvfp4-backward": 4, "bf16-baseline": 0}
    if not r["graph_side_stream"] or r["graph_side_wgrads"] != 3:
        sys.exit("FAIL: %s: second stream %s, %s wgrads on it" %
                 (r["name"], r["graph_side_stream"], r["graph_side_wgrads"]))
    # every weight's write-back there (the FP32 baseline's is a copy of its own), a scaling
    # state's too (delayed scaling: the state updates after the lanes join)
    wb = 3
    if r["graph_side_writebacks"] != wb:
        sys.exit("FAIL: %s: %s weight write-backs on the second stream, expected %s"
                 % (r["name"], r["graph_side_writebacks"], wb))
    want = 0 if r["name"].startswith("fp32") else splits.get(r["name"])
    if want is not None and r["graph_side_splits"] != want:
        sys.exit("FAIL: %s: %s columnwise copies on the second stream, expected %s"
                 % (r["name"], r["graph_side_splits"], want))
    # NVFP4's activations and gradients (RHT on the columnwise copy, whose amax is its own):
    # their rowwise copies take the amax of the kernel that wrote them, there alone (recipe.ini:
    # the gradients; its inputs' MXFP8 rowwise copy has no amax); the other recipes' split
    # tensors take it in both directions, or none has an amax
    want = {"nvfp4": 4, "mxfp8-forward-nvfp4-backward": 2}.get(r["name"], 0)
    if r["graph_side_amaxes"] != want:
        sys.exit("FAIL: %s: %s rowwise copies take the writer's amax apart, expected %s"
                 % (r["name"], r["graph_side_amaxes"], want))
PY
grep -q -- "--cuda-graph:" "$tmp/on.err" && { cat "$tmp/on.err"; fail "a --cuda-graph note: every recipe is captured"; }

# the bf16-direct baseline: captured the same way, the same losses as without the graph
for g in on off; do
  $hq train --device cuda --data "$tmp/words.txt" --steps 12 --batch 128 --hidden 64 --layers 2 \
    --eval-every 5 --log-every 1 --recipe "$hp" --baseline bf16-direct --cuda-graph $g --json \
    > "$tmp/d_$g.json" 2> "$tmp/d_$g.err" || { cat "$tmp/d_$g.err"; fail "bf16-direct, --cuda-graph $g"; }
done
python3 - "$tmp/d_on.json" "$tmp/d_off.json" <<'PY' || exit 1
import json, sys
on, off = (json.load(open(p))["recipes"] for p in sys.argv[1:3])
for a, b in zip(on, off):
    if a["train_curve"] != b["train_curve"] or a["eval_curve"] != b["eval_curve"]:
        sys.exit("FAIL: %s: the losses differ with the graph on and off" % a["name"])
    if a["graph_replays"] != 10:
        sys.exit("FAIL: %s: %s replays, expected 10" % (a["name"], a["graph_replays"]))
    # bf16-direct calls cuBLASLt in its own order, on one stream
    if a["name"] == "bf16-direct" and a["graph_side_stream"]:
        sys.exit("FAIL: bf16-direct: a second stream")
PY

# layers whose wgrads fill the GPU keep them on the main stream, before dgrad, after a join with
# the second stream's copies (fc2: 256 x 1024 x 1024 = 2^28 multiply-adds, over the limit; fc1's
# 2^25 and lm_head's 2^25 under it): the same losses with the graph on and off
for g in on off; do
  $hq train --device cuda --data "$tmp/words.txt" --steps 8 --batch 256 --hidden 1024 --layers 2 \
    --eval-every 0 --log-every 1 --recipe "$conf/examples/nvfp4.ini" --recipe "$conf/recipe.ini" \
    --baseline none --cuda-graph $g --json > "$tmp/w_$g.json" 2> "$tmp/w_$g.err" \
    || { cat "$tmp/w_$g.err"; fail "--hidden 1024, --cuda-graph $g"; }
done
python3 - "$tmp/w_on.json" "$tmp/w_off.json" <<'PY' || exit 1
import json, sys
on, off = (json.load(open(p))["recipes"] for p in sys.argv[1:3])
for a, b in zip(on, off):
    if a["train_curve"] != b["train_curve"]:
        sys.exit("FAIL: %s, hidden 1024: the losses differ with the graph on and off" % a["name"])
    # every replay but the first (launched by the capture) is launched ahead: no evaluation
    if a["graph_replays_ahead"] != 5:
        sys.exit("FAIL: %s, hidden 1024: %s replays launched ahead, expected 5"
                 % (a["name"], a["graph_replays_ahead"]))
    if a["graph_replays"] != 6 or a["graph_side_wgrads"] != 2:
        sys.exit("FAIL: %s, hidden 1024: %s replays, %s wgrads on the second stream (expected "
                 "6 and 2: fc2's stays on the main one)"
                 % (a["name"], a["graph_replays"], a["graph_side_wgrads"]))
PY

# --graph-dot: one file per run, each a digraph of the captured step, said with the progress
$hq train --device cuda --data "$tmp/words.txt" --steps 4 --batch 64 --hidden 64 --recipe "$hp" \
  --recipe "$conf/examples/mxfp8.ini" --recipe "$conf/recipe.ini" \
  --recipe "$conf/examples/fp8_current.ini" --baseline none --graph-dot "$tmp/step.dot" \
  > "$tmp/dot.out" 2> "$tmp/dot.err" || { cat "$tmp/dot.err"; fail "--graph-dot"; }
for name in bf16-baseline mxfp8 mxfp8-forward-nvfp4-backward fp8-current-e4m3; do
  f="$tmp/step-$name.dot"
  [ -s "$f" ] || { ls "$tmp"; cat "$tmp/dot.err"; fail "--graph-dot: no $f"; }
  grep -q "digraph" "$f" || fail "--graph-dot: $f is not Graphviz dot"
  grep -q "upload_k" "$f" || fail "--graph-dot: $f lacks the batch upload kernel"
  grep -q "$name: the captured step's graph written to $f" "$tmp/dot.out" \
    || { cat "$tmp/dot.out"; fail "--graph-dot: $name's file not said"; }
  # the step's amax slots (recipe.ini's NVFP4 gradients, per-tensor FP8's fused amaxes) are
  # zeroed by the upload kernel, not by a zeroing kernel between it and the embedding
  ! grep -q "zero_words_kernel" "$f" \
    || fail "--graph-dot: $f zeroes the amaxes in a kernel of its own"
done

# --profile times phases between the kernels: eager, said once
$hq train --device cuda --data "$tmp/words.txt" --steps 4 --batch 64 --hidden 64 --recipe "$hp" \
  --baseline none --profile > /dev/null 2> "$tmp/p.err" || { cat "$tmp/p.err"; fail "--profile"; }
grep -q "cuda-graph: --profile" "$tmp/p.err" || { cat "$tmp/p.err"; fail "--profile: no note"; }
exit 0
