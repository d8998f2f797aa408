#!/bin/sh
# test_install.sh -- scripts/install.sh configures build/release again when the arguments it
# would pass differ from the existing configuration's (a second run with another PREFIX), and
# reuses it when they are the same. The script runs for real on a copy of itself in a scratch
# tree, without root, packages or network: the tree's configure is a fake that records its
# arguments and writes a config.status answering --config as autoconf's does; make, dpkg, sudo
# and ldconfig on PATH are fakes, and `make install` puts an hq into the prefix that says which
# prefix it is in. The CUDA choice (scripts/build-args.sh): HQ_CUDA_ARCH as given, else native
# where nvidia-smi reports a GPU of compute capability 9.0 or 10.x and the CPU paths only where
# it reports none (fake nvcc and nvidia-smi); ccache is left out (HQ_CCACHE=no).
# Exit 0 pass, 1 fail, 77 skip (automake's protocol).
set -u
src=${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/..
command -v bash >/dev/null || { echo "SKIP: install.sh needs bash"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
n=0
fail() { echo "FAIL: $*"; [ -f "$tmp/out" ] && cat "$tmp/out"; exit 1; }
ok() { n=$((n + 1)); }

tree=$tmp/tree
mkdir -p "$tree/scripts" "$tmp/bin"
cp "$src/scripts/install.sh" "$src/scripts/build-args.sh" "$tree/scripts/"
log=$tmp/calls
: > "$log"
HQ_FAKE_LOG=$log
export HQ_FAKE_LOG

# configure: one line per call in the log; config.status --config prints the arguments the way
# autoconf 2.69 does (each one in single quotes, ' as '\'', -q dropped)
cat > "$tree/configure" <<'EOF'
#!/bin/sh
line=configure cfg= prefix=
for a do
  line="$line [$a]"
  case $a in -q) continue ;; --prefix=*) prefix=${a#--prefix=} ;; esac
  cfg="$cfg '$(printf '%s' "$a" | sed "s/'/'\\\\''/g")'"
done
echo "$line" >> "$HQ_FAKE_LOG"
echo "prefix = $prefix" > Makefile
cat > config.status <<STATUS
#!/bin/sh
[ "\$1" = --config ] || exit 1
cat <<'CONFIG'
${cfg# }
CONFIG
STATUS
chmod +x config.status
EOF
chmod +x "$tree/configure"

# make: `make install` writes PREFIX/bin/hq, which prints its arguments and its prefix
cat > "$tmp/bin/make" <<'EOF'
#!/bin/sh
echo "make $*" >> "$HQ_FAKE_LOG"
case " $* " in
*" install "*)
  prefix=$(sed -n 's/^prefix = //p' Makefile)
  mkdir -p "$prefix/bin"
  { echo '#!/bin/sh'; echo "echo \"hq \$* from \$(dirname \"\$(dirname \"\$0\")\")\""
    echo 'echo "blas ${OPENBLAS_CORETYPE:-default}"'; } > "$prefix/bin/hq"
  chmod +x "$prefix/bin/hq" ;;
esac
EOF
printf '#!/bin/sh\nexit 0\n' > "$tmp/bin/dpkg"              # every package is installed
printf '#!/bin/sh\necho "apt-get $*" >> "$HQ_FAKE_LOG"\nexit 1\n' > "$tmp/bin/apt-get"
printf '#!/bin/sh\nexec "$@"\n' > "$tmp/bin/sudo"
printf '#!/bin/sh\nexit 0\n' > "$tmp/bin/ldconfig"
chmod +x "$tmp/bin/make" "$tmp/bin/dpkg" "$tmp/bin/apt-get" "$tmp/bin/sudo" "$tmp/bin/ldconfig"

# run_install PREFIX: run the script with that prefix (no nvcc, unless $cuda names a folder with
# one; the CPU flags of $cpuinfo); the output is in $tmp/out
cuda=$tmp/nocuda arch=none cpuinfo=$tmp/cpuinfo
printf 'processor\t: 0\nflags\t\t: fpu sse2 avx fma4\n' > "$tmp/cpuinfo"
run_install() {
  PATH="$tmp/bin:$PATH" PREFIX=$1 HQ_CUDA_BIN=$cuda HQ_CUDA_ARCH=$arch HQ_CCACHE=no \
    HQ_CPUINFO=$cpuinfo bash "$tree/scripts/install.sh" > "$tmp/out" 2>&1 ||
    fail "install.sh with PREFIX=$1 exited with status $?"
}
configures() { grep -c '^configure' "$log"; }

a=$tmp/a b="$tmp/it's b"
run_install "$a"
[ "$(configures)" -eq 1 ] || fail "first run: $(configures) configure calls"; ok
grep -qxF "configure [-q] [--prefix=$a] [--without-cuda]" "$log" || fail "first run: configure's arguments"; ok
grep -qxF "hq train from $a" "$tmp/out" || fail "first run: hq train from $a"; ok

grep -qxF "blas default" "$tmp/out" || fail "a CPU without AVX2: OpenBLAS's kernel choice changed"; ok

# the main job with OpenBLAS's AVX2 kernels, the README's figures, where the CPU has AVX2 and
# FMA; a kernel the user chose is kept
printf 'processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n' > "$tmp/cpuinfo_avx2"
cpuinfo=$tmp/cpuinfo_avx2
run_install "$a"
grep -qxF "blas Haswell" "$tmp/out" || fail "AVX2 and FMA: not OPENBLAS_CORETYPE=Haswell"; ok
grep -qF "with OPENBLAS_CORETYPE=Haswell: the AVX2 kernels of OpenBLAS" "$tmp/out" || fail "AVX2: the reason"; ok
OPENBLAS_CORETYPE=Zen run_install "$a"
grep -qxF "blas Zen" "$tmp/out" || fail "OPENBLAS_CORETYPE=Zen was not kept"; ok
unset OPENBLAS_CORETYPE # (an assignment before a function call may outlive it in sh)
cpuinfo=$tmp/cpuinfo

run_install "$a"
[ "$(configures)" -eq 1 ] || fail "the same PREFIX again reconfigured"; ok
grep -qxF "hq train from $a" "$tmp/out" || fail "the same PREFIX again: hq train from $a"; ok

# another PREFIX (with a space and a quote): configured again, installed and run there
run_install "$b"
[ "$(configures)" -eq 2 ] || fail "another PREFIX did not reconfigure"; ok
[ "$(tail -1 "$log")" = "make -s install" ] || fail "another PREFIX: last call $(tail -1 "$log")"; ok
grep -qxF "configure [-q] [--prefix=$b] [--without-cuda]" "$log" || fail "another PREFIX: configure's arguments"; ok
grep -qxF "hq train from $b" "$tmp/out" || fail "another PREFIX: hq train from $b"; ok
run_install "$b"
[ "$(configures)" -eq 2 ] || fail "a quoted PREFIX is not recognised again"; ok

# autoconf 2.71 leaves safe arguments unquoted; a configuration with one more argument (made
# by hand, say) is not the script's
printf '#!/bin/sh\necho "--prefix=%s --without-cuda"\n' "$a" > "$tree/build/release/config.status"
run_install "$a"
[ "$(configures)" -eq 2 ] || fail "an unquoted --config answer was not recognised"; ok
printf '#!/bin/sh\necho "--prefix=%s --without-cuda --enable-werror"\n' "$a" > "$tree/build/release/config.status"
run_install "$a"
[ "$(configures)" -eq 3 ] || fail "a configuration with another argument was reused"; ok
# a Makefile without a config.status that answers: configure
rm -f "$tree/build/release/config.status"
run_install "$a"
[ "$(configures)" -eq 4 ] || fail "a build directory without config.status was reused"; ok
grep -q '^apt-get' "$log" && fail "apt-get ran although dpkg reports every package"; ok

# CUDA: nvcc found (a fake, in $cuda); nvidia-smi (a fake on PATH) decides native or the CPU
cuda=$tmp/cuda arch=
mkdir -p "$cuda"
printf '#!/bin/sh\necho "nvcc $*" >> "$HQ_FAKE_LOG"\n' > "$cuda/nvcc"
printf '#!/bin/sh\nexit 9\n' > "$tmp/bin/nvidia-smi"   # as without a driver: no GPU
chmod +x "$cuda/nvcc" "$tmp/bin/nvidia-smi"
run_install "$a"
[ "$(tail -1 "$log")" = "make -s install" ] || fail "nvcc without a GPU: last call $(tail -1 "$log")"
grep -qxF "configure [-q] [--prefix=$a] [--without-cuda]" "$log" || fail "nvcc without a GPU: not the CPU build"
grep -qF "== CUDA: nvcc found but no GPU of compute capability 9.0 or 10.x: the CPU paths only" "$tmp/out" ||
  fail "nvcc without a GPU: the reason"; ok
printf '#!/bin/sh\nprintf "9.0\\n9.0\\n"\n' > "$tmp/bin/nvidia-smi"   # two H100s
run_install "$a"
grep -qxF "configure [-q] [--prefix=$a] [--with-cuda-arch=native]" "$log" || fail "a Hopper GPU: not native"
grep -qF "== CUDA: built for this machine's GPUs (compute capability 90;" "$tmp/out" || fail "a Hopper GPU: the reason"; ok
printf '#!/bin/sh\nprintf "8.9\\n"\n' > "$tmp/bin/nvidia-smi"   # a GPU hq's kernels do not target
run_install "$a"
[ "$(grep '^configure' "$log" | tail -1)" = "configure [-q] [--prefix=$a] [--without-cuda]" ] || fail "an sm_89 GPU: not the CPU build"
grep -qF "no GPU of compute capability 9.0 or 10.x (found: 89)" "$tmp/out" || fail "an sm_89 GPU: the reason"; ok
arch=all
run_install "$a"
[ "$(grep '^configure' "$log" | tail -1)" = "configure [-q] [--prefix=$a] [--with-cuda-arch=all]" ] || fail "HQ_CUDA_ARCH=all"; ok
# asked for CUDA where there is no nvcc: refused (where a PATH of the system folders has none)
cuda=$tmp/nocuda
if ! PATH="$tmp/bin:/usr/bin:/bin" command -v nvcc > /dev/null; then
  PATH="$tmp/bin:/usr/bin:/bin" PREFIX=$a HQ_CUDA_BIN=$cuda HQ_CUDA_ARCH=all HQ_CCACHE=no \
    bash "$tree/scripts/install.sh" > "$tmp/out" 2>&1 && fail "HQ_CUDA_ARCH=all without nvcc succeeded"
  grep -qF "HQ_CUDA_ARCH=all, but nvcc is not found (PATH, $cuda)" "$tmp/out" || fail "HQ_CUDA_ARCH=all without nvcc: the message"; ok
fi
echo "test_install.sh: $n checks passed"
