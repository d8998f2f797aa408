#!/bin/sh
# test_train.sh -- `hq train`, the main job, on a small generated corpus (so it always runs):
# exit status, the loss falls, the table (every recipe and the baseline, the gaps), the progress
# and GEMM lines, --json (the configuration, each run's curves and GEMMs), recipes from the same
# seed start from the same step-0 loss (same data, same weights) and a recipe given twice trains
# identically, --opt=value and a repeated option, errors (missing recipe, missing data, a shape a
# format rejects, bad options, --device cuda without a GPU) with their messages and exit status 1
# or 2, --plot never fails for want of gnuplot, the default recipe finishes, and checkpoints
# (--checkpoint, --resume, --verify-resume) continue a run bit-identically and refuse what does
# not fit; --baseline, --seeds (the statistics recomputed from --json), the memory estimate and
# its refusal, and the output paths checked before the first step (issue 46). Exit 0 pass, 1 fail
# (automake's protocol).
set -u
LC_ALL=C; export LC_ALL   # strerror's text in the messages compared below
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_train.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
n=0
fail() { echo "FAIL: $*"; exit 1; }
ok() { n=$((n + 1)); }
have_py=0
command -v python3 >/dev/null 2>&1 && python3 -c 'import json' 2>/dev/null && have_py=1
# jget FILE EXPR: a value of the JSON document (python3), e.g. jget f "d['recipes'][0]['eval_loss']"
jget() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
# usage_error MESSAGE ARGS...: hq ARGS exits with status 2, MESSAGE the one line on stderr
usage_error() {
  msg=$1; shift
  $hq "$@" > "$tmp/o" 2> "$tmp/e"; rc=$?
  [ $rc -eq 2 ] || { cat "$tmp/e"; fail "hq $*: exit status $rc, expected 2"; }
  printf '%s\n' "$msg" | cmp -s - "$tmp/e" || { cat "$tmp/e"; fail "hq $*: expected '$msg'"; }
  ok
}
# failure MESSAGE ARGS...: hq ARGS exits with status 1, MESSAGE the last line on stderr
failure() {
  msg=$1; shift
  $hq "$@" > "$tmp/o" 2> "$tmp/e"; rc=$?
  [ $rc -eq 1 ] || { cat "$tmp/e"; fail "hq $*: exit status $rc, expected 1"; }
  [ "$(tail -n 1 "$tmp/e")" = "$msg" ] || { cat "$tmp/e"; fail "hq $*: expected '$msg'"; }
  ok
}

# the generated corpus (tests/train_corpus.sh)
. "${HQ_TEST_SRCDIR:?HQ_TEST_SRCDIR is set by make check}/train_corpus.sh"
train_corpus "$tmp/words.txt" || { echo "SKIP: no corpus (no awk and no /usr/share/dict/words)"; exit 77; }

small="--data $tmp/words.txt --steps 40 --batch 128 --hidden 128 --layers 1 --eval-every 20 --log-every 10"

# help and usage errors (tests/test_cli.sh checks the option parsing every command shares)
$hq train --help > "$tmp/h" || fail "train --help exit status"
[ "$(head -n 1 "$tmp/h")" = "usage: hq train [--recipe FILE]... [--device cpu|cuda] [--steps N] [--batch B]" ] || fail "train --help"
$hq help train | cmp -s - "$tmp/h" || fail "hq help train"; ok
# (a parse error comes before anything is read: --data of a missing file makes a run that wrongly
# got past the parser fail at once instead of training the default recipe)
nd="--data $tmp/no-data.txt"
usage_error "hq train: unknown option '--bogus' (see \`hq train --help\`)" train $nd --bogus
usage_error "hq train: --steps '0' is not an integer in [1, 10000000]" train $nd --steps 0
usage_error "hq train: --steps '1e3' is not an integer in [1, 10000000]" train $nd --steps=1e3
usage_error "hq train: --layers '16' is not an integer in [1, 15]" train $nd --layers 16
usage_error "hq train: --eval-every '-1' is not an integer in [0, 9223372036854775807]" train $nd --eval-every -1
usage_error "hq train: --act 'relu' is not gelu or tanh" train $nd --act relu
usage_error "hq train: --lr '0' is not a number in (0, 1]" train $nd --lr 0
usage_error "hq train: --lr '1.5' is not a number in (0, 1]" train $nd --lr=1.5
usage_error "hq train: --verify-resume needs --steps 2 or more" train $nd --verify-resume --steps 1
# --device cuda where no GPU can run it: exit 1, the context's error (with a GPU it trains:
# tests/test_gpu_train.sh)
$hq train --device cuda $small --steps 2 >/dev/null 2>"$tmp/e"; rc=$?
if [ $rc -ne 0 ]; then
  [ $rc -eq 1 ] || fail "--device cuda exit status $rc"
  if $hq --version | grep -q ', CUDA)$'; then grep -q "CUDA" "$tmp/e" || fail "--device cuda message"
  else
    tail -n 1 "$tmp/e" | grep -q ", step 0: creating the context: hq_ctx_create: device 0 asked for, but this libhqcore was built without CUDA$" ||
      { cat "$tmp/e"; fail "--device cuda message"; }
  fi
fi
ok

# two recipes with the same forward formats (MXFP8 E4M3 for fc*, lm_head in high precision) and
# one of them twice, then the built-in FP32 baseline
$hq train $small --recipe "$conf/recipe.ini" --recipe "$conf/examples/mxfp8.ini" \
  --recipe "$conf/examples/mxfp8.ini" > "$tmp/out.txt" 2>"$tmp/err.txt" || { cat "$tmp/err.txt"; fail "train exit status"; }
ok
# the table: a row per run, in order, the recipe given twice as NAME#2, the built-in baseline
# last; every gap is the run's eval loss minus the baseline's (each rounded to 4 places)
sed -n '/^recipe  *train loss  *eval loss  *gap vs base  *time  *tokens\/s$/,/^$/p' "$tmp/out.txt" | sed '1d; $d' > "$tmp/table"
[ "$(awk '{ print $1 }' "$tmp/table" | tr '\n' ' ')" = "mxfp8-forward-nvfp4-backward mxfp8 mxfp8#2 fp32 " ] ||
  { cat "$tmp/out.txt"; fail "the table's runs"; }; ok
awk 'NR == 4 { base = $3; if ($4 != "(baseline)") exit 1 } { ev[NR] = $3; gap[NR] = $4 }
     END { for (i = 1; i < 4; i++) { d = ev[i] - base - gap[i]; if (d > 0.00011 || d < -0.00011) exit 1 } }' "$tmp/table" ||
  { cat "$tmp/table"; fail "the table's gaps"; }; ok
# progress: every --log-every 10 steps of each run, the held-out loss on the line of step 20 (every
# --eval-every 20 steps; the final one, on the whole set, is the table's)
sed -n 's/^\[\([1-4]\)\/4\] \([^ ]*\) *step *\([0-9]*\)\/40  *loss [0-9.]*\(  eval\)\{0,1\}.* tok\/s  ETA [0-9:]*$/\1 \2 \3\4/p' "$tmp/out.txt" > "$tmp/progress"
for r in "1 mxfp8-forward-nvfp4-backward" "2 mxfp8" "3 mxfp8#2" "4 fp32"; do
  printf '%s\n' "$r 10" "$r 20  eval" "$r 30" "$r 40"
done | diff - "$tmp/progress" || { cat "$tmp/out.txt"; fail "progress lines"; }; ok
# the GEMMs that ran: MXFP8 forward in fc1, NVFP4 backward in the hybrid, lm_head in identity
sed -n '/^GEMMs of each layer (operand formats A x B, path):$/,$p' "$tmp/out.txt" | tr -s ' ' > "$tmp/gemms"
{ echo "GEMMs of each layer (operand formats A x B, path):"
  for r in "mxfp8-forward-nvfp4-backward mxfp8 nvfp4" "mxfp8 mxfp8 mxfp8" "mxfp8#2 mxfp8 mxfp8" "fp32 identity identity"; do
    set -- $r
    echo " $1"
    echo " fc1 fprop $2 x $2 (cpu) dgrad $3 x $3 (cpu) wgrad $3 x $3 (cpu)"
    echo " lm_head fprop identity x identity (cpu) dgrad identity x identity (cpu) wgrad identity x identity (cpu)"
  done; } | diff - "$tmp/gemms" || fail "the GEMMs of each layer"; ok

# --json: one document, progress on stderr
$hq train $small --recipe "$conf/recipe.ini" --recipe "$conf/examples/mxfp8.ini" \
  --recipe "$conf/examples/mxfp8.ini" --json > "$tmp/out.json" 2>"$tmp/err.txt" || fail "--json exit status"
grep -q "step    40/40" "$tmp/err.txt" || fail "--json: progress on stderr"; ok
if [ $have_py -eq 1 ]; then
  python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/out.json" || fail "--json does not parse"; ok
  [ "$(jget "$tmp/out.json" "len(d['recipes'])")" = 4 ] || fail "--json: 4 runs"; ok
  [ "$(jget "$tmp/out.json" "d['baseline']")" = fp32 ] || fail "--json: the baseline"; ok
  # the loss falls: from about ln(27) to clearly below
  for i in 0 1 2 3; do
    jget "$tmp/out.json" "abs(d['recipes'][$i]['step0_loss'] - 3.2958) < 0.15" | grep -q True ||
      fail "run $i: step-0 loss is not about ln(27)"
    jget "$tmp/out.json" "d['recipes'][$i]['train_loss'] < d['recipes'][$i]['step0_loss'] - 0.5" | grep -q True ||
      fail "run $i: the train loss does not fall"
    jget "$tmp/out.json" "d['recipes'][$i]['eval_loss'] < d['recipes'][$i]['step0_loss'] - 0.5" | grep -q True ||
      fail "run $i: the held-out loss does not fall"
    ok
  done
  # same seed: same first batch and same initial weights, so recipes with the same forward
  # formats start from bit-identical losses; the FP32 baseline's forward differs
  jget "$tmp/out.json" "d['recipes'][0]['step0_loss'] == d['recipes'][1]['step0_loss']" | grep -q True ||
    fail "hybrid and mxfp8: step-0 losses differ"; ok
  jget "$tmp/out.json" "d['recipes'][0]['step0_loss'] != d['recipes'][3]['step0_loss']" | grep -q True ||
    fail "mxfp8 and fp32 step-0 losses are equal: the forward pass is not quantized"; ok
  # the same recipe twice: identical runs (data order, stochastic rounding, everything)
  jget "$tmp/out.json" "d['recipes'][1]['eval_curve'] == d['recipes'][2]['eval_curve'] and d['recipes'][1]['train_curve'] == d['recipes'][2]['train_curve']" |
    grep -q True || fail "a recipe given twice trains differently"; ok
  jget "$tmp/out.json" "d['recipes'][0]['train_curve'] != d['recipes'][1]['train_curve']" | grep -q True ||
    fail "hybrid and mxfp8 train identically: the backward pass is not quantized"; ok
  jget "$tmp/out.json" "abs(d['recipes'][0]['gap'] - (d['recipes'][0]['eval_loss'] - d['recipes'][3]['eval_loss'])) < 1e-6" |
    grep -q True || fail "gap"; ok
  # tokens/s counts the steps after the warm-up: a tenth of 40 steps of 128 examples
  jget "$tmp/out.json" "d['recipes'][0]['tokens'] == (40 - 4) * 128" | grep -q True || fail "--json tokens"; ok
  # what the options and recipes determine, exactly: the configuration, each run's identity, the
  # steps of its curves (step 0, then every --log-every 10; held-out at 0 and every --eval-every
  # 20) and its GEMMs (every product [128, 128]: batch 128, C*E = 8*16, hidden 128, vocab
  # padded to 128)
  python3 - "$tmp/out.json" "$tmp/words.txt" "$conf" <<'PY' || fail "--json: the configuration and the runs"
import json, struct, sys
d = json.load(open(sys.argv[1]))
f32 = lambda x: struct.unpack('f', struct.pack('f', x))[0]  # min_lr is lr/10 in float, %.9g
cfg = dict(d['config'])
del cfg['parameters']
assert cfg == {'device': 'cpu', 'cuda_graph': 'on', 'preset': 'default', 'steps': 40, 'batch': 128, 'seed': 1, 'seeds': 1, 'context': 8, 'embed': 16,
               'hidden': 128, 'layers': 1, 'vocab': 27, 'vocab_padded': 128, 'activation': 'gelu',
               'lr': 0.006, 'min_lr': float('%.9g' % f32(f32(0.006) / 10)), 'warmup': 2,
               'eval_every': 20}, cfg
assert d['data']['path'] == sys.argv[2], d['data']
conf = sys.argv[3]
want = [('mxfp8-forward-nvfp4-backward', conf + '/recipe.ini', 'mxfp8', 'nvfp4'),
        ('mxfp8', conf + '/examples/mxfp8.ini', 'mxfp8', 'mxfp8'),
        ('mxfp8#2', conf + '/examples/mxfp8.ini', 'mxfp8', 'mxfp8'),
        ('fp32', None, 'identity', 'identity')]
assert len(d['recipes']) == len(want)
for i, (r, (name, path, fwd, bwd)) in enumerate(zip(d['recipes'], want)):
    last = i == len(want) - 1
    assert (r['name'], r['path'], r['baseline'], r['high_precision']) == (name, path, last, last), r['name']
    assert (r['resumed_from'], r['resume_verified']) == (0, None), r['name']
    assert [p[0] for p in r['train_curve']] == [0, 10, 20, 30, 40], r['train_curve']
    assert [p[0] for p in r['eval_curve']] == [0, 20, 40], r['eval_curve']
    # each GEMM with the provider that ran it: on the CPU the core's own CPU path
    g = lambda a, p='cpu': {'a': a, 'b': a, 'path': p, 'provider': 'emulated', 'm': 128,
                            'n': 128, 'k': 128}
    assert r['gemms'] == [{'layer': 'fc1', 'fprop': g(fwd), 'dgrad': g(bwd), 'wgrad': g(bwd)},
                          {'layer': 'lm_head', 'fprop': g('identity'), 'dgrad': g('identity'),
                           'wgrad': g('identity')}], r['gemms']
PY
  ok
else
  grep -q '"recipes":\[{"name":"mxfp8-forward-nvfp4-backward"' "$tmp/out.json" || fail "--json recipes"; ok
  grep -q '"baseline":"fp32"' "$tmp/out.json" || fail "--json baseline"; ok
  s0=$(sed 's/.*"name":"mxfp8-forward-nvfp4-backward"[^}]*"step0_loss":\([0-9.]*\).*/\1/' "$tmp/out.json")
  s1=$(sed 's/.*"name":"mxfp8","path"[^}]*"step0_loss":\([0-9.]*\).*/\1/' "$tmp/out.json")
  [ -n "$s0" ] && [ "$s0" = "$s1" ] || fail "step-0 losses differ ($s0, $s1)"; ok
fi

# evaluating (a step-0 eval and every 10 steps, or only at the end) never changes the training:
# neither the random stream of stochastic rounding (the default recipe's gradients) nor the amax
# history of delayed scaling (fp8_delayed.ini) -- the same final held-out loss
for f in recipe.ini examples/fp8_delayed.ini; do
  [ -f "$conf/$f" ] || continue
  $hq train $small --recipe "$conf/$f" --eval-every 10 --json > "$tmp/e10.json" 2>"$tmp/e" || { cat "$tmp/e"; fail "$f --eval-every 10"; }
  $hq train $small --recipe "$conf/$f" --eval-every 0 --json > "$tmp/e0.json" 2>"$tmp/e" || { cat "$tmp/e"; fail "$f --eval-every 0"; }
  l10=$(sed 's/.*"recipes":\[{"name":"[^"]*"[^}]*"eval_loss":\([0-9.]*\).*/\1/' "$tmp/e10.json")
  l0=$(sed 's/.*"recipes":\[{"name":"[^"]*"[^}]*"eval_loss":\([0-9.]*\).*/\1/' "$tmp/e0.json")
  [ -n "$l0" ] && [ "$l0" = "$l10" ] || fail "$f: evaluation changes the training ($l0, $l10)"; ok
done

# issue 46 item 12: FP32 stays the baseline when a high-precision recipe (BF16) is given: BF16 is
# one more row; --baseline NAME (or its file) picks a recipe, --baseline none compares nothing
table() { sed -n '/^recipe  *train loss/,/^$/p' "$1" | sed '1d; $d' | awk '{ print $1, $4 }' | tr '\n' ' '; }
$hq train $small --recipe "$conf/examples/high_precision.ini" > "$tmp/hp.txt" || fail "high_precision.ini"
[ "$(table "$tmp/hp.txt" | sed 's/bf16-baseline [-+]0\.[0-9]\{4\} /bf16-baseline G /')" = "bf16-baseline G fp32 (baseline) " ] ||
  { cat "$tmp/hp.txt"; fail "high_precision.ini: a row, the FP32 baseline after it"; }; ok
for b in bf16-baseline "$conf/examples/high_precision.ini"; do
  $hq train $small --recipe "$conf/examples/mxfp8.ini" --recipe "$conf/examples/high_precision.ini" \
    --baseline "$b" > "$tmp/hp.txt" || fail "--baseline $b"
  [ "$(table "$tmp/hp.txt" | sed 's/mxfp8 [-+]0\.[0-9]\{4\} /mxfp8 G /')" = "mxfp8 G bf16-baseline (baseline) " ] ||
    { cat "$tmp/hp.txt"; fail "--baseline $b: no fp32 run, bf16-baseline the baseline"; }; ok
done
grep -q "gap: eval loss minus the baseline's (bf16-baseline)" "$tmp/hp.txt" || fail "--baseline: the note"; ok
$hq train $small --recipe "$conf/examples/mxfp8.ini" --baseline none > "$tmp/hp.txt" || fail "--baseline none"
[ "$(table "$tmp/hp.txt")" = "mxfp8 - " ] || { cat "$tmp/hp.txt"; fail "--baseline none: one run, no gap"; }
grep -q "no baseline (--baseline none)" "$tmp/hp.txt" || fail "--baseline none: the note"; ok
usage_error "hq train: --baseline 'bf16' is not fp32, bf16-direct, none, nor a recipe given ('mxfp8', 'bf16-baseline')" \
  train $small --recipe "$conf/examples/mxfp8.ini" --recipe "$conf/examples/high_precision.ini" --baseline bf16

# review bug 8: a role the recipe leaves unmatched is named on stderr (every layer's grad_output
# here), unless the recipe says `unmatched = identity`; the shipped recipes leave none
printf '[format f]\nplugin = fp8_tensor\n[role linear:input:*]\nrowwise = f\n[role linear:weight:*]\nrowwise = f\n' > "$tmp/um.ini"
$hq train $small --steps 1 --eval-every 0 --recipe "$tmp/um.ini" > /dev/null 2> "$tmp/e" || { cat "$tmp/e"; fail "unmatched recipe"; }
nl=$(grep -c "^hq train: warning: recipe $tmp/um.ini: role linear:grad_output:[a-z_0-9]* matches no \[role\] section" "$tmp/e")
nall=$(grep -c "warning" "$tmp/e")
[ "$nl" -ge 1 ] && [ "$nl" = "$nall" ] || { cat "$tmp/e"; fail "hq train: the unmatched grad_output roles, and nothing else"; }
printf '[recipe]\nunmatched = identity\n' | cat - "$tmp/um.ini" > "$tmp/um2.ini"
$hq train $small --steps 1 --eval-every 0 --recipe "$tmp/um2.ini" > /dev/null 2> "$tmp/e" || fail "unmatched = identity"
grep -q warning "$tmp/e" && { cat "$tmp/e"; fail "hq train warned under unmatched = identity"; }
for f in "$conf"/recipe.ini "$conf"/examples/*.ini; do
  $hq recipe check "$f" > /dev/null 2> "$tmp/e" || fail "recipe check $f"
  grep -q "matches no" "$tmp/e" && { cat "$tmp/e"; fail "$f leaves a linear role unmatched"; }
done; ok

# the options' two forms (--opt=value, --opt value) train the same; a repeated option: the later
# value wins (scripts such as tests/test_gpu_train.sh append overrides to a list of defaults)
tiny="--steps 2 --eval-every 0 --recipe $conf/examples/fp8_current.ini --json"
untimed() { sed -E 's/"(train_seconds|total_seconds|tokens_per_second|speed_vs_baseline)":[^,]*/"\1":T/g' "$1"; }
$hq train $small $tiny > "$tmp/a.json" 2>/dev/null || fail "train $tiny"
$hq train --data="$tmp/words.txt" --steps=2 --batch=128 --hidden=128 --layers=1 --eval-every=0 \
  --log-every=10 --recipe="$conf/examples/fp8_current.ini" --json > "$tmp/b.json" 2>/dev/null || fail "train --opt=value"
untimed "$tmp/a.json" > "$tmp/a"; untimed "$tmp/b.json" > "$tmp/b"
cmp -s "$tmp/a" "$tmp/b" || { diff "$tmp/a" "$tmp/b"; fail "train: --opt=value and --opt value differ"; }
grep -q '"config":{"device":"cpu","steps":2,"batch":128,' "$tmp/a" || fail "train: the later --steps does not win"; ok

# every shipped recipe trains (the nvfp4 one: RHT x RHT in wgrad, 2-D weights, SR gradients)
for f in "$conf"/examples/*.ini; do
  $hq train $small --steps 10 --recipe "$f" > "$tmp/r.txt" 2>&1 || { cat "$tmp/r.txt"; fail "train with $f"; }; ok
done

# errors: clear, exit 1, naming what
failure "hq train: recipe $tmp/nope.ini: No such file or directory" train $small --recipe "$tmp/nope.ini"
printf '[format x]\nplugin = nosuch\n' > "$tmp/bad.ini"
$hq train $small --recipe "$tmp/bad.ini" 2>"$tmp/e"; [ $? -eq 1 ] || fail "bad recipe exit status"
grep -q "^hq train: $tmp/bad.ini:2: plugin 'nosuch' was not found on the plugin search path" "$tmp/e" || { cat "$tmp/e"; fail "bad recipe: file:line"; }; ok
failure "hq train: $tmp/nowords.txt: No such file or directory" train $small --data "$tmp/nowords.txt"
printf 'Only Capitals\n' > "$tmp/few.txt"
failure "hq train: $tmp/few.txt: 0 word(s) of 1 to 1000 letters a-z (whitespace-separated, lowercase); at least 2 are needed (one to train on, one held out)" \
  train $small --data "$tmp/few.txt"
# 80 columns: not a multiple of MXFP8's 32-element blocks -- refused before training, naming the
# recipe and the layer
$hq train $small --hidden 80 --recipe "$conf/examples/mxfp8.ini" >/dev/null 2>"$tmp/e"
[ $? -eq 1 ] || fail "rejected shape exit status"
grep "recipe 'mxfp8'" "$tmp/e" | grep "before the first step" | grep -q "layer fc1" || { cat "$tmp/e"; fail "rejected shape message"; }; ok

# checkpoints (docs/training.md, 8). --verify-resume: every shipped recipe (stochastic rounding in
# recipe.ini and nvfp4.ini, delayed scaling in fp8_delayed.ini) saved mid-run, reloaded into a
# fresh context and model: the same losses and the same final state, bit for bit
for f in "$conf"/recipe.ini "$conf"/examples/*.ini; do
  $hq train $small --steps 20 --recipe "$f" --verify-resume > "$tmp/v.txt" 2>&1 || { cat "$tmp/v.txt"; fail "--verify-resume with $f"; }
  grep -q "resume verified: the checkpoint of step 10 .* bit-identical losses for steps 11..20 and a bit-identical final state" "$tmp/v.txt" ||
    { cat "$tmp/v.txt"; fail "--verify-resume with $f: no verified line"; }; ok
done
# --checkpoint-every with {step}, then --resume from the middle: the same curves, the same losses
# and the same final checkpoint (every byte) as the uninterrupted run
ck=$tmp/ck
for f in nvfp4 fp8_delayed; do
  $hq train $small --recipe "$conf/examples/$f.ini" --checkpoint "$ck-a-{step}.safetensors" --checkpoint-every 20 --json \
    > "$tmp/a.json" 2>"$tmp/e" || { cat "$tmp/e"; fail "$f: --checkpoint"; }
  name=$(sed 's/.*"recipes":\[{"name":"\([^"]*\)".*/\1/' "$tmp/a.json")
  [ -s "$ck-a-20-$name.safetensors" ] && [ -s "$ck-a-40-$name.safetensors" ] && [ -s "$ck-a-40-fp32.safetensors" ] ||
    { ls "$tmp"; fail "$f: --checkpoint-every 20 files"; }; ok
  $hq train $small --recipe "$conf/examples/$f.ini" --resume "$ck-a-20-$name.safetensors" --checkpoint "$ck-b-{step}.safetensors" \
    --json > "$tmp/b.json" 2>"$tmp/e" || { cat "$tmp/e"; fail "$f: --resume"; }
  grep -q "$name: resumed at step 20" "$tmp/e" || { cat "$tmp/e"; fail "$f: resumed line"; }; ok
  cmp -s "$ck-a-40-$name.safetensors" "$ck-b-40-$name.safetensors" || fail "$f: the resumed run ends in another state"; ok
  [ -e "$ck-b-20-$name.safetensors" ] && fail "$f: a resumed run saved a step it did not train"
  if [ $have_py -eq 1 ]; then
    python3 -c 'import json,sys
a, b = (json.load(open(p))["recipes"][0] for p in sys.argv[1:3])
for k in ("train_curve", "eval_curve", "step0_loss", "train_loss", "eval_loss"):
    assert a[k] == b[k], k
assert b["resumed_from"] == 20 and a["resumed_from"] == 0' "$tmp/a.json" "$tmp/b.json" || fail "$f: resumed curves differ"; ok
  fi
done
ckn=$ck-a-20-nvfp4.safetensors
# a resume that does not fit: refused with exit 1, naming what differs
$hq train $small --recipe "$conf/examples/mxfp8.ini" --resume "$ckn" >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] || fail "resume, other recipe: exit status"
grep -q "written with recipe 'nvfp4'.*this run's recipe is 'mxfp8'" "$tmp/e" || { cat "$tmp/e"; fail "resume, other recipe: message"; }; ok
sed 's/^\(stochastic_rounding *=\).*/\1 false/' "$conf/examples/nvfp4.ini" > "$tmp/nvfp4-nosr.ini"
$hq train $small --recipe "$tmp/nvfp4-nosr.ini" --resume "$ckn" >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] || fail "resume, changed recipe: exit status"
grep -q "differs from the one the checkpoint was written with.*stochastic_rounding=true.*stochastic_rounding=false" "$tmp/e" ||
  { cat "$tmp/e"; fail "resume, changed recipe: message"; }; ok
$hq train $small --hidden 256 --recipe "$conf/examples/nvfp4.ini" --resume "$ckn" >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] || fail "resume, other shape: exit status"
grep -q "model.hidden differs: the checkpoint has model.hidden = 128, this run 256 (--hidden)" "$tmp/e" || { cat "$tmp/e"; fail "resume, other shape: message"; }; ok
$hq train $small --batch 256 --recipe "$conf/examples/nvfp4.ini" --resume "$ckn" >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] || fail "resume, other batch: exit status"
grep -q "model.batch differs" "$tmp/e" || { cat "$tmp/e"; fail "resume, other batch: message"; }; ok
$hq train $small --seed 2 --recipe "$conf/examples/nvfp4.ini" --resume "$ckn" >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] || fail "resume, other seed: exit status"
grep -q "seed differs" "$tmp/e" || { cat "$tmp/e"; fail "resume, other seed: message"; }; ok
$hq train $small --steps 20 --recipe "$conf/examples/nvfp4.ini" --resume "$ckn" >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] || fail "resume at the end: exit status"
grep -q "at step 20: --steps 20 leaves nothing to train" "$tmp/e" || { cat "$tmp/e"; fail "resume at the end: message"; }; ok
# a truncated checkpoint, a file that is not one, a missing one: exit 1, a message, no crash
head -c 100000 "$ckn" > "$tmp/trunc.safetensors"
$hq train $small --recipe "$conf/examples/nvfp4.ini" --resume "$tmp/trunc.safetensors" >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] || fail "truncated checkpoint: exit status"
grep -q "checkpoint $tmp/trunc.safetensors: .*data section" "$tmp/e" || { cat "$tmp/e"; fail "truncated checkpoint: message"; }; ok
head -c 5 "$ckn" > "$tmp/tiny.safetensors"
$hq train $small --recipe "$conf/examples/nvfp4.ini" --resume "$tmp/tiny.safetensors" >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] || fail "5-byte checkpoint: exit status"
grep -q "checkpoint $tmp/tiny.safetensors" "$tmp/e" || { cat "$tmp/e"; fail "5-byte checkpoint: message"; }; ok
$hq train $small --recipe "$conf/examples/nvfp4.ini" --resume "$tmp/words.txt" >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] || fail "not a checkpoint: exit status"
grep -q "words.txt" "$tmp/e" || { cat "$tmp/e"; fail "not a checkpoint: message"; }; ok
$hq train $small --recipe "$conf/examples/nvfp4.ini" --resume "$tmp/none.safetensors" >/dev/null 2>"$tmp/e"; [ $? -eq 1 ] || fail "missing checkpoint: exit status"
grep -q "none.safetensors" "$tmp/e" || { cat "$tmp/e"; fail "missing checkpoint: message"; }; ok
# usage errors
usage_error "hq train: --checkpoint-every needs --checkpoint FILE (or --verify-resume)" train $small --checkpoint-every 5
usage_error "hq train: --resume continues one run: give at most one --recipe" \
  train $small --recipe "$conf/recipe.ini" --recipe "$conf/examples/nvfp4.ini" --resume "$ckn"
# Python's safetensors reads the file: the metadata, the entries, the F32 tensors
if [ $have_py -eq 1 ] && python3 -c 'import safetensors, numpy' 2>/dev/null; then
  python3 -c 'import json, sys
from safetensors import safe_open
with safe_open(sys.argv[1], framework="np") as f:
    m = f.metadata()
    assert m["hq_train"] == "1" and m["step"] == "20" and m["recipe"] == "nvfp4", m
    assert m["model.hidden"] == "128" and m["model.layers"] == "1" and m["seed"] == "1"
    int(m["rng_offset"]); int(m["data_rng"])
    assert json.loads(m["fc1.weight/hq"])["formats"]["rowwise"]["plugin"] == "nvfp4"
    keys = set(f.keys())
    for k in ("embedding", "fc1.weight/data", "fc1.weight/columnwise_data", "fc1.weight.master",
              "fc1.weight.adam_m", "fc1.weight.adam_v", "fc1.bias", "lm_head.weight/data", "loss_curve"):
        assert k in keys, k
    assert f.get_tensor("fc1.weight.master").shape == (128, 128)
    assert f.get_tensor("loss_curve").shape == (1, 20)
    assert f.get_slice("fc1.weight/data").get_dtype() == "U8"' "$ckn" || fail "Python safetensors cannot read the checkpoint"; ok
else
  echo "test_train: SKIP the Python safetensors check (python3 cannot import safetensors and numpy)"
fi

# --plot: a PNG with gnuplot, a message (and exit 0) without it
$hq train $small --recipe "$conf/examples/fp8_current.ini" --plot "$tmp/loss.png" >/dev/null 2>"$tmp/e" ||
  { cat "$tmp/e"; fail "--plot exit status"; }
if command -v gnuplot >/dev/null 2>&1; then
  [ -s "$tmp/loss.png" ] && head -c 4 "$tmp/loss.png" | grep -q PNG || fail "--plot: no PNG written"
else
  grep -q "gnuplot is not installed" "$tmp/e" || fail "--plot without gnuplot: no message"
fi
ok

# the default recipe (HQ_CONF_DIR/recipe.ini) finishes; on the system word list when installed
if [ -r /usr/share/dict/words ]; then data=; else data="--data $tmp/words.txt"; fi
$hq train --steps 20 --eval-every 0 $data > "$tmp/def.txt" 2>&1 || { cat "$tmp/def.txt"; fail "the default recipe"; }
grep -q "^mxfp8-forward-nvfp4-backward " "$tmp/def.txt" || fail "the default recipe's row"
grep -q "^fp32 .*(baseline)" "$tmp/def.txt" || fail "the default run's baseline"; ok
HQ_CONF_DIR=$tmp/none $hq train $small 2>"$tmp/e"; [ $? -eq 1 ] || fail "no default recipe exit status"
[ "$(cat "$tmp/e")" = "hq train: no --recipe given and the default recipe $tmp/none/recipe.ini cannot be read (No such file or directory): install hq (make install), set HQ_CONF_DIR to the directory holding recipe.ini, or give --recipe FILE" ] ||
  { cat "$tmp/e"; fail "no default recipe message"; }; ok

# issue 46 item 13: --seeds N trains every recipe from seeds S..S+N-1; the table's means, spread
# and marks follow the per-seed numbers of --json (recomputed here: mean, sample sd, the paired
# gap's standard error, * where |mean gap| > 2 se)
if [ $have_py -eq 1 ]; then
  $hq train $small --steps 20 --seed 3 --seeds 3 --recipe "$conf/examples/nvfp4.ini" --json \
    > "$tmp/seeds.json" 2>"$tmp/e" || { cat "$tmp/e"; fail "--seeds --json"; }
  grep -q "^hq train: seed 5: " "$tmp/e" || fail "--seeds: the third seed's data line"
  python3 -c 'import json, math, sys
d = json.load(open(sys.argv[1]))
assert d["config"]["seed"] == 3 and d["config"]["seeds"] == 3, d["config"]
base = [s["eval_loss"] for s in d["recipes"][1]["per_seed"]]
for r in d["recipes"]:
    ps = r["per_seed"]
    assert [s["seed"] for s in ps] == [3, 4, 5], ps
    assert ps[0]["eval_loss"] == r["eval_loss"]      # the top-level keys: the first seed
    ev = [s["eval_loss"] for s in ps]
    m = sum(ev) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in ev) / 2)
    st = r["stats"]
    assert abs(st["eval_loss_mean"] - m) < 1e-7 and abs(st["eval_loss_sd"] - sd) < 1e-7, st
    assert len(set(ev)) == 3, ev                     # three seeds, three different runs
    if r["baseline"]:
        assert st["gap_mean"] is None and st["gap_exceeds_noise"] is None, st
        continue
    g = [a - b for a, b in zip(ev, base)]
    gm = sum(g) / 3
    se = math.sqrt(sum((x - gm) ** 2 for x in g) / 2) / math.sqrt(3)
    assert abs(st["gap_mean"] - gm) < 1e-7 and abs(st["gap_se"] - se) < 1e-7, st
    assert st["gap_exceeds_noise"] == (abs(gm) > 2 * se), st' "$tmp/seeds.json" ||
    fail "--seeds: the statistics in --json"; ok
  # the machine the throughput was measured on: no GPU on the CPU path, the host CPU's model as
  # /proc/cpuinfo names it (null where it names none) and its online CPUs
  python3 -c 'import json, os, sys
m = json.load(open(sys.argv[1]))["machine"]
assert m["gpu"] is None and m["sm"] is None, m
want = None
if os.path.exists("/proc/cpuinfo"):
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            want = line.split(":", 1)[1].strip() or None
            break
assert m["host_cpu"] == want, (m, want)
assert m["host_cpus"] == os.sysconf("SC_NPROCESSORS_ONLN"), m' "$tmp/seeds.json" ||
    fail "--json machine"; ok
fi
$hq train $small --steps 20 --seeds 2 --recipe "$conf/examples/nvfp4.ini" > "$tmp/seeds.txt" 2>&1 ||
  { cat "$tmp/seeds.txt"; fail "--seeds table"; }
grep -q "^recipe  *train loss  *eval loss  *sd  *gap vs base  *se  *time  *tokens/s$" "$tmp/seeds.txt" &&
  grep -q "^2 seeds (1..2), each its own split" "$tmp/seeds.txt" &&
  grep -q "^\[4/4\] fp32 " "$tmp/seeds.txt" || { cat "$tmp/seeds.txt"; fail "--seeds: the table"; }; ok
usage_error "hq train: --resume continues one run: --seeds must be 1" train $nd --seeds 2 --resume x
usage_error "hq train: --seeds '65' is not an integer in [1, 64]" train $nd --seeds 65

# issue 46 item 4: the memory a run needs is printed before the first step; a run that cannot
# fit is refused at once with the estimate and what is available (HQ_TRAIN_HOST_MEMORY pretends
# a smaller machine: the size that was OOM-killed on a 23 GB machine)
grep -q "^hq train: memory: about [0-9.]* MiB per run on the host (" "$tmp/seeds.txt" ||
  fail "the memory line"; ok
start=$(date +%s)
HQ_TRAIN_HOST_MEMORY=23G $hq train --data "$tmp/words.txt" --hidden 16384 --layers 7 --batch 128 \
  --recipe "$conf/examples/mxfp8.ini" > "$tmp/o" 2>"$tmp/e"; rc=$?
[ $rc -eq 1 ] || { cat "$tmp/e"; fail "a run too large for the memory: exit status $rc"; }
grep -q "^hq train: the run needs about [0-9.]* GiB of host memory (.*), more than the 23.0 GiB available (HQ_TRAIN_HOST_MEMORY=23G): refused before allocating; use a smaller --hidden, --layers or --batch$" "$tmp/e" ||
  { cat "$tmp/e"; fail "a run too large: the message"; }
[ $(($(date +%s) - start)) -lt 20 ] || fail "a run too large: not refused at once"
grep -q "^\[" "$tmp/o" && fail "a run too large: it trained"; ok
# the estimate against an independent count: the default model (C=8 E=16 H=256 L=2, vocab padded
# to 128) has 132,144 parameters; masters, gradients and Adam moments are 16 bytes each, so the
# model needs at least 2.0 MiB and, at its largest (two F32 quantized copies of each weight,
# activations, temporaries), well under the 64 MiB allowance for the process above it
HQ_TRAIN_HOST_MEMORY=1M $hq train --data "$tmp/words.txt" --recipe "$conf/examples/mxfp8.ini" 2>"$tmp/e" >/dev/null
grep -q "^hq train: the run needs about [67][0-9].[0-9] MiB of host memory (the model [2-9].[0-9] MiB: .*more than the 1.0 MiB available (HQ_TRAIN_HOST_MEMORY=1M)" "$tmp/e" ||
  { cat "$tmp/e"; fail "the default model's estimate"; }; ok

# issue 46 item 5: every output path is checked before the first step, not after the run
early() {   # early MESSAGE ARGS...: exit 1 with MESSAGE, and no step trained
  msg=$1; shift
  $hq train $small --recipe "$conf/examples/mxfp8.ini" "$@" > "$tmp/o" 2>"$tmp/e"; rc=$?
  [ $rc -eq 1 ] || { cat "$tmp/e"; fail "$*: exit status $rc"; }
  [ "$(tail -n 1 "$tmp/e")" = "$msg" ] || { cat "$tmp/e"; fail "$*: expected '$msg'"; }
  grep -q "^\[" "$tmp/o" && fail "$*: it trained before failing"
  ok
}
early "hq train: --checkpoint $tmp/nodir/ck.safetensors: the directory $tmp/nodir: No such file or directory" \
  --checkpoint "$tmp/nodir/ck.safetensors"
early "hq train: --plot $tmp/nodir/loss.png: the directory $tmp/nodir: No such file or directory" \
  --plot "$tmp/nodir/loss.png"
early "hq train: --checkpoint $tmp/words.txt/ck.safetensors: $tmp/words.txt is not a directory" \
  --checkpoint "$tmp/words.txt/ck.safetensors"
early "hq train: --plot $tmp: not a regular file (a directory): hq writes its output only to a regular file or a new one" --plot "$tmp"
mkdir -p "$tmp/ro"
chmod 555 "$tmp/ro"
if [ ! -w "$tmp/ro" ]; then   # (root may write anyway)
  early "hq train: --checkpoint $tmp/ro/ck: cannot create a file in $tmp/ro: Permission denied" \
    --checkpoint "$tmp/ro/ck"
fi
chmod 755 "$tmp/ro"
# gnuplot's own message when it cannot draw (a stand-in gnuplot that fails as a broken one does)
mkdir -p "$tmp/bin"
printf '#!/bin/sh\ncat >/dev/null\necho "line 1: unknown or ambiguous terminal type" >&2\nexit 1\n' > "$tmp/bin/gnuplot"
chmod +x "$tmp/bin/gnuplot"
opath=$PATH
PATH="$tmp/bin:$PATH"
early "hq train: --plot $tmp/l.png: gnuplot failed on a test plot before the first step (exit status 1): line 1: unknown or ambiguous terminal type" \
  --plot "$tmp/l.png"
PATH=$opath
ls -a "$tmp" | grep -q hq-train-probe && fail "a probe file left behind"; ok

# train: errors before training (pre-flight, resume options, float ranges)
# every recipe is tried on the model's shapes before the first run trains: MXFP8's 32-row blocks
# refuse --batch 16, named (file, role, shape) before the BF16 recipe given first trains
pre="--data $tmp/words.txt --steps 3 --hidden 32 --layers 1 --eval-every 0"
failure "hq train: recipe 'mxfp8' ($conf/examples/mxfp8.ini): layer fc1: role linear:input:fc1, rowwise format 'mx' (plugin mxfp8), shape [16, 128]: mxfp8: rows = 16 is not a multiple of 32 (checked before the first step: nothing trained)" \
  train $pre --batch 16 --baseline none --recipe "$conf/examples/high_precision.ini" --recipe "$conf/examples/mxfp8.ini"
grep -q "^\[" "$tmp/o" && fail "pre-flight: a run trained before the refusal"
# a run that fails later keeps the table of the runs that finished, and exits 1: the baseline's
# save at step 2 finds a directory there (the check before training tries each run's file of
# the last step, the longest name, not every {step} of --checkpoint-every)
mkdir -p "$tmp/ckd/ck-2-fp32.safetensors"
$hq train $pre --batch 32 --recipe "$conf/examples/mxfp8.ini" --checkpoint "$tmp/ckd/ck-{step}.safetensors" \
  --checkpoint-every 2 > "$tmp/o" 2> "$tmp/e"; rc=$?
[ $rc -eq 1 ] || { cat "$tmp/e"; fail "a later run's failure: exit status $rc"; }
[ "$(table "$tmp/o")" = "mxfp8 - " ] || { cat "$tmp/o"; fail "a later run's failure: the finished run's table"; }
[ "$(tail -n 1 "$tmp/e")" = "hq train: run 'fp32' failed (above); the report covers the 1 run that finished before it, without the baseline" ] ||
  { cat "$tmp/e"; fail "a later run's failure: the note"; }; ok
# empty or directory output paths, and a gnuplot pipe, are refused at parsing
usage_error "hq train: --checkpoint '' is empty: give the FILE to write" train $nd --checkpoint ''
usage_error "hq train: --plot '' is empty: give the FILE to write" train $nd --plot ''
usage_error "hq train: --checkpoint '$tmp/' names a directory: give a FILE" train $nd --checkpoint "$tmp/"
usage_error "hq train: --plot '|cat' starts with '|', which gnuplot runs as a command: give a FILE" train $nd --plot '|cat'
# --resume continues the saved run's learning rate: another --lr is refused naming both, none
# given takes the checkpoint's (the same final state as giving it)
rs="--data $tmp/words.txt --hidden 32 --batch 32 --layers 1 --eval-every 0 --baseline none --recipe $conf/examples/fp8_current.ini"
$hq train $rs --steps 3 --lr 0.01 --checkpoint "$tmp/lr.safetensors" > /dev/null 2> "$tmp/e" || { cat "$tmp/e"; fail "--lr 0.01 --checkpoint"; }
failure "hq train: --lr 0.1 differs from the learning rate of the run saved in $tmp/lr.safetensors (lr = 0.01): --resume continues that run; leave --lr out or give --lr 0.01" \
  train $rs --steps 6 --resume "$tmp/lr.safetensors" --lr 0.1
grep -q "^\[" "$tmp/o" && fail "--resume --lr: it trained"
$hq train $rs --steps 6 --resume "$tmp/lr.safetensors" --checkpoint "$tmp/lr-a.safetensors" > "$tmp/o" 2> "$tmp/e" || { cat "$tmp/e"; fail "--resume without --lr"; }
grep -q ", 6 steps, lr 0.01, seed 1, cpu$" "$tmp/o" || { cat "$tmp/o"; fail "--resume without --lr: not the checkpoint's lr"; }
$hq train $rs --steps 6 --resume "$tmp/lr.safetensors" --lr 0.01 --checkpoint "$tmp/lr-b.safetensors" > /dev/null 2> "$tmp/e" || { cat "$tmp/e"; fail "--resume --lr 0.01"; }
cmp -s "$tmp/lr-a.safetensors" "$tmp/lr-b.safetensors" || fail "--resume: without --lr and with the checkpoint's, other states"; ok
# --verify-resume saves at the first --checkpoint-every step the run trains: refused when none
# comes before --steps; after a resume from step 3, --checkpoint-every 2 verifies at step 4
usage_error "hq train: --verify-resume saves at the first --checkpoint-every step, and --checkpoint-every 3 saves none before --steps 3: give a smaller one, or leave it out to verify halfway" \
  train $nd --steps 3 --verify-resume --checkpoint-every 3
$hq train $rs --steps 9 --resume "$tmp/lr.safetensors" --checkpoint-every 2 --verify-resume > "$tmp/o" 2> "$tmp/e" || { cat "$tmp/e"; fail "--resume --verify-resume"; }
grep -q "resume verified: the checkpoint of step 4 .* steps 5..9" "$tmp/o" || { cat "$tmp/o"; fail "--resume --verify-resume: not at step 4"; }; ok
failure "hq train: recipe 'fp8-current-e4m3' ($conf/examples/fp8_current.ini), step 3: --verify-resume: --checkpoint-every 2 saves no checkpoint after step 3 before --steps 4: give a smaller one, or leave it out to verify halfway" \
  train $rs --steps 4 --resume "$tmp/lr.safetensors" --checkpoint-every 2 --verify-resume
# --lr below float32's normal range (0, or subnormal, once the trainer's float holds it)
usage_error "hq train: --lr '1e-50' is 0 as a float32, the trainer's precision: give at least 1.17549435e-38" train $nd --lr 1e-50
usage_error "hq train: --lr '1e-40' is subnormal as a float32, the trainer's precision: give at least 1.17549435e-38" train $nd --lr=1e-40

echo "test_train: $n checks passed"
exit 0
