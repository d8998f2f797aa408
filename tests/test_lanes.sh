#!/bin/sh
# test_lanes.sh -- scripts/lanes.py, which reads scripts/lane_trace.c's CUPTI timeline of a
# replayed CUDA graph (scripts/gpu-check.sh --lanes): a hand-made trace of four replays of a
# four-node graph on two streams (the first two left out by --skip's default), an eager launch
# and a memcpy outside any graph, and a second graph whose one node runs three times; the streams,
# the medians and the longest idle stretch are worked out by hand below. --timeline lists the
# median replay; a trace with no replay past --skip and an unknown argument are refused by name.
# Exit 0 pass, 1 fail, 77 skip (automake).
set -u
src=${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/..
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_lanes.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs python3"; exit 77; }
k='_ZN46_GLOBAL__N__b0a10f64_13_nvfp4_gemm_cu_bc32c75617small_gemm_kernelILi1EEEvNS_8GemmArgsE'
{
  echo "kind,start_ns,end_ns,stream,graph,node,name"
  echo "kernel,0,5000,7,0,0,_Z9fwd_eagerPf"
  echo "memcpy,1000,2000,7,0,0,memcpy 64 bytes"
  # a replay every 100 us: A [0, 10] and C [12, 20] on stream 7, B [2, 6] and D [14, 24] on 8
  for r in 0 1 2 3; do
    b=$((100000 * (r + 1)))
    echo "kernel,$b,$((b + 10000)),7,5,1,_Z5nodeAv"
    echo "kernel,$((b + 2000)),$((b + 6000)),8,5,2,$k"
    echo "memcpy,$((b + 12000)),$((b + 20000)),7,5,3,memcpy 1024 bytes"
    echo "kernel,$((b + 14000)),$((b + 24000)),8,5,4,_Z8quantizeILi1EEv4Args"
  done
  for r in 0 1 2; do echo "kernel,$((900000 + 10000 * r)),$((903000 + 10000 * r)),9,6,1,x"; done
} > "$tmp/t.csv"
python3 "$src/scripts/lanes.py" --names bf16,nvfp4 --timeline "$tmp/t.csv" > "$tmp/out.txt" \
  2> "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "lanes.py on a good trace"; }
# span 24; summed 10 + 4 + 8 + 10 = 32; union [0, 10] + [12, 24] = 22: idle 2, overlap 10;
# stream 7 busy 10 + 8 ending at 20, stream 8 busy 4 + 10 ending at 24; nothing runs from 10
# (A's end; B ended at 6) to 12 (the memcpy). Graph 6: one replay left, no idle stretch
cat > "$tmp/want.txt" <<'W'
bf16: 2 replays, 4 nodes a replay on 2 streams (medians)
  span 24.0 us, nodes 32.0 us summed, 22.0 us busy: idle 2.0 us, overlap 10.0 us
  longest idle stretch 2.0 us, after nodeA and before memcpy 1024 bytes
  stream 7        2 nodes, busy    18.0 us, its last node ends at    20.0 us
  stream 8        2 nodes, busy    14.0 us, its last node ends at    24.0 us
  the replay of median span, node by node (start, duration, stream):
        0.00   10.00  7      nodeA
        2.00    4.00  8      small_gemm_kernel
       12.00    8.00  7      memcpy 1024 bytes
       14.00   10.00  8      quantize
nvfp4: 1 replays, 1 nodes a replay on 1 streams (medians)
  span 3.0 us, nodes 3.0 us summed, 3.0 us busy: idle 0.0 us, overlap 0.0 us
  longest idle stretch: none
  stream 9        1 nodes, busy     3.0 us, its last node ends at     3.0 us
  the replay of median span, node by node (start, duration, stream):
        0.00    3.00  9      x
W
diff "$tmp/want.txt" "$tmp/out.txt" || fail "the report differs from the hand-worked medians"
python3 "$src/scripts/lanes.py" --skip 4 "$tmp/t.csv" > "$tmp/out.txt" 2>&1 \
  && fail "a trace with no replay past --skip was accepted"
grep -q "no graph replay past the first 4" "$tmp/out.txt" \
  || { cat "$tmp/out.txt"; fail "its message"; }
python3 "$src/scripts/lanes.py" --bad "$tmp/t.csv" > "$tmp/out.txt" 2>&1 \
  && fail "an unknown argument was accepted"
grep -q "unknown argument '--bad'" "$tmp/out.txt" || { cat "$tmp/out.txt"; fail "its message"; }
echo "PASS: lanes.py"
