#!/bin/sh
# test_sanitizer_filters.sh -- scripts/sanitizer_filters.sh, which says which failed
# compute-sanitizer runs of the GPU tests still count as clean (gpu-check.sh --sanitize), on
# hand-written logs in compute-sanitizer's layout: racecheck hazards all inside cuBLASLt's
# kernels count, one in an hq kernel does not; memcheck's API errors count when every one is a
# stream-capture error raised under test_ctx_capturing (which provokes them on purpose), not
# when one comes from elsewhere, is of another kind, or a memory error sits beside them; a
# failed test never counts, nor a log of another tool. Exit 0 pass, 1 fail, 77 skip (automake).
set -u
src=${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/..
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_san_filters.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v bash >/dev/null 2>&1 || { echo "SKIP: needs bash"; exit 77; }
command -v awk >/dev/null 2>&1 || { echo "SKIP: needs awk"; exit 77; }
# counts NAME TOOL LOG EXPECT: the filter's verdict (0 counts as clean, 1 not) and its words
# (on stdout; a failure's message on stderr)
counts() {
  out=$(bash -c '. "$1"; "$2" "$3" "$4"' sh "$src/scripts/sanitizer_filters.sh" "$1" "$2" "$3")
  got=$?
  [ "$got" -eq "$4" ] || fail "$1 $2 $(basename "$3"): returned $got, expected $4 ($out)"
  [ "$got" -ne 0 ] || [ -n "$out" ] || fail "$1 $2 $(basename "$3"): clean without saying why"
  echo "$out"
}
passed='[  PASSED  ] 8 test(s).'
api() { # LINE FRAME: one API error with its host backtrace
  printf '========= Program hit %s on CUDA API call to cudaStreamSynchronize.\n' "$1"
  printf '=========     Saved host backtrace up to driver entry point at error\n'
  printf '=========         Host Frame: hqi_cuda_capture_query in device.c:252 [0xb7de] in libhqcore.so.2\n'
  printf '=========         Host Frame: %s in test_gpu_graph_step.c:448 [0x4169] in test_gpu_graph_step\n' "$2"
  printf '=========         Host Frame:  [0x58f7] in libcmocka.so.0\n'
  printf '========= \n'
}
cap='cudaErrorStreamCaptureUnsupported (error 900) due to "operation not permitted when stream is capturing"'
imp='cudaErrorStreamCaptureImplicit (error 906) due to "operation would make the legacy stream depend on a capturing blocking stream"'
oom='cudaErrorMemoryAllocation (error 2) due to "out of memory"'
{ echo '========= COMPUTE-SANITIZER'; echo '[==========] Running 8 test(s).'
  api "$cap" test_ctx_capturing; api "$imp" test_ctx_capturing
  echo "$passed"; echo '========= ERROR SUMMARY: 2 errors'; } > "$tmp/provoked.log"
msg=$(counts san_provoked_api_errors memcheck "$tmp/provoked.log" 0) || exit 1
case $msg in *"API errors: 2,"*) ;; *) fail "provoked.log: '$msg' does not count 2 errors" ;; esac
counts san_provoked_api_errors racecheck "$tmp/provoked.log" 1 >/dev/null
counts san_library_races memcheck "$tmp/provoked.log" 1 >/dev/null
# one of the two raised outside test_ctx_capturing
{ echo '========= COMPUTE-SANITIZER'; api "$cap" test_ctx_capturing; api "$imp" test_step_in_a_graph
  echo "$passed"; echo '========= ERROR SUMMARY: 2 errors'; } > "$tmp/elsewhere.log"
counts san_provoked_api_errors memcheck "$tmp/elsewhere.log" 1 >/dev/null
# another kind of error under the same test
{ echo '========= COMPUTE-SANITIZER'; api "$cap" test_ctx_capturing; api "$oom" test_ctx_capturing
  echo "$passed"; echo '========= ERROR SUMMARY: 2 errors'; } > "$tmp/kind.log"
counts san_provoked_api_errors memcheck "$tmp/kind.log" 1 >/dev/null
# a memory error beside the provoked ones
{ echo '========= COMPUTE-SANITIZER'; api "$cap" test_ctx_capturing
  echo '========= Invalid __global__ read of size 4 bytes'
  echo '=========     at quantize_kernel+0x1a0 in nvfp4.cu:812'
  echo '========= '
  echo "$passed"; echo '========= ERROR SUMMARY: 2 errors'; } > "$tmp/memory.log"
counts san_provoked_api_errors memcheck "$tmp/memory.log" 1 >/dev/null
# the test failed
sed 's/^\[  PASSED  \] 8 test(s)\./[  FAILED  ] 1 test(s), listed below:/' "$tmp/provoked.log" \
  > "$tmp/failed.log"
counts san_provoked_api_errors memcheck "$tmp/failed.log" 1 >/dev/null
# racecheck: hazards in cuBLASLt's kernels alone, then one in an hq kernel too
race() { # KERNEL
  printf '========= Error: Race reported between Write access at %s+0x3c0 in gemm.cu:1\n' "$1"
  printf '=========     and Read access at %s+0x400 in gemm.cu:2 [4 hazards]\n' "$1"
}
{ echo '========= COMPUTE-SANITIZER'; race nvjet_sm90_tst_128x256; race sm90_xmma_gemm_e4m3
  echo "$passed"; echo '========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)'; } \
  > "$tmp/lib.log"
msg=$(counts san_library_races racecheck "$tmp/lib.log" 0) || exit 1
case $msg in *"race reports: 2,"*nvjet_sm90_tst_128x256*) ;; *) fail "lib.log: '$msg'" ;; esac
{ cat "$tmp/lib.log"; race rowq_kernel; } > "$tmp/ours.log"
counts san_library_races racecheck "$tmp/ours.log" 1 >/dev/null
counts san_provoked_api_errors memcheck "$tmp/lib.log" 1 >/dev/null
echo "PASS: sanitizer filters (12 verdicts on 8 logs)"
