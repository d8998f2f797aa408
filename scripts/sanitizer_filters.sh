#!/bin/bash
# sanitizer_filters.sh -- which failed compute-sanitizer runs of hq's GPU tests still count as
# clean (scripts/gpu-check.sh --sanitize sources it; tests/test_sanitizer_filters.sh checks it
# on hand-written logs). Each function takes TOOL LOG, prints why the run counts as clean and
# returns 0, or returns 1: the run failed.

# racecheck also instruments the kernels of the libraries hq calls: cuBLASLt's warp-
# specialized GEMM kernels (nvjet_*, *xmma*, cutlass*) order their shared memory through
# mbarriers and TMA, which racecheck reports as hazards (H200, cuBLASLt 13.1: 384 in one
# nvjet kernel of test_gpu_fp8_tensor's native FP8 GEMM). A racecheck run counts as clean
# in hq's kernels when its test passed and every reported access lies in such a kernel;
# prints which, else fails. synccheck keeps no exception, memcheck the one below.
san_library_races() { # TOOL LOG
  [ "$1" = racecheck ] || return 1
  grep -q '^\[  PASSED  \]' "$2" && ! grep -q '^\[  FAILED  \]' "$2" || return 1
  local ks
  ks=$(grep -oE 'access at [^ +]+' "$2" | awk '{print $3}' | sort -u)
  [ -n "$ks" ] || return 1
  ! grep -vqE '^(nvjet_|cutlass|cublas)|xmma' <<< "$ks" || return 1
  echo "race reports: $(grep -c 'Race reported' "$2"), all inside cuBLASLt's kernels ($(echo $ks))"
}
# memcheck also reports every CUDA call that returns an error: test_gpu_graph_step's
# test_ctx_capturing makes stream-capture calls fail on purpose (a synchronization inside a
# capture, the legacy stream's query while a blocking stream captures) and checks that hq
# reports them. A memcheck run counts as clean when its test passed and every reported
# error is such a cudaErrorStreamCapture* whose backtrace passes through that test; prints
# how many, else fails.
san_provoked_api_errors() { # TOOL LOG
  [ "$1" = memcheck ] || return 1
  grep -q '^\[  PASSED  \]' "$2" && ! grep -q '^\[  FAILED  \]' "$2" || return 1
  local total provoked
  total=$(sed -n 's/^========= ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$2")
  # a report starts at "========= X..." (its backtrace lines are indented further)
  provoked=$(awk '/^========= [A-Z]/ { if (cap && ours) n++;
                    cap = /Program hit cudaErrorStreamCapture/; ours = 0 }
                  /Host Frame: test_ctx_capturing / { ours = 1 }
                  END { if (cap && ours) n++; print n + 0 }' "$2")
  [ -n "$total" ] && [ "$total" -gt 0 ] && [ "$total" = "$provoked" ] || return 1
  echo "API errors: $total, all stream-capture errors test_ctx_capturing provokes"
}
