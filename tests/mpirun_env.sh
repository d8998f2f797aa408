# mpirun_env.sh -- sourced by the tests that run under mpirun (test_dist_mpi.sh,
# test_train_dist.sh): sets $flags, the mpirun options, and the sanitizers' options.
# As root (CI), mpirun needs --allow-run-as-root; --oversubscribe runs 4 ranks on 2 cores.
flags="--oversubscribe --mca btl self,tcp"
[ "$(id -u)" -eq 0 ] && flags="$flags --allow-run-as-root"
# under AddressSanitizer: Open MPI's own allocations kept until exit are not hq's leaks; the
# slow unwinder walks through Open MPI's frames (no frame pointers), which the fast one
# attributes to whatever library lies next to them, so that the suppressions match
LSAN_OPTIONS="suppressions=${HQ_TEST_SRCDIR:-.}/lsan_mpi.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
export LSAN_OPTIONS ASAN_OPTIONS
