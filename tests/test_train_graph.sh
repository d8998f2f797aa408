#!/bin/sh
# test_train_graph.sh -- `hq train --cuda-graph on|off` on the CPU: the host captures nothing but
# takes the graph mode's kept qtensors (the step's input and output-gradient qtensors made once
# and refreshed in place, hq_qtensor_update), which must give the same losses and final state,
# bit for bit, as a fresh quantize every step (train_graph.sh); nothing is replayed and nothing
# noted; a bad value is refused, and so is --graph-dot without a graph to write (on the CPU,
# with --cuda-graph off or --profile) or with an empty FILE, each naming the option. Exit 0
# pass, 1 fail, 77 skip (automake's protocol).
set -u
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_train_graph.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs python3 (json)"; exit 77; }
. "${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/train_corpus.sh"
. "$HQ_TEST_SRCDIR/train_graph.sh"
train_corpus "$tmp/words.txt" || { echo "SKIP: no corpus (no awk and no /usr/share/dict/words)"; exit 77; }

graph_runs cpu "$tmp"
python3 -c "
import json, sys
for r in json.load(open('$tmp/on.json'))['recipes']:
    if r['graph_replays'] != 0 or r['graph_note'] is not None or r['graph_kernels'] != 0:
        sys.exit('FAIL: %s: the CPU replayed or noted something' % r['name'])
" || exit 1
[ -s "$tmp/on.err" ] && grep -q -- "--cuda-graph" "$tmp/on.err" && fail "a --cuda-graph note on the CPU"

$hq train --cuda-graph yes --steps 1 > /dev/null 2> "$tmp/bad"
[ $? -eq 2 ] || fail "--cuda-graph yes: expected exit status 2"
grep -q "cuda-graph 'yes' is not on or off" "$tmp/bad" || { cat "$tmp/bad"; fail "--cuda-graph yes: message"; }

# --graph-dot needs a captured graph: refused before anything runs, naming the option
for args in "--device cpu" "--device cuda --cuda-graph off" "--device cuda --profile"; do
  # shellcheck disable=SC2086
  $hq train $args --graph-dot "$tmp/g.dot" --steps 1 > /dev/null 2> "$tmp/bad"
  [ $? -eq 2 ] || { cat "$tmp/bad"; fail "--graph-dot with $args: expected exit status 2"; }
  grep -q -- "--graph-dot .*needs --device cuda and --cuda-graph on" "$tmp/bad" \
    || { cat "$tmp/bad"; fail "--graph-dot with $args: message"; }
  [ ! -e "$tmp/g.dot" ] || fail "--graph-dot with $args wrote a file"
done
$hq train --graph-dot "" --steps 1 > /dev/null 2> "$tmp/bad"
[ $? -eq 2 ] || fail "--graph-dot '': expected exit status 2"
grep -q -- "--graph-dot '' is empty" "$tmp/bad" \
  || { cat "$tmp/bad"; fail "--graph-dot '': message"; }
exit 0
