#!/bin/sh
# test_train_ab.sh -- scripts/train_ab.py, which makes docs/performance.md's before/after
# throughput tables from `hq train --json` (scripts/gpu-check.sh --train-ab): two tiny CPU runs,
# the second without one recipe; the table has a row per recipe of the first file in its order,
# each cell the run's tokens/s and its ratio to its own file's baseline (the baseline 1.00x,
# one ratio recomputed here from the JSON), "--" where a file lacks the recipe; several files
# to a column (rounds) give each cell the smallest and largest tokens/s and ratio of its rounds,
# recomputed here, and "loss differs" only where the rounds' held-out losses do (another seed);
# --baseline NAME takes the named recipe's run as the baseline of files made without one; the
# machine the files name follows the table, once; bad arguments are refused by name.
# Exit 0 pass, 1 fail, 77 skip (automake's protocol).
set -u
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
src=${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/..
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_train_ab.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs python3"; exit 77; }
. "$HQ_TEST_SRCDIR/train_corpus.sh"
train_corpus "$tmp/words.txt" || { echo "SKIP: no corpus (no awk and no /usr/share/dict/words)"; exit 77; }

hp=$conf/examples/high_precision.ini fp8=$conf/examples/fp8_current.ini mx=$conf/examples/mxfp8.ini
run() { # OUT RECIPE...
  o=$1; shift
  r=""; for f in "$@"; do r="$r --recipe $f"; done
  # shellcheck disable=SC2086
  $hq train --data "$tmp/words.txt" --steps 6 --batch 32 --hidden 32 --eval-every 0 $r \
    --baseline bf16-baseline --json ${SEED:+--seed $SEED} > "$o" 2> "$o.err" ||
    { cat "$o.err"; fail "hq train $*"; }
}
run "$tmp/a.json" "$hp" "$fp8" "$mx"
run "$tmp/b.json" "$hp" "$mx"
ab=$src/scripts/train_ab.py
python3 "$ab" "x, before=$tmp/a.json" "x, after=$tmp/b.json" > "$tmp/t.md" || fail "train_ab.py"
python3 - "$tmp/t.md" "$tmp/a.json" <<'PY' || exit 1
import json, sys
rows = [l.rstrip("\n") for l in open(sys.argv[1])]
trows = [r for r in rows[2:] if r.startswith("|")]  # the table's rows (a machine line follows)
runs = json.load(open(sys.argv[2]))["recipes"]
def fail(m):
    sys.exit("FAIL: %s\n%s" % (m, "\n".join(rows)))
if rows[0] != "| recipe | x, before | x, after |" or rows[1] != "|---|---|---|":
    fail("the header")
if [r.split(" | ")[0][2:] for r in trows] != [r["name"] for r in runs]:
    fail("the rows are not the first file's recipes in its order")
cells = {r.split(" | ")[0][2:]: r.strip("| ").split(" | ")[1:] for r in trows}
if not all(c.endswith("(1.00x)") for c in cells["bf16-baseline"]):
    fail("the baseline is not 1.00x in every column")
if cells["fp8-current-e4m3"][1] != "--":
    fail("a recipe the second file lacks is not '--'")
t = {r["name"]: r["tokens_per_second"] for r in runs}
want = "(%.2fx)" % (t["mxfp8"] / t["bf16-baseline"])
if not cells["mxfp8"][0].endswith(want):
    fail("mxfp8's ratio: expected %s" % want)
PY
# rounds: a.json and a2.json (the same runs again) in one column, c.json (another seed) with them
# in a second
run "$tmp/a2.json" "$hp" "$fp8" "$mx"
SEED=2 run "$tmp/c.json" "$hp" "$fp8" "$mx"
python3 "$ab" "r=$tmp/a.json,$tmp/a2.json" "s=$tmp/a.json,$tmp/c.json" > "$tmp/r.md" ||
  fail "train_ab.py with rounds"
python3 - "$tmp/r.md" "$tmp/a.json" "$tmp/a2.json" <<'PY' || exit 1
import json, sys
rows = [l.rstrip("\n") for l in open(sys.argv[1])]
trows = [r for r in rows[2:] if r.startswith("|")]  # the table's rows (a machine line follows)
def fail(m):
    sys.exit("FAIL: %s\n%s" % (m, "\n".join(rows)))
cells = {r.split(" | ")[0][2:]: r.strip("| ").split(" | ")[1:] for r in trows}
docs = [{r["name"]: r["tokens_per_second"] for r in json.load(open(p))["recipes"]} for p in sys.argv[2:]]
x = sorted(d["mxfp8"] / d["bf16-baseline"] for d in docs)
f = ["%.2f" % v for v in x]
want = "(%sx)" % (f[0] if f[0] == f[1] else "%s-%s" % (f[0], f[1]))
if not cells["mxfp8"][0].endswith(want):
    fail("mxfp8's ratio over two rounds: expected %s" % want)
if any("loss differs" in c for c in cells["mxfp8"][:1]):
    fail("the same seed's rounds marked as differing")
if not cells["fp8-current-e4m3"][1].endswith(", loss differs"):
    fail("two seeds' rounds not marked")
PY
# --baseline NAME: a run made with `hq train --baseline none` takes the named recipe as its
# baseline (that recipe 1.00x, mxfp8's ratio to it recomputed); a name no run has is refused
$hq train --data "$tmp/words.txt" --steps 6 --batch 32 --hidden 32 --eval-every 0 --recipe "$hp" \
  --recipe "$mx" --baseline none --json > "$tmp/n.json" 2> "$tmp/n.err" ||
  { cat "$tmp/n.err"; fail "hq train --baseline none"; }
python3 "$ab" "n=$tmp/n.json" > "$tmp/o" 2>&1 && fail "a file without a baseline run accepted"
python3 "$ab" --baseline bf16-baseline "n=$tmp/n.json" > "$tmp/n.md" ||
  fail "train_ab.py --baseline bf16-baseline"
python3 - "$tmp/n.md" "$tmp/n.json" <<'PY' || exit 1
import json, sys
rows = [l.rstrip("\n") for l in open(sys.argv[1])]
trows = [r for r in rows[2:] if r.startswith("|")]  # the table's rows (a machine line follows)
def fail(m):
    sys.exit("FAIL: %s\n%s" % (m, "\n".join(rows)))
cells = {r.split(" | ")[0][2:]: r.strip("| ").split(" | ")[1:] for r in trows}
t = {r["name"]: r["tokens_per_second"] for r in json.load(open(sys.argv[2]))["recipes"]}
if not cells["bf16-baseline"][0].endswith("(1.00x)"):
    fail("the named baseline is not 1.00x")
if not cells["mxfp8"][0].endswith("(%.2fx)" % (t["mxfp8"] / t["bf16-baseline"])):
    fail("mxfp8's ratio to the named baseline")
m = json.load(open(sys.argv[2]))["machine"]
want = "Measured on: no GPU, host %s (%d CPUs)." % (m["host_cpu"] or "unnamed", m["host_cpus"])
if rows[-1] != want or rows[-2] != "" or sum(r.startswith("Measured on") for r in rows) != 1:
    fail("the machine line: expected %r" % want)
PY
python3 "$ab" --baseline nosuch "n=$tmp/n.json" > "$tmp/o" 2>&1 &&
  fail "an unknown baseline accepted"
grep -q "recipe 'nosuch'" "$tmp/o" || { cat "$tmp/o"; fail "the message for --baseline nosuch"; }
python3 "$ab" --baseline bf16-baseline > "$tmp/o" 2>&1 &&
  fail "--baseline without a column accepted"
grep -q "needs a recipe name and a column" "$tmp/o" ||
  { cat "$tmp/o"; fail "the message for a bare --baseline"; }
python3 "$ab" "x=$tmp/a.json," > "$tmp/o" 2>&1 && fail "an empty file name accepted"
python3 "$ab" nolabel > "$tmp/o" 2>&1 && fail "an argument without '=' accepted"
grep -q "'nolabel' is not LABEL=FILE" "$tmp/o" || { cat "$tmp/o"; fail "the message for 'nolabel'"; }
python3 "$ab" "x=$tmp/a.json.err" > "$tmp/o" 2>&1 && fail "a file that is not JSON accepted"
grep -q "a.json.err" "$tmp/o" || { cat "$tmp/o"; fail "the message does not name the file"; }
python3 "$ab" > /dev/null 2>&1; [ $? -eq 2 ] || fail "no arguments: expected exit status 2"
exit 0
