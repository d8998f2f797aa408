#!/bin/sh
# test_install.sh -- scripts/install.sh configures build/release again when the arguments it
# would pass differ from the existing configuration's (a second run with another PREFIX), and
# reuses it when they are the same. The script runs for real on a copy of itself in a scratch
# tree, without root, packages or network: the tree's configure is a fake that records its
# arguments and writes a config.status answering --config as autoconf's does; make, dpkg, sudo
# and ldconfig on PATH are fakes, and `make install` puts an hq into the prefix that says which
# prefix it is in. Exit 0 pass, 1 fail, 77 skip (automake's protocol).
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
cp "$src/scripts/install.sh" "$tree/scripts/install.sh"
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
  { echo '#!/bin/sh'; echo "echo \"hq \$* from \$(dirname \"\$(dirname \"\$0\")\")\""; } > "$prefix/bin/hq"
  chmod +x "$prefix/bin/hq" ;;
esac
EOF
printf '#!/bin/sh\nexit 0\n' > "$tmp/bin/dpkg"              # every package is installed
printf '#!/bin/sh\necho "apt-get $*" >> "$HQ_FAKE_LOG"\nexit 1\n' > "$tmp/bin/apt-get"
printf '#!/bin/sh\nexec "$@"\n' > "$tmp/bin/sudo"
printf '#!/bin/sh\nexit 0\n' > "$tmp/bin/ldconfig"
chmod +x "$tmp/bin/make" "$tmp/bin/dpkg" "$tmp/bin/apt-get" "$tmp/bin/sudo" "$tmp/bin/ldconfig"

# run_install PREFIX: run the script with that prefix; the output is in $tmp/out
run_install() {
  PATH="$tmp/bin:$PATH" PREFIX=$1 bash "$tree/scripts/install.sh" > "$tmp/out" 2>&1 ||
    fail "install.sh with PREFIX=$1 exited with status $?"
}
configures() { grep -c '^configure' "$log"; }

a=$tmp/a b="$tmp/it's b"
run_install "$a"
[ "$(configures)" -eq 1 ] || fail "first run: $(configures) configure calls"; ok
grep -qxF "configure [-q] [--prefix=$a]" "$log" || fail "first run: configure's arguments"; ok
grep -qxF "hq train from $a" "$tmp/out" || fail "first run: hq train from $a"; ok

run_install "$a"
[ "$(configures)" -eq 1 ] || fail "the same PREFIX again reconfigured"; ok
grep -qxF "hq train from $a" "$tmp/out" || fail "the same PREFIX again: hq train from $a"; ok

# another PREFIX (with a space and a quote): configured again, installed and run there
run_install "$b"
[ "$(configures)" -eq 2 ] || fail "another PREFIX did not reconfigure"; ok
[ "$(tail -1 "$log")" = "make -s install" ] || fail "another PREFIX: last call $(tail -1 "$log")"; ok
grep -qxF "configure [-q] [--prefix=$b]" "$log" || fail "another PREFIX: configure's arguments"; ok
grep -qxF "hq train from $b" "$tmp/out" || fail "another PREFIX: hq train from $b"; ok
run_install "$b"
[ "$(configures)" -eq 2 ] || fail "a quoted PREFIX is not recognised again"; ok

# autoconf 2.71 leaves safe arguments unquoted; a configuration with one more argument (made
# by hand, say) is not the script's
printf '#!/bin/sh\necho "--prefix=%s"\n' "$a" > "$tree/build/release/config.status"
run_install "$a"
[ "$(configures)" -eq 2 ] || fail "an unquoted --config answer was not recognised"; ok
printf '#!/bin/sh\necho "--prefix=%s --without-cuda"\n' "$a" > "$tree/build/release/config.status"
run_install "$a"
[ "$(configures)" -eq 3 ] || fail "a configuration with another argument was reused"; ok
# a Makefile without a config.status that answers: configure
rm -f "$tree/build/release/config.status"
run_install "$a"
[ "$(configures)" -eq 4 ] || fail "a build directory without config.status was reused"; ok
grep -q '^apt-get' "$log" && fail "apt-get ran although dpkg reports every package"; ok
echo "test_install.sh: $n checks passed"
