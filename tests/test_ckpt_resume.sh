#!/bin/sh
# test_ckpt_resume.sh -- the checkpoints' checksums through `hq train --resume` (issue 46, 1):
# one bit flipped in every entry of a real checkpoint in turn (every tensor the trainer saves:
# embedding, quantized weights' buffers, masters, moments, biases, the delayed-scaling state,
# the loss curve), then in the header: each resume is refused (exit 1) naming the entry, or the
# header. A file without checksums (another tool's) is refused saying to give --no-verify, and
# resumes with it. Needs python3 to edit the file (exit 77 without). Exit 0 pass, 1 fail.
set -u
LC_ALL=C; export LC_ALL
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3 to edit checkpoints"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_ckres.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/train_corpus.sh"
train_corpus "$tmp/words.txt" || { echo "SKIP: no corpus (no awk and no /usr/share/dict/words)"; exit 77; }
run="train --data $tmp/words.txt --batch 32 --hidden 64 --layers 1 --eval-every 0 --recipe $conf/examples/fp8_delayed.ini"
$hq $run --steps 2 --checkpoint "$tmp/c-{step}.safetensors" > /dev/null 2> "$tmp/e" || { cat "$tmp/e"; fail "the first run"; }
ck=$(ls "$tmp"/c-2-*.safetensors | grep -v fp32)
[ -s "$ck" ] || { ls "$tmp"; fail "no checkpoint"; }
$hq $run --steps 3 --resume "$ck" > /dev/null 2> "$tmp/e" || { cat "$tmp/e"; fail "an intact resume"; }

# flip.py FILE OUT WHAT: WHAT = an entry name (a bit in the middle of its bytes), "header" (a bit
# of the "step" value inside the header: still valid JSON), "strip" (every checksum removed, as
# another tool writes it), "list" (print the entries)
cat > "$tmp/flip.py" <<'PY'
import json, struct, sys
src, out, what = sys.argv[1:4]
b = bytearray(open(src, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
if what == "list":
    print("\n".join(k for k in h if k != "__metadata__")); sys.exit(0)
if what == "header":
    at = b.index(b'"step":"', 8) + 8
    b[at] ^= 1
elif what == "strip":
    m = h["__metadata__"]
    for k in [k for k in m if k == "hq_header_xxh3_64" or k.endswith("/xxh3_64")]: del m[k]
    t = json.dumps(h, separators=(",", ":")).encode()
    t += b" " * (-len(t) % 8)
    b = struct.pack("<Q", len(t)) + t + b[8 + n:]
else:
    lo, hi = h[what]["data_offsets"]
    b[8 + n + (lo + hi) // 2] ^= 0x10
open(out, "wb").write(b)
PY
python3 "$tmp/flip.py" "$ck" - list > "$tmp/entries" || fail "listing the entries"
count=0
while read -r e; do
  python3 "$tmp/flip.py" "$ck" "$tmp/bad.safetensors" "$e" || fail "flipping $e"
  $hq $run --steps 3 --resume "$tmp/bad.safetensors" > /dev/null 2> "$tmp/e"; rc=$?
  [ $rc -eq 1 ] || { cat "$tmp/e"; fail "a flip in '$e': exit status $rc, expected 1"; }
  grep -q "entry '$e' is corrupt" "$tmp/e" || { cat "$tmp/e"; fail "a flip in '$e': message"; }
  count=$((count + 1))
done < "$tmp/entries"
# embedding (+ adam_m, adam_v); fc1.weight's 4 buffers (fp8_tensor, both directions), its master
# and moments, fc1.bias and moments; lm_head.weight (identity: data), master, moments, bias and
# moments; scaling_state; loss_curve
[ $count -eq 22 ] || fail "$count entries, expected 22"
python3 "$tmp/flip.py" "$ck" "$tmp/bad.safetensors" header || fail "flipping the header"
$hq $run --steps 3 --resume "$tmp/bad.safetensors" > /dev/null 2> "$tmp/e"; rc=$?
[ $rc -eq 1 ] && grep -q "the header is corrupt" "$tmp/e" || { cat "$tmp/e"; fail "a flip in the header"; }
# a file without checksums: refused, then resumed with --no-verify
python3 "$tmp/flip.py" "$ck" "$tmp/bare.safetensors" strip || fail "stripping"
$hq $run --steps 3 --resume "$tmp/bare.safetensors" > /dev/null 2> "$tmp/e"; rc=$?
[ $rc -eq 1 ] && grep -q "has no checksums.*--no-verify" "$tmp/e" || { cat "$tmp/e"; fail "a file without checksums"; }
$hq $run --steps 3 --resume "$tmp/bare.safetensors" --no-verify > "$tmp/e" 2>&1 || { cat "$tmp/e"; fail "--no-verify"; }
grep -q "resumed at step 2" "$tmp/e" || { cat "$tmp/e"; fail "--no-verify: no resumed line"; }
$hq $run --steps 3 --no-verify > /dev/null 2> "$tmp/e"; rc=$?
[ $rc -eq 2 ] && grep -q "no-verify needs --resume" "$tmp/e" || { cat "$tmp/e"; fail "--no-verify alone"; }
echo "ok: $count entries and the header flipped, each refused through hq train --resume"
exit 0
