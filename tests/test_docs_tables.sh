#!/bin/sh
# test_docs_tables.sh -- the documented `hq train` losses still come out of this build: runs
# `scripts/docs-tables.py --check`, which trains the small configuration of docs/training.md
# section 5 (every shipped recipe, 200 steps of a narrow model, about 5 s of CPU) and fails,
# printing both tables, when a loss or gap differs from the documented one by more than 0.0002.
# Needs python3 and the system word list (wamerican); skipped (77) without them.
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
python3 "$src/scripts/docs-tables.py" --check
