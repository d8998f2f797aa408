#!/bin/sh
# test_train_direct.sh -- `hq train --baseline bf16-direct` on the command line, no GPU needed:
# --help describes it; on the CPU it is refused with exit 2 and a message that names --device
# cuda, before any data is read or any run trains; with --checkpoint, --resume or
# --verify-resume it is refused (it keeps no quantized state to save); a misspelt baseline
# lists it among the choices. Exit 0 pass, 1 fail (automake's protocol).
set -u
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_train_direct.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
hp="$conf/examples/high_precision.ini"

# expect STATUS PATTERN ARGS...: hq train ARGS exits with STATUS, stderr matches PATTERN and
# nothing trained (no progress line, no table on stdout)
expect() {
  want=$1 pat=$2
  shift 2
  $hq train "$@" >"$tmp/out" 2>"$tmp/err"
  st=$?
  [ "$st" -eq "$want" ] || { cat "$tmp/err"; fail "hq train $*: exit $st, expected $want"; }
  grep -q -- "$pat" "$tmp/err" || { cat "$tmp/err"; fail "hq train $*: no '$pat' in the message"; }
  [ ! -s "$tmp/out" ] || { cat "$tmp/out"; fail "hq train $*: printed a result"; }
}

$hq train --help >"$tmp/help" 2>&1 || fail "--help"
grep -q "bf16-direct" "$tmp/help" || fail "--help does not describe --baseline bf16-direct"

# the CPU (the default device and given): refused, naming what it needs; the data file is never
# read (a missing one would be the message otherwise)
expect 2 "bf16-direct.*--device cuda" --baseline bf16-direct --recipe "$hp" --data "$tmp/none"
expect 2 "bf16-direct.*--device cuda" --device cpu --baseline bf16-direct --data "$tmp/none"
# no checkpoints (on any device: refused before a device is touched)
expect 2 "bf16-direct saves no checkpoint" --device cuda --baseline bf16-direct \
  --checkpoint "$tmp/c.safetensors" --data "$tmp/none"
expect 2 "bf16-direct saves no checkpoint" --device cuda --baseline bf16-direct \
  --resume "$tmp/c.safetensors" --recipe "$hp" --data "$tmp/none"
expect 2 "bf16-direct saves no checkpoint" --device cuda --baseline bf16-direct \
  --verify-resume --data "$tmp/none"
# a misspelt name: the choices, bf16-direct among them
expect 2 "not fp32, bf16-direct, none" --baseline bf16_direct --recipe "$hp" --data "$tmp/none"
echo "ok: --baseline bf16-direct parsed and refused where it cannot run"
