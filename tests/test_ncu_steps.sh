#!/bin/sh
# test_ncu_steps.sh -- scripts/ncu_steps.py, which sums a training step's kernels from Nsight
# Compute's CSV (scripts/gpu-check.sh --step-kernels; docs/performance.md's kernel sums): a
# hand-made file of fourteen launches in three time units, with the program's own lines and ncu's
# ==PROF== lines between them; the launches before the first step kernel (the embedding's
# backward) and after the last (an evaluation's forwards, whose loss sums once ended each "step")
# are left out, the two whole steps between them summed by hand below. A file with one step
# kernel, a time in an unknown unit and a bad argument are refused by name; --calls lists one
# step's launches of a kernel; --launches prints every launch's time. Exit 0 pass, 1 fail, 77
# skip (automake).
set -u
src=${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/..
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_ncu_steps.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs python3"; exit 77; }
h='"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
row() { # ID NAME UNIT VALUE
  printf '"%s","1","hq","h","%s","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","%s","%s"\n' "$1" "$2" "$3" "$4"
}
{
  echo "==PROF== Connected to process 1 (hq)"
  echo "[1/1] bf16-baseline step 1/3"
  echo "$h"
  row 0 "void fwd_k(float *)" usecond 5
  row 1 "void embed_bwd_part_k(const float *, const int *, long, int, int, float *)" nsecond "2,000"
  row 2 "void (anonymous namespace)::quantize<1>(Args)" usecond 3
  row 3 "void fwd_k(float *)" msecond 0.005
  echo "==PROF== Disconnected"
  row 4 "void xent_sum_k(const double *, long, float *)" usecond 2
  row 5 "void embed_bwd_part_k(const float *, const int *, long, int, int, float *)" usecond 2
  row 6 "void (anonymous namespace)::quantize<1>(Args)" usecond 4
  row 7 "void fwd_k(float *)" usecond 5
  row 8 "void xent_sum_k(const double *, long, float *)" usecond 2
  row 9 "void embed_bwd_part_k(const float *, const int *, long, int, int, float *)" usecond 2
  echo "[eval] held-out loss"
  row 10 "void fwd_k(float *)" usecond 1
  row 11 "void xent_sum_k(const double *, long, float *)" usecond 1
  row 12 "void fwd_k(float *)" usecond 1
  row 13 "void xent_sum_k(const double *, long, float *)" usecond 1
} > "$tmp/a.csv"
python3 "$src/scripts/ncu_steps.py" "bf16=$tmp/a.csv" > "$tmp/out.txt" 2> "$tmp/err.txt" \
  || { cat "$tmp/err.txt"; fail "ncu_steps.py on a good file"; }
# steps: launches 1..8 (two whole steps): embed_bwd 2 + 2, quantize 3 + 4, fwd 5 + 5, xent 2 + 2
# = 25 us; the evaluation's four launches after them are not a step
cat > "$tmp/want.txt" <<'W'
bf16: 2 whole steps, 4.0 kernels and 12.5 us of kernel time a step
  fwd_k                                              1.0 calls      5.00 us/step     5.00 us/call
  quantize                                           1.0 calls      3.50 us/step     3.50 us/call
  embed_bwd_part_k                                   1.0 calls      2.00 us/step     2.00 us/call
  xent_sum_k                                         1.0 calls      2.00 us/step     2.00 us/call
W
diff "$tmp/want.txt" "$tmp/out.txt" || fail "the summary differs from the hand sums"
# --calls: the first whole step's launches of one kernel, with their grid and, where the file
# has it, the DRAM bytes each read (one launch in Mbyte, one in Kbyte, one without the counter)
dram() { # ID UNIT VALUE
  printf '"%s","1","hq","h","x","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","%s","%s"\n' "$1" "$2" "$3"
}
{ cat "$tmp/a.csv"; dram 2 Mbyte 1.5; dram 6 Kbyte 250; } > "$tmp/d.csv"
python3 "$src/scripts/ncu_steps.py" --calls quantize "d=$tmp/d.csv" > "$tmp/out.txt" \
  2> "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "ncu_steps.py --calls"; }
tail -n 2 "$tmp/out.txt" > "$tmp/calls.txt"
cat > "$tmp/want.txt" <<'W'
d: the launches of its first whole step matching /quantize/:
  quantize                                 grid (8, 1, 1)          3.00 us     1.50 MB read
W
diff "$tmp/want.txt" "$tmp/calls.txt" || fail "--calls lists other launches"
python3 "$src/scripts/ncu_steps.py" --calls fwd_k "a=$tmp/a.csv" | tail -n 1 > "$tmp/calls.txt"
echo "  fwd_k                                    grid (8, 1, 1)          5.00 us" > "$tmp/want.txt"
diff "$tmp/want.txt" "$tmp/calls.txt" || fail "--calls without DRAM counters"
{ echo "$h"; row 0 "void embed_bwd_part_k(float *)" usecond 2; row 1 "void fwd_k(float *)" usecond 1; } \
  > "$tmp/one.csv"
python3 "$src/scripts/ncu_steps.py" "x=$tmp/one.csv" > /dev/null 2> "$tmp/err.txt" \
  && fail "one step kernel accepted"
grep -q "1 launches of the step kernel" "$tmp/err.txt" || fail "one step kernel: $(cat "$tmp/err.txt")"
{ echo "$h"; row 0 "void embed_bwd_part_k(float *)" furlong 2; } > "$tmp/unit.csv"
python3 "$src/scripts/ncu_steps.py" "u=$tmp/unit.csv" > /dev/null 2> "$tmp/err.txt" \
  && fail "an unknown time unit accepted"
grep -q "u: $tmp/unit.csv: not ncu's gpu__time_duration.sum CSV: unknown time unit 'furlong'" \
  "$tmp/err.txt" || fail "unknown unit: $(cat "$tmp/err.txt")"
python3 "$src/scripts/ncu_steps.py" "$tmp/a.csv" > /dev/null 2> "$tmp/err.txt" \
  && fail "an argument without a label accepted"
grep -q "want LABEL=CSV" "$tmp/err.txt" || fail "no label: $(cat "$tmp/err.txt")"
# --launches: every launch's microseconds in order (the ==PROF== and program lines skipped)
python3 "$src/scripts/ncu_steps.py" --launches "$tmp/a.csv" > "$tmp/out.txt" \
  || fail "--launches on a good file"
echo "5.00 2.00 3.00 5.00 2.00 2.00 4.00 5.00 2.00 2.00 1.00 1.00 1.00 1.00 us" > "$tmp/want.txt"
diff "$tmp/want.txt" "$tmp/out.txt" || fail "--launches"
echo "==PROF== nothing" > "$tmp/none.csv"
python3 "$src/scripts/ncu_steps.py" --launches "$tmp/none.csv" > /dev/null 2> "$tmp/err.txt" \
  && fail "--launches on a file without counters"
grep -q "holds no gpu__time_duration.sum counters" "$tmp/err.txt" \
  || fail "--launches: $(cat "$tmp/err.txt")"
echo "PASS: ncu_steps.py"
