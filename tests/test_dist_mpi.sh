#!/bin/sh
# test_dist_mpi.sh -- the FSDP gather across ranks through Open MPI (tests/test_dist_mpi.c):
# every test of the program under `mpirun -np 2` and `mpirun -np 4`, then a job whose last rank
# is killed before the gather: every other rank must print that it came back with HQ_EIO (no
# hang: the job runs under a time limit); built with NCCL, tests/test_dist_nccl under
# `mpirun -np 2` (it skips without a GPU per rank). Skips (77) without mpirun or without the MPI
# backend.
# As root (CI), mpirun needs --allow-run-as-root; --oversubscribe runs 4 ranks on 2 cores.
set -u
mpirun=${HQ_MPIRUN:-}
prog=${HQ_TEST_DIST_MPI:-}
[ -n "$mpirun" ] && command -v "$mpirun" >/dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
[ -n "$prog" ] && [ -x "$prog" ] || { echo "SKIP: built without MPI"; exit 77; }
. "${HQ_TEST_SRCDIR:-.}/mpirun_env.sh"   # $flags, the sanitizers' options
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_dist.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for np in 2 4; do
  echo "== mpirun -np $np"
  # shellcheck disable=SC2086
  timeout 600 "$mpirun" $flags -np $np "$prog" || { echo "FAIL: mpirun -np $np"; exit 1; }
done
for np in 2 4; do
  echo "== mpirun -np $np, the last rank killed before the gather"
  # mpirun would kill the survivors as soon as one rank dies (Open MPI 4's ORTE): asked not to,
  # it lets them come back from the gather. Its own status reports the dead rank: the
  # survivors' lines are the test.
  # shellcheck disable=SC2086
  timeout 120 "$mpirun" $flags --mca orte_abort_on_non_zero_status 0 -np $np "$prog" die > "$tmp/out" 2> "$tmp/err"
  rc=$?
  [ $rc -ne 124 ] || { cat "$tmp/out" "$tmp/err"; echo "FAIL: -np $np: the job hung"; exit 1; }
  cat "$tmp/out"
  got=$(grep -c "^rank [0-9]* survived: HQ_EIO" "$tmp/out")
  [ "$got" -eq $((np - 1)) ] || { cat "$tmp/err"; echo "FAIL: -np $np: $got of $((np - 1)) ranks came back with HQ_EIO"; exit 1; }
done
nccl=${HQ_TEST_DIST_NCCL:-}
if [ -n "$nccl" ] && [ -x "$nccl" ]; then
  echo "== NCCL: mpirun -np 2"
  # shellcheck disable=SC2086
  timeout 600 "$mpirun" $flags -np 2 "$nccl"
  rc=$?
  case $rc in
    0) ;;
    77) echo "NCCL: skipped (not a GPU per rank)" ;;
    *) echo "FAIL: NCCL: mpirun -np 2: status $rc"; exit 1 ;;
  esac
fi
echo "PASS"
