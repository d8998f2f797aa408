#!/bin/sh
# test_docs_tables.sh -- the documented `hq train` losses still come out of this build: runs
# `scripts/docs-tables.py --check`, which trains the small configuration of docs/training.md
# section 5 (every shipped recipe, 200 steps of a narrow model, about 5 s of CPU) and fails,
# printing both tables, when a loss or gap differs from the documented one by more than 0.0002.
# Also the GPU table's lead (block gpu, from two tiny CPU runs' --json) with and without the
# machine the documents name. Needs python3 and the system word list (wamerican); skipped (77)
# without them.
set -u
LC_ALL=C; export LC_ALL
: "${HQ_BIN:?HQ_BIN is set by make check}"
src=${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/..
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 77; }
[ -r /usr/share/dict/words ] || { echo "SKIP: no /usr/share/dict/words (Debian package wamerican)"; exit 77; }
[ -r "$src/docs/training.md" ] || { echo "SKIP: no docs/training.md"; exit 77; }
# an unknown argument (--help was one) is refused at once instead of regenerating every block
out=$(python3 "$src/scripts/docs-tables.py" --bogus 2>&1) && { echo "FAIL: --bogus accepted"; exit 1; }
case $out in *"unknown argument '--bogus'"*) ;; *) echo "FAIL: --bogus: $out"; exit 1 ;; esac
python3 "$src/scripts/docs-tables.py" --help | grep -q "docs-tables.py --check" || { echo "FAIL: --help"; exit 1; }
# every block has figures the check compares (docs/distributed.md's 8-decimal losses were once
# none of them: its blocks "matched" with nothing compared)
python3 "$src/scripts/docs-tables.py" --figures || { echo "FAIL: a block with no figure to check"; exit 1; }
# the GPU table's lead names the machine where the documents do (hq train --json's machine),
# and reads as before where they do not: two tiny CPU runs stand in for the device's files
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_docs_tables.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for f in train train_wide; do
  "$HQ_BIN" train --steps 4 --batch 32 --hidden 32 --eval-every 0 \
    --recipe "$src/conf/examples/high_precision.ini" --json > "$tmp/$f.json" 2> "$tmp/err" ||
    { cat "$tmp/err"; echo "FAIL: hq train for the GPU table"; exit 1; }
done
DOCS_TABLES_GPU=$tmp python3 - "$src/scripts/docs-tables.py" "$tmp" <<'PY' || exit 1
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("docs_tables", sys.argv[1])
dt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dt)
plain = dt.block_gpu()
if not plain.startswith("`hq train --device cpu` (`scripts/gpu-check.sh"):
    sys.exit("FAIL: the GPU table's lead without a GPU: " + plain[:120])
p = os.path.join(sys.argv[2], "train.json")
d = json.load(open(p))
d["machine"] = {"gpu": "NVIDIA H100 80GB HBM3", "sm": 90, "host_cpu": "Some CPU", "host_cpus": 16}
json.dump(d, open(p, "w"))
lead = dt.block_gpu()
cmd = "`hq train --device cpu`"
if lead != plain.replace(cmd, cmd + " on an NVIDIA H100 80GB HBM3 (host Some CPU, 16 CPUs)", 1):
    sys.exit("FAIL: the GPU table's lead with a machine: " + lead[:160])
PY
python3 "$src/scripts/docs-tables.py" --check
