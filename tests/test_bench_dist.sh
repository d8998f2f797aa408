#!/bin/sh
# test_bench_dist.sh -- `mpirun -np 2 hq bench --dist` on the CPU (tools/bench_dist.c): it runs,
# and rank 0 alone prints one row per stock format, each with its bytes, times and bandwidths as
# numbers; a shape whose rows do not split over the ranks and --device cuda without a GPU per
# rank (or without NCCL) are refused with a message, not a hang. Skips (77) without mpirun or
# without the MPI backend.
set -u
mpirun=${HQ_MPIRUN:-}
hq=${HQ_BIN:-}
[ -n "$mpirun" ] && command -v "$mpirun" >/dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
[ -n "$hq" ] && [ -x "$hq" ] || { echo "SKIP: no hq"; exit 77; }
[ -n "${HQ_TEST_DIST_MPI:-}" ] && [ -x "$HQ_TEST_DIST_MPI" ] || { echo "SKIP: built without MPI"; exit 77; }
. "${HQ_TEST_SRCDIR:-.}/mpirun_env.sh"   # $flags, the sanitizers' options
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_bench_dist.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# shellcheck disable=SC2086
timeout 300 "$mpirun" $flags -np 2 "$hq" bench --dist --shape 256x512 --iters 3 --warmup 1 \
  > "$tmp/out" 2> "$tmp/err" || { cat "$tmp/out" "$tmp/err"; echo "FAIL: mpirun -np 2 hq bench --dist"; exit 1; }
cat "$tmp/out"
grep -q "^hq bench --dist: 2 ranks" "$tmp/out" || { echo "FAIL: no header naming 2 ranks"; exit 1; }
for f in "identity dtype=bf16" "fp8_tensor" "mxfp8" "nvfp4" "fp8_block block=1d" "fp8_block block=2d"; do
  # the label, then bytes and 8 decimals: hq ms/algbw/busbw, raw ms/algbw/busbw, hq%, xbf16
  n=$(grep -c "^$f  *[0-9][0-9]*\( [ ]*[0-9][0-9]*\.[0-9]*\)\{8\}$" "$tmp/out")
  [ "$n" -eq 1 ] || { echo "FAIL: $n rows for '$f' (rank 0 alone prints one)"; exit 1; }
done
# identity bf16 sends the bf16 weight itself: its bytes are 256*512*2 times its directions (1 or 2)
b=$(awk '/^identity dtype=bf16 /{print $3}' "$tmp/out")
[ "$b" = 262144 ] || [ "$b" = 524288 ] || { echo "FAIL: identity bf16 moved $b bytes"; exit 1; }

# shellcheck disable=SC2086
timeout 120 "$mpirun" $flags -np 2 "$hq" bench --dist --shape 255x512 --iters 1 > "$tmp/out" 2> "$tmp/err"
[ $? -ne 0 ] && grep -q "255 rows do not split evenly over 2 ranks" "$tmp/err" ||
  { cat "$tmp/out" "$tmp/err"; echo "FAIL: 255 rows over 2 ranks not refused"; exit 1; }
if ! command -v nvidia-smi >/dev/null 2>&1; then
  # shellcheck disable=SC2086
  timeout 120 "$mpirun" $flags -np 2 "$hq" bench --dist --device cuda --iters 1 > "$tmp/out" 2> "$tmp/err"
  [ $? -ne 0 ] && grep -q "needs NCCL\|needs one GPU per local rank\|cudaGetDeviceCount" "$tmp/err" ||
    { cat "$tmp/out" "$tmp/err"; echo "FAIL: --device cuda without GPUs not refused"; exit 1; }
fi
echo "PASS"
