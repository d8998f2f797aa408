#!/bin/sh
# test_cli.sh -- the hq command: help, info (text and JSON), recipe check of the shipped and of
# broken recipes (exit status, file:line), quantize (random, .npy, raw, bad input), bench (the
# rows and columns it prints, its deterministic JSON), and every command's option parsing:
# unknown options, missing values, flags given a value, repeated options, --opt=value and
# --opt value, exit status 2 for a usage error and 1 for a failure.
# Exit 0 pass, 1 fail (automake's protocol).
set -u
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
LC_ALL=C; export LC_ALL   # strerror's text in the messages compared below
n=0
fail() { echo "FAIL: $*"; exit 1; }
ok() { n=$((n + 1)); }
# expect STATUS ARGS...: run hq ARGS (stdout in $tmp/out, stderr in $tmp/err); its exit status must
# be STATUS
expect() {
  want=$1; shift
  $hq "$@" > "$tmp/out" 2> "$tmp/err"; got=$?
  [ "$got" -eq "$want" ] || { cat "$tmp/err"; fail "hq $*: exit status $got, expected $want"; }
}
# usage_error MESSAGE ARGS...: exit status 2, nothing on stdout, MESSAGE the one line on stderr
usage_error() {
  msg=$1; shift
  expect 2 "$@"
  [ -s "$tmp/out" ] && fail "hq $*: a usage error wrote to stdout"
  printf '%s\n' "$msg" | cmp -s - "$tmp/err" || { cat "$tmp/err"; fail "hq $*: expected '$msg'"; }
  ok
}
# failure MESSAGE ARGS...: exit status 1, MESSAGE the last line on stderr
failure() {
  msg=$1; shift
  expect 1 "$@"
  [ "$(tail -n 1 "$tmp/err")" = "$msg" ] || { cat "$tmp/err"; fail "hq $*: expected '$msg'"; }
  ok
}
# jsonrows: a JSON document on stdin with each object of its "results" array on a line of its
# own and the values that are timings (or depend on them, or on a command's scratch memory)
# replaced by T
jsonrows() {
  sed -e 's/},{"\(format\|shape\)"/},\n{"\1"/g' -e 's/"results":\[/"results":[\n/' |
    sed -E 's/"(median_ms|input_mb_per_s|amax_pass_ms|both_over_parts|workspace_bytes|peak_bytes_beyond_input|hybrid_target_met|tflops|percent_of_baseline|target_met|note)":("[^"]*"|[^,}]*)/"\1":T/g'
}

# help: the same text from `hq C --help`, `hq C -h` and `hq help C`, exit status 0, nothing on
# stderr (the parser reports there an option its command's help does not name)
expect 0 --help
[ "$(head -n 1 "$tmp/out")" = "usage: hq <command> [options]" ] || fail "hq --help: first line"
[ "$(sed -n 's/^  \([a-z]\+\( check\)\?\)  .*/\1/p' "$tmp/out" | tr '\n' ' ')" = "info recipe check quantize bench train " ] ||
  { cat "$tmp/out"; fail "hq --help: the command list"; }
[ -s "$tmp/err" ] && fail "hq --help wrote to stderr"
cp "$tmp/out" "$tmp/help"
for h in -h help "help nosuch"; do
  expect 0 $h; cmp -s "$tmp/help" "$tmp/out" || fail "hq $h differs from hq --help"
done; ok
for c in info "recipe check" quantize bench "bench --gemm" train; do
  set -- $c
  expect 0 "$@" --help
  case $c in
    info) first="usage: hq info [--json] [--shape RxC] [--plugin-dir DIR]..." ;;
    recipe*) first="usage: hq recipe check FILE [--json] [--plugin-dir DIR]..." ;;
    quantize) first="usage: hq quantize --recipe FILE --role MODULE:TENSOR:NAME" ;;
    bench) first="usage: hq bench [--device cpu|cuda[:N]] [--shape RxC] [--dtype bf16|f16|f32]" ;;
    bench*) first="usage: hq bench --gemm [--device cpu|cuda[:N]] [--shape MxNxK]... [--iters N]" ;;
    train) first="usage: hq train [--recipe FILE]... [--device cpu|cuda] [--steps N] [--batch B]" ;;
  esac
  [ "$(head -n 1 "$tmp/out")" = "$first" ] || { head -n 1 "$tmp/out"; fail "hq $c --help: first line"; }
  [ -s "$tmp/err" ] && { cat "$tmp/err"; fail "hq $c --help wrote to stderr"; }
  cp "$tmp/out" "$tmp/help"
  expect 0 "$@" -h; cmp -s "$tmp/help" "$tmp/out" || fail "hq $c -h differs from --help"
  case $c in
    "bench --gemm") ;;
    *) expect 0 help $1; cmp -s "$tmp/help" "$tmp/out" || fail "hq help $1 differs from hq $c --help" ;;
  esac
  # --help wins over the options before it, unless one of them is wrong
  expect 0 "$@" --json --help; cmp -s "$tmp/help" "$tmp/out" || fail "hq $c --json --help"
  # the parser knows every option the help names (a value x, then an unknown option: nothing runs)
  for o in $(grep -o -- '--[a-z][a-z-]*' "$tmp/help" | sort -u); do
    $hq "$@" "$o=x" --zz-unknown > /dev/null 2> "$tmp/err"
    grep -q "unknown option '$o'" "$tmp/err" && fail "hq $c --help names $o, which the parser does not know"
  done; ok
done
expect 0 recipe --help; cmp -s "$tmp/out" "$tmp/help" && fail "recipe --help equals bench --gemm --help"
expect 2 recipe; [ "$(head -n 1 "$tmp/err")" = "usage: hq recipe check FILE [--json] [--plugin-dir DIR]..." ] || fail "hq recipe: usage on stderr"
[ -s "$tmp/out" ] && fail "hq recipe: stdout"; ok
expect 2; [ "$(head -n 1 "$tmp/err")" = "usage: hq <command> [options]" ] || fail "hq without a command"; ok
usage_error "hq: 'frobnicate' is not a command (see \`hq --help\`)" frobnicate
# --version: the version and plugin ABI of `hq info --json`, and whether CUDA is built in
$hq info --json > "$tmp/info.json" || fail "info --json"
ver=$(sed 's/^{"version":"\([^"]*\)".*/\1/' "$tmp/info.json")
abi=$(sed 's/.*"abi":{"major":\([0-9]*\),"minor":\([0-9]*\)}.*/\1.\2/' "$tmp/info.json")
grep -q '"cuda":true' "$tmp/info.json" && cuda=", CUDA" || cuda=
expect 0 --version; [ "$(cat "$tmp/out")" = "hq $ver (plugin ABI $abi$cuda)" ] || { cat "$tmp/out"; fail "--version"; }
expect 0 version; [ "$(cat "$tmp/out")" = "hq $ver (plugin ABI $abi$cuda)" ] || fail "version"; ok

# option parsing, the same for every command (tools/cli.c): an unknown option, an argument that
# is not an option, a missing value, a value given to a flag; exit status 2 and one message
for c in info "recipe check" quantize bench "bench --gemm" train; do
  set -- $c
  usage_error "hq $c: unknown option '--bogus' (see \`hq $c --help\`)" "$@" --bogus
  usage_error "hq $c: unknown option '--bogus' (see \`hq $c --help\`)" "$@" --bogus=1
  usage_error "hq $c: unknown option '-x' (see \`hq $c --help\`)" "$@" -x
  usage_error "hq $c: unknown option '--jso' (see \`hq $c --help\`)" "$@" --jso
  usage_error "hq $c: --plugin-dir needs a value" "$@" --plugin-dir
  usage_error "hq $c: --json takes no value ('--json=1')" "$@" --json=1
  usage_error "hq $c: --json takes no value ('--json=')" "$@" --json=
  # the first error wins: nothing after it is read
  usage_error "hq $c: unknown option '--bogus' (see \`hq $c --help\`)" "$@" --bogus --help
  case $c in
    recipe*) usage_error "hq recipe check: one recipe at a time ('a.ini' and 'b.ini')" "$@" a.ini b.ini ;;
    *) usage_error "hq $c: unknown argument 'stray' (see \`hq $c --help\`)" "$@" stray
       usage_error "hq $c: unknown argument '-' (see \`hq $c --help\`)" "$@" - ;;
  esac
done
# at most 32 --plugin-dir options (each command), 64 --format, 16 --shape (bench --gemm),
# 16 --recipe (train)
set --; for i in $(seq 33); do set -- "$@" --plugin-dir "$tmp"; done
usage_error "hq info: at most 32 --plugin-dir options" info "$@"
usage_error "hq recipe check: at most 32 --plugin-dir options" recipe check "$@"
set --; for i in $(seq 65); do set -- "$@" --format=mxfp8; done
usage_error "hq bench: at most 64 --format options" bench "$@"
set --; for i in $(seq 17); do set -- "$@" --shape 32x32x32; done
usage_error "hq bench --gemm: at most 16 --shape options" bench --gemm "$@"
set --; for i in $(seq 17); do set -- "$@" --recipe "$conf/recipe.ini"; done
usage_error "hq train: at most 16 --recipe options" train "$@"
# values: devices, dtypes, shapes and integers in range, the same words in every command
qr="--recipe $conf/recipe.ini --role a:b:c --random 4x4"
for c in quantize bench "bench --gemm" train; do
  a=; [ "$c" = quantize ] && a=$qr
  usage_error "hq $c: --device 'tpu' is not cpu, cuda or cuda:N" $c $a --device tpu
  usage_error "hq $c: --device 'cuda:1025' is not cpu, cuda or cuda:N" $c $a --device=cuda:1025
done
usage_error "hq quantize: --dtype 'f64' is not f32, bf16 or f16" quantize $qr --dtype f64
usage_error "hq bench: --dtype 'f64' is not f32, bf16 or f16" bench --dtype f64
usage_error "hq info: --shape '0x7' is not RxC with positive R and C" info --shape 0x7
usage_error "hq info: --shape '7' is not RxC with positive R and C" info --shape=7
usage_error "hq bench: --shape '8x0' is not RxC with positive R and C" bench --shape 8x0
usage_error "hq bench --gemm: --shape '64x64' is not MxNxK with positive sizes" bench --gemm --shape 64x64
usage_error "hq bench: --iters '0' is not an integer in [1, 100000]" bench --iters 0
usage_error "hq bench: --iters '100001' is not an integer in [1, 100000]" bench --iters=100001
usage_error "hq bench: --batch 'x' is not an integer in [1, 1000]" bench --batch x
usage_error "hq bench: --batch '-1' is not an integer in [1, 1000]" bench --batch -1
usage_error "hq bench --gemm: --iters '10001' is not an integer in [1, 10000]" bench --gemm --iters 10001
usage_error "hq bench --gemm: --batch '0' is not an integer in [1, 1000]" bench --gemm --batch=0
usage_error "hq quantize: --seed 'abc' is not an integer" quantize --seed abc
usage_error "hq quantize: --scale '0' is not a positive number" quantize --scale 0
usage_error "hq quantize: --output needs a file name" quantize $qr --output=
usage_error "hq bench: --recipe and --role go together" bench --recipe "$conf/recipe.ini"
usage_error "hq bench: --format 'nvfp4 rht' is not 'PLUGIN[ key=value...]'" bench --format 'nvfp4 rht'
usage_error "hq recipe check: no recipe file given (see --help)" recipe check --json
# --opt=value and --opt value are the same; a repeated option: the later value wins (scripts
# append overrides to a list of defaults), a repeatable one (--plugin-dir) collects them in order
expect 0 info --json --shape 64x32; cp "$tmp/out" "$tmp/a"
expect 0 info --json --shape=64x32; cmp -s "$tmp/a" "$tmp/out" || fail "info --shape=64x32 and --shape 64x32 differ"
expect 0 info --json --shape 8x8 --shape=64x32; cmp -s "$tmp/a" "$tmp/out" || fail "info: the later --shape does not win"
expect 0 info --json --json --shape 64x32; cmp -s "$tmp/a" "$tmp/out" || fail "info --json twice"; ok
mkdir -p "$tmp/d1" "$tmp/d2"
expect 0 info --json --plugin-dir "$tmp/d1" --plugin-dir="$tmp/d2"
path=$(printf '%s\n' "${HQ_PLUGIN_PATH:-}" | tr ':' '\n' | sed '/^$/d; s/.*/"&",/' | tr -d '\n')
def=$(sed 's/.*"default_plugin_dir":"\([^"]*\)".*/\1/' "$tmp/out")
grep -qF "\"plugin_path\":[$path\"$tmp/d1\",\"$tmp/d2\",\"$def\"]" "$tmp/out" ||
  { grep -o '"plugin_path":[^]]*]' "$tmp/out"; fail "info: --plugin-dir in order, after \$HQ_PLUGIN_PATH"; }; ok
q="--recipe $conf/examples/fp8_current.ini --role linear:weight:w"
expect 0 quantize $q --random 64x32 --seed 7 --scale 2 --dtype bf16 --json; cp "$tmp/out" "$tmp/a"
expect 0 quantize --recipe="$conf/examples/fp8_current.ini" --role=linear:weight:w --random=64x32 --seed=7 --scale=2 --dtype=bf16 --json
cmp -s "$tmp/a" "$tmp/out" || fail "quantize: --opt=value and --opt value differ"
expect 0 quantize $q --random 8x8 --seed 1 --scale 5 --dtype f16 --random 64x32 --seed 7 --scale 2 --dtype bf16 --json
cmp -s "$tmp/a" "$tmp/out" || fail "quantize: the later values do not win"
expect 0 recipe check --json --plugin-dir "$tmp" "$conf/recipe.ini"; cp "$tmp/out" "$tmp/a"
expect 0 recipe check "$conf/recipe.ini" --json --json --plugin-dir="$tmp"
cmp -s "$tmp/a" "$tmp/out" || fail "recipe check: options around FILE, --opt=value"; ok
expect 0 bench --shape 32x32 --iters 2 --batch 2 --format mxfp8 --dtype f32 --json; jsonrows < "$tmp/out" > "$tmp/a"
expect 0 bench --shape=32x32 --iters=2 --batch=2 --format=mxfp8 --dtype=f32 --json; jsonrows < "$tmp/out" > "$tmp/b"
cmp -s "$tmp/a" "$tmp/b" || { diff "$tmp/a" "$tmp/b"; fail "bench: --opt=value and --opt value differ"; }
expect 0 bench --shape 8x8 --iters 5 --batch 1 --dtype bf16 --shape 32x32 --iters 2 --batch 2 --dtype f32 --format mxfp8 --json; jsonrows < "$tmp/out" > "$tmp/b"
cmp -s "$tmp/a" "$tmp/b" || { diff "$tmp/a" "$tmp/b"; fail "bench: the later values do not win"; }; ok

# info lists the built-in identity and the stock formats with their options
for s in '"name":"identity"' '"name":"fp8_tensor"' '"name":"mxfp8"' '"name":"nvfp4"' '"name":"fp8_block"' \
         '"name":"rht_sign_mask","type":"int","default":"0xD7E8"' '"name":"block","type":"enum","default":"1d"' '"name":"power_2_scales","type":"bool","default":"false"' \
         '"name":"dtype","type":"enum","default":"e4m3"' '"choices":\["e4m3","e5m2"\]' '"abi":{"major":2,"minor":6}'; do
  grep -q "$s" "$tmp/info.json" || fail "info --json lacks $s"; ok
done
$hq info | grep -q "amax_epsilon" || fail "info text lacks options"; ok
# the capability flags by name: nvfp4 and fp8_tensor fold their factor (ABI 2.3), mxfp8 does not
for f in nvfp4 fp8_tensor; do
  grep -q "\"name\":\"$f\",\"version\":\"[^\"]*\",\"description\":\"[^\"]*\",\"file\":\"[^\"]*\",\"caps\":\"cpu[^\"]*,deq-factor\(,rng-dev\)\?\(,copy-out\)\?\"" "$tmp/info.json" ||
    fail "info --json: $f's caps lack deq-factor"; ok
done
# ABI 2.6: fp8_tensor writes a plain copy beside its codes, identity's storage is one
grep -q '"name":"fp8_tensor","version":"[^"]*","description":"[^"]*","file":"[^"]*","caps":"[^"]*,copy-out"' "$tmp/info.json" ||
  fail "info --json: fp8_tensor's caps lack copy-out"; ok
grep -q '"name":"identity","version":"[^"]*","description":"[^"]*","file":"[^"]*","caps":"[^"]*plain-copy' "$tmp/info.json" ||
  fail "info --json: identity's caps lack plain-copy"; ok
grep -q '"name":"mxfp8","version":"[^"]*","description":"[^"]*","file":"[^"]*","caps":"[^"]*deq-factor' "$tmp/info.json" &&
  fail "info --json: mxfp8 claims deq-factor"; ok
$hq info | grep -q '^  nvfp4 [^ ]*  \[cpu.*deq-factor\(,rng-dev\)\?\]$' || fail "info text: nvfp4's caps"; ok
# identity is built into libhqcore: listed first, with that in place of a file, in both forms
grep -q '"plugins":\[{"name":"identity",' "$tmp/info.json" || fail "info --json: identity is not the first format"; ok
grep -q '"name":"identity","version":"[^"]*","description":"[^"]*","file":"(built into libhqcore)"' "$tmp/info.json" || fail "info --json: identity's file"; ok
[ "$(grep -o '"name":"identity"' "$tmp/info.json" | wc -l)" -eq 1 ] || fail "info --json lists identity more than once"; ok
$hq info > "$tmp/info.txt" || fail "info"
grep -A2 '^  identity ' "$tmp/info.txt" | grep -q '^    (built into libhqcore)$' || { cat "$tmp/info.txt"; fail "info text: identity's file"; }; ok
# the built-in GEMM providers, in the order a GEMM asks them (highest priority first), both forms
grep -q '"gemm_providers":\[{"name":"cublaslt","version":"[^"]*","priority":100,[^]]*},{"name":"fused_hopper","version":"[^"]*","priority":50,[^]]*},{"name":"emulated","version":"[^"]*","priority":0,' "$tmp/info.json" ||
  { grep -o '"gemm_providers":[^]]*]' "$tmp/info.json"; fail "info --json: the built-in GEMM providers"; }; ok
[ "$(sed -n '/^GEMM providers/,/^$/s/^  \([a-z_]\+\) .*/\1/p' "$tmp/info.txt" | tr '\n' ' ')" = "cublaslt fused_hopper emulated " ] ||
  { cat "$tmp/info.txt"; fail "info text: the built-in GEMM providers"; }; ok
# every stock format reports the package's version, the one `hq --version` prints
v=$($hq --version | sed -n 's/^hq \([^ ]*\) .*/\1/p')
[ -n "$v" ] || fail "hq --version: no version"
for f in identity fp8_tensor mxfp8 nvfp4 fp8_block; do
  grep -q "\"name\":\"$f\",\"version\":\"$v\"" "$tmp/info.json" || fail "info --json: $f's version is not $v"; ok
  grep -q "^  $f $v  \[" "$tmp/info.txt" || { cat "$tmp/info.txt"; fail "info: $f's version is not $v"; }; ok
done
grep -q 'plugins/identity' "$tmp/info.json" && fail "info --json mentions a plugins/identity directory"; ok
# nothing is rejected, except an installed copy (scripts/install.sh) that the tree's module of the
# same name shadows
rej=$(sed -n 's/.*"rejected":\(\[.*\]\).*/\1/p' "$tmp/info.json")
nrej=$(printf '%s' "$rej" | grep -o '"reason":' | wc -l)
ndup=$(printf '%s' "$rej" | grep -o '"reason":"duplicate format name' | wc -l)
[ "$nrej" -eq "$ndup" ] || { echo "$rej"; fail "info --json: a stock module was rejected"; }; ok
# fp8_tensor's delayed-scaling options are listed (ABI 2.1); upstream's reduce_amax is not one
for o in scaling amax_history_len margin amax_compute_algo; do
  grep -q "\"name\":\"$o\"" "$tmp/info.json" || fail "info --json lacks option $o"; ok
done
grep -q "\"name\":\"reduce_amax\"" "$tmp/info.json" && fail "info --json lists reduce_amax"; ok
# a module named identity, or one built for ABI 1, is reported as rejected with its reason
if [ -n "${HQ_TEST_FIXTURES:-}" ] && [ -f "$HQ_TEST_FIXTURES/identity.so" ]; then
  $hq info --plugin-dir "$HQ_TEST_FIXTURES" > "$tmp/info.txt" || fail "info --plugin-dir"
  grep -q "identity.so: format name 'identity' is built into libhqcore" "$tmp/info.txt" || { cat "$tmp/info.txt"; fail "info: identity.so not rejected"; }; ok
  grep -q "v1_entry.so: built for plugin ABI 1 (it exports hq_format_module_v1)" "$tmp/info.txt" || fail "info: v1 module reason"; ok
  grep -A2 '^  identity ' "$tmp/info.txt" | grep -q '^    (built into libhqcore)$' || fail "info: the module replaced the built-in identity"; ok
fi

# recipe check: the shipped recipes are valid
for f in "$conf"/recipe.ini "$conf"/examples/*.ini; do
  expect 0 recipe check "$f"
  [ "$(tail -n 2 "$tmp/out")" = "
valid" ] || { cat "$tmp/out"; fail "recipe check $f did not end in valid"; }; ok
done
$hq recipe check --json "$conf/recipe.ini" | grep -q '"valid":true' || fail "check --json valid"; ok
# recipe check shows the delayed-scaling options of the delayed example
$hq recipe check "$conf/examples/fp8_delayed.ini" > "$tmp/out" 2>&1 || fail "recipe check fp8_delayed"
for kv in "scaling = delayed" "amax_history_len = 1024" "amax_compute_algo = max" "margin = 0"; do
  grep -q "$kv" "$tmp/out" || { cat "$tmp/out"; fail "recipe check: no '$kv'"; }; ok
done

# broken recipes: exit 1, every error with file:line
cat > "$tmp/bad.ini" <<'INI'
[format f8]
plugin = fp8_tensor
dtype = e9m9
[role linear:weight:*]
rowwise = nosuch
[role linear:weight:*]
columnwise = f8
INI
$hq recipe check "$tmp/bad.ini" > "$tmp/out" 2> "$tmp/err"; [ $? -eq 1 ] || fail "bad recipe exit status"
grep -q "bad.ini:3: option 'dtype'" "$tmp/err" || fail "bad.ini:3 error"; ok
grep -q "bad.ini:5: unknown format 'nosuch'" "$tmp/err" || fail "bad.ini:5 error"; ok
$hq recipe check --json "$tmp/bad.ini" > "$tmp/out"; [ $? -eq 1 ] || fail "bad --json exit"
grep -q '"valid":false' "$tmp/out" || fail "bad --json valid:false"; ok
printf '[format f8]\nplugin = fp8_tensor\n[role *:*:*]\nrowwise = f8\n[role *:*:*]\nrowwise = identity\n' > "$tmp/shadow.ini"
$hq recipe check "$tmp/shadow.ini" | grep -q "shadowed: \[role \*:\*:\*\] (line 5)" || fail "shadowed report"; ok
failure "hq recipe check: $tmp/nonexistent.ini: cannot open: No such file or directory" recipe check "$tmp/nonexistent.ini"
[ -s "$tmp/out" ] && fail "recipe check of a missing file: stdout"
usage_error "hq recipe check: no recipe file given (see --help)" recipe check

# a recipe named by a relative path that does not exist from here is the shipped one of that name
# ($conf/NAME, said on stderr), in every command that takes a recipe; a file of that name here
# wins, and ./NAME or an absolute path is taken as it is
mkdir -p "$tmp/cwd"
(cd "$tmp/cwd" && $hq recipe check recipe.ini > "$tmp/out" 2> "$tmp/err") ||
  { cat "$tmp/err"; fail "recipe check recipe.ini from an empty directory"; }
grep -qxF "hq recipe check: recipe recipe.ini: the shipped one, $conf/recipe.ini" "$tmp/err" ||
  { cat "$tmp/err"; fail "recipe check recipe.ini: the note"; }
[ "$(head -n 1 "$tmp/out")" = "recipe $conf/recipe.ini (mxfp8-forward-nvfp4-backward)" ] ||
  { head -n 1 "$tmp/out"; fail "recipe check recipe.ini: not the shipped file"; }; ok
(cd "$tmp/cwd" && $hq quantize --recipe examples/mxfp8.ini --role linear:weight:fc1 --random 32x32 \
   > "$tmp/out" 2> "$tmp/err") || { cat "$tmp/err"; fail "quantize --recipe examples/mxfp8.ini"; }
grep -qxF "role linear:weight:fc1 -> $conf/examples/mxfp8.ini, shape 32x32 f32 on cpu" "$tmp/out" ||
  { cat "$tmp/out"; fail "quantize: the shipped examples/mxfp8.ini"; }; ok
for c in "bench --shape 64x64 --iters 1" "bench --gemm --shape 32x32x32 --iters 1"; do
  (cd "$tmp/cwd" && $hq $c --recipe recipe.ini --role linear:weight:fc1 > "$tmp/out" 2> "$tmp/err") ||
    { cat "$tmp/err"; fail "$c --recipe recipe.ini"; }
  grep -qF "recipe recipe.ini: the shipped one, $conf/recipe.ini" "$tmp/err" || fail "$c: the note"; ok
done
(cd "$tmp/cwd" && $hq train --recipe examples/fp8_current.ini --steps 2 --batch 32 --hidden 16 \
   --eval-every 0 --baseline none > "$tmp/out" 2> "$tmp/err") ||
  { cat "$tmp/err"; fail "train --recipe examples/fp8_current.ini"; }
grep -qF "hq train: recipe examples/fp8_current.ini: the shipped one, $conf/examples/fp8_current.ini" \
  "$tmp/err" || fail "train: the note"; ok
cp "$tmp/shadow.ini" "$tmp/cwd/recipe.ini"
(cd "$tmp/cwd" && $hq recipe check recipe.ini > "$tmp/out" 2> "$tmp/err")
grep -qF "the shipped one" "$tmp/err" && { cat "$tmp/err"; fail "a recipe.ini here: a note"; }
[ "$(head -n 1 "$tmp/out")" = "recipe recipe.ini" ] || { head -n 1 "$tmp/out"; fail "a recipe.ini here lost"; }; ok
rm "$tmp/cwd/recipe.ini"
(cd "$tmp/cwd" && $hq recipe check ./recipe.ini > "$tmp/out" 2> "$tmp/err") && fail "./recipe.ini found"
[ "$(cat "$tmp/err")" = "hq recipe check: ./recipe.ini: cannot open: No such file or directory" ] ||
  { cat "$tmp/err"; fail "./recipe.ini: the message"; }; ok
(cd "$tmp/cwd" && $hq recipe check nosuch.ini > "$tmp/out" 2> "$tmp/err") && fail "nosuch.ini found"
[ "$(cat "$tmp/err")" = "hq recipe check: nosuch.ini: cannot open: No such file or directory" ] ||
  { cat "$tmp/err"; fail "nosuch.ini: the message"; }; ok

# quantize: random input, JSON fields, error in the FP8 band
$hq quantize --recipe "$conf/examples/fp8_current_hybrid.ini" --role linear:weight:fc1 --random 128x256 --json > "$tmp/q.json" || fail "quantize --json"
for s in '"direction":"rowwise"' '"direction":"columnwise"' '"plugin":"fp8_tensor"' '"rel_rms_error":0.02' '"bytes":32776' '"fused":true'; do
  grep -q "$s" "$tmp/q.json" || { cat "$tmp/q.json"; fail "quantize --json lacks $s"; }; ok
done
# one instance for both directions but the columnwise copy from the dequantized rowwise one: two
# plugin calls, so not fused
# review bug 8: recipe check warns about the linear roles no section matches (each tensor of a
# layer it names, and of any other layer), exit 0; `unmatched = identity` says it is meant
printf '[format f]\nplugin = fp8_tensor\n[role linear:input:fc1]\nrowwise = f\n' > "$tmp/um.ini"
$hq recipe check "$tmp/um.ini" > /dev/null 2> "$tmp/err" || fail "recipe check unmatched: exit status"
[ "$(grep -c '^hq recipe check: warning: role linear:[a-z_]*:.* matches no \[role\] section: both directions stay in high precision' "$tmp/err")" -eq 5 ] ||
  { cat "$tmp/err"; fail "recipe check: five unmatched roles"; }
grep -q "role linear:grad_output:(any other layer) matches no" "$tmp/err" || fail "recipe check: other layers"; ok
printf '[recipe]\nunmatched = identity\n' | cat - "$tmp/um.ini" > "$tmp/um2.ini"
$hq recipe check "$tmp/um2.ini" > "$tmp/out" 2> "$tmp/err" || fail "recipe check unmatched = identity"
grep -q "matches no" "$tmp/err" && { cat "$tmp/err"; fail "recipe check warned under unmatched = identity"; }
grep -q "unmatched roles: identity)" "$tmp/out" || fail "recipe check: the policy"; ok
printf '[format f8]\nplugin = fp8_tensor\n[role *:*:*]\nrowwise = f8\ncolumnwise = f8\ncolumnwise_source = rowwise_dequantized\n' > "$tmp/deq.ini"
$hq quantize --recipe "$tmp/deq.ini" --role a:b:c --random 32x32 --json > "$tmp/q.json" || fail "quantize rowwise_dequantized"
grep -q '"fused":false' "$tmp/q.json" || { cat "$tmp/q.json"; fail "rowwise_dequantized source reported fused"; }; ok
# bench counts what the core calls: the columnwise copy alone of that source is two quantize
# calls (a transient rowwise copy, then the columnwise one), the rowwise copy alone one
$hq bench --recipe "$tmp/deq.ini" --role a:b:c --shape 32x32 --iters 1 --json > "$tmp/b.json" || fail "bench rowwise_dequantized"
grep -q '"dirs":"columnwise","amax":"own",[^}]*"plugin_calls":2,' "$tmp/b.json" || { cat "$tmp/b.json"; fail "bench: columnwise from rowwise_dequantized is two calls"; }
grep -q '"dirs":"rowwise","amax":"own",[^}]*"plugin_calls":1,' "$tmp/b.json" || { cat "$tmp/b.json"; fail "bench: rowwise alone is one call"; }
grep -q '"dirs":"both","amax":"own",[^}]*"plugin_calls":2,' "$tmp/b.json" || { cat "$tmp/b.json"; fail "bench: both from rowwise_dequantized is two calls"; }; ok
# the default recipe: MXFP8 rowwise (E4M3: 2-3% error), NVFP4 columnwise (8-12%)
$hq quantize --recipe "$conf/recipe.ini" --role linear:weight:fc1 --random 256x256 --json > "$tmp/q.json" || fail "quantize default recipe"
for s in '"format":"mx","plugin":"mxfp8","bytes":67584' '"format":"nv_w","plugin":"nvfp4","bytes":36868' '"fused":false'; do
  grep -q "$s" "$tmp/q.json" || { cat "$tmp/q.json"; fail "default recipe lacks $s"; }; ok
done
expect 0 quantize --recipe "$conf/recipe.ini" --role linear:weight:lm_head --random 8x8
# the head stays in high precision: the identity plugin in BF16, as the BF16 baseline runs it
[ "$(awk 'NR == 3 || NR == 5 { print $1, $2, $3 } NR == 4 { print $2 }' "$tmp/out" | tr '\n' '|')" = "rowwise hp identity|bf16|columnwise hp identity|" ] ||
  { cat "$tmp/out"; fail "lm_head stays in BF16 (hp: identity)"; }; ok
# a .npy input (float32, shape (2, 3)) written byte by byte; values 1 -2 3 448 0.5 -0.25 are exact in E4M3
hdr="{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
pad=$((128 - 10 - ${#hdr} - 1))   # header length 118 = octal 166; data starts at byte 128
{ printf '\223NUMPY\001\000\166\000'; printf '%s' "$hdr"; printf "%${pad}s\n" ""; \
  printf '\000\000\200\077\000\000\000\300\000\000\100\100\000\000\340\103\000\000\000\077\000\000\200\276'; } > "$tmp/x.npy"
$hq quantize --recipe "$conf/examples/fp8_current.ini" --role a:b:c --input "$tmp/x.npy" --json > "$tmp/q.json" || fail "quantize .npy"
grep -q '"shape":\[2,3\]' "$tmp/q.json" || fail ".npy shape"; ok
grep -q '"rel_rms_error":0,' "$tmp/q.json" || { cat "$tmp/q.json"; fail ".npy exact values"; }; ok
head -c 40 "$tmp/x.npy" > "$tmp/cut.npy"
$hq quantize --recipe "$conf/recipe.ini" --role a:b:c --input "$tmp/cut.npy" 2>"$tmp/err"; [ $? -eq 1 ] || fail "corrupt .npy exit"
grep -q "corrupt .npy header" "$tmp/err" || fail "corrupt .npy message"; ok
# raw input with --shape; a size mismatch is an error naming both sizes
head -c 96 /dev/zero > "$tmp/raw.bin"
$hq quantize --recipe "$conf/recipe.ini" --role a:b:c --input "$tmp/raw.bin" --shape 4x6 --dtype f32 >/dev/null || fail "raw input"; ok
$hq quantize --recipe "$conf/recipe.ini" --role a:b:c --input "$tmp/raw.bin" --shape 4x7 2>"$tmp/err"; [ $? -eq 1 ] || fail "raw size exit"
grep -q "holds 96 data bytes, the shape 4x7 of f32 needs 112" "$tmp/err" || fail "raw size message"; ok
failure "hq quantize: $tmp/raw.bin is not a .npy file: give --shape RxC (and --dtype) for raw values" \
  quantize --recipe "$conf/recipe.ini" --role a:b:c --input "$tmp/raw.bin"
# a bad --shape for raw values is a usage error (it was exit status 1)
usage_error "hq quantize: --shape '0x4' is not RxC with positive R and C" \
  quantize --recipe "$conf/recipe.ini" --role a:b:c --input "$tmp/raw.bin" --shape 0x4
failure "hq quantize: $tmp/none.bin: cannot open: No such file or directory" \
  quantize --recipe "$conf/recipe.ini" --role a:b:c --input "$tmp/none.bin" --shape 4x4
# a shape a format cannot take: the error names the role, direction, format, shape and rule
$hq quantize --recipe "$conf/recipe.ini" --role linear:weight:fc1 --random 100x64 2>"$tmp/err"; [ $? -eq 1 ] || fail "bad shape exit"
grep -q "role linear:weight:fc1, rowwise format 'mx' (plugin mxfp8), shape \[100, 64\]: mxfp8: rows = 100 is not a multiple of 32" "$tmp/err" || { cat "$tmp/err"; fail "bad shape message"; }; ok
# usage errors
usage_error "hq quantize: role 'a:b' is not module_type:tensor_type:name" quantize --recipe "$conf/recipe.ini" --role a:b --random 4x4
usage_error "hq quantize: --random '4x' is not RxC with positive R and C" quantize --recipe "$conf/recipe.ini" --role a:b:c --random 4x
usage_error "hq quantize: give exactly one of --random and --input" quantize --recipe "$conf/recipe.ini" --role a:b:c
usage_error "hq quantize: give exactly one of --random and --input" quantize --recipe "$conf/recipe.ini" --role a:b:c --random 4x4 --input x
usage_error "hq quantize: --recipe and --role are required" quantize --role a:b:c --random 4x4
$hq quantize --recipe "$tmp/bad.ini" --role a:b:c --random 4x4 2>"$tmp/err"; [ $? -eq 1 ] || fail "bad recipe in quantize"
grep -q "bad.ini:3:" "$tmp/err" || fail "quantize names recipe error"; ok
# recipe check names the module file of every format; a user module that shadows another of the
# same name (earlier on the search path) is a loud warning, in JSON a "shadows" list
fp8so=$(echo "${HQ_PLUGIN_PATH:-}" | tr ':' '\n' | while read -r d; do [ -f "$d/fp8_tensor.so" ] && echo "$d/fp8_tensor.so" && break; done)
if [ -n "$fp8so" ]; then
  mkdir -p "$tmp/shadow" && cp "$fp8so" "$tmp/shadow/"
  HQ_PLUGIN_PATH="$tmp/shadow:$HQ_PLUGIN_PATH" $hq recipe check "$conf/examples/fp8_current.ini" >"$tmp/out" 2>"$tmp/err" || fail "shadowed recipe check"
  grep -q "module $tmp/shadow/fp8_tensor.so" "$tmp/out" || fail "recipe check names the module file"; ok
  grep -q "module (built into libhqcore)" "$tmp/out" || fail "recipe check names the built-in"; ok
  grep -q "warning: format 'f8' comes from $tmp/shadow/fp8_tensor.so, which shadows the module of the same name $fp8so" "$tmp/err" || { cat "$tmp/err"; fail "shadow warning"; }; ok
  HQ_PLUGIN_PATH="$tmp/shadow:$HQ_PLUGIN_PATH" $hq recipe check --json "$conf/examples/fp8_current.ini" >"$tmp/out" || fail "shadowed json"
  grep -q "\"shadows\":\[\"$fp8so\"" "$tmp/out" || fail "json shadows list"; ok
fi
# recipe check lists the three GEMMs of each linear layer and refuses a pair transformed
# differently along k (RHT on one wgrad operand only) with the role section's file:line
$hq recipe check "$conf/recipe.ini" > "$tmp/out" 2>/dev/null || fail "recipe check gemms"
grep -q "wgrad input.col nv_act (nvfp4) x grad_output.col nv_grad (nvfp4): cpu" "$tmp/out" || { cat "$tmp/out"; fail "recipe check wgrad line"; }; ok
grep -q "layer lm_head" "$tmp/out" || fail "recipe check lm_head layer"; ok
$hq recipe check --json "$conf/recipe.ini" 2>/dev/null | grep -q '"gemm":"dgrad","a":{"tensor":"weight","direction":"columnwise","format":"nv_w"' || fail "recipe check --json gemms"; ok
printf '[format a]\nplugin = nvfp4\nrht = true\n\n[role linear:input:*]\ncolumnwise = a\n[role linear:grad_output:*]\ncolumnwise = nvfp4\n' > "$tmp/rht.ini"
$hq recipe check "$tmp/rht.ini" > "$tmp/out" 2> "$tmp/err"; [ $? -eq 1 ] || fail "impossible gemm exit status"
grep -q "rht.ini:5: wgrad of linear layer '\*' is impossible: .*rht16" "$tmp/err" || { cat "$tmp/err"; fail "impossible gemm message"; }; ok
# a precedence trap: [role linear:*:lm_head] beside [role linear:grad_output:*] leaves lm_head's
# grad_output to the second (more literal characters): a warning naming both sections and the
# fix, the resolved table per layer showing it; valid all the same (exit 0)
printf '[format f8]\nplugin = fp8_tensor\n[role linear:input:*]\nrowwise = f8\ncolumnwise = f8\n[role linear:weight:*]\nrowwise = f8\ncolumnwise = f8\n[role linear:grad_output:*]\nrowwise = f8\ncolumnwise = f8\n[role linear:*:lm_head]\nrowwise = identity\ncolumnwise = identity\n' > "$tmp/trap.ini"
expect 0 recipe check "$tmp/trap.ini"
[ "$(grep -F "$tmp/trap.ini" "$tmp/err")" = "hq recipe check: warning: $tmp/trap.ini:12: [role linear:*:lm_head] does not apply to linear:grad_output:lm_head: [role linear:grad_output:*] (line 9) wins there (more literal characters) with rowwise = f8, columnwise = f8 instead of identity, identity; add [role linear:grad_output:lm_head] if lm_head's grad_output is meant to follow line 12" ] ||
  { cat "$tmp/err"; fail "recipe check: the lm_head precedence trap"; }
sed -n '/^resolved roles/,/^$/p' "$tmp/out" > "$tmp/got"
cat > "$tmp/want" <<'TABLE'
resolved roles of each linear layer (tensor: rowwise / columnwise, from section):
  layer *
    input        f8 / f8                  [role linear:input:*] line 3
    weight       f8 / f8                  [role linear:weight:*] line 6
    grad_output  f8 / f8                  [role linear:grad_output:*] line 9
  layer lm_head
    input        identity / identity      [role linear:*:lm_head] line 12
    weight       identity / identity      [role linear:*:lm_head] line 12
    grad_output  f8 / f8                  [role linear:grad_output:*] line 9

TABLE
diff "$tmp/want" "$tmp/got" || fail "recipe check: the resolved table per layer"; ok
$hq recipe check --json "$tmp/trap.ini" 2>/dev/null | grep -qF '{"layer":"lm_head","roles":[{"tensor":"input","rowwise":"identity","columnwise":"identity","section":"linear:*:lm_head","line":12},{"tensor":"weight","rowwise":"identity","columnwise":"identity","section":"linear:*:lm_head","line":12},{"tensor":"grad_output","rowwise":"f8","columnwise":"f8","section":"linear:grad_output:*","line":9}]}' ||
  fail "recipe check --json: the resolved table"; ok
# the fix the warning names silences it; so does a trap with the same formats on both sides
printf '[role linear:grad_output:lm_head]\nrowwise = identity\n' >> "$tmp/trap.ini"
expect 0 recipe check "$tmp/trap.ini"; grep -q "does not apply" "$tmp/err" && { cat "$tmp/err"; fail "recipe check: warning after the fix"; }
grep -q "^    grad_output  identity / identity      \[role linear:grad_output:lm_head\] line 15$" "$tmp/out" || { cat "$tmp/out"; fail "recipe check: the fixed table"; }; ok
printf '[role linear:grad_output:*]\nrowwise = fp8_tensor\n[role linear:*:lm_head]\nrowwise = fp8_tensor\n[recipe]\nunmatched = identity\n' > "$tmp/same.ini"
expect 0 recipe check "$tmp/same.ini"; grep -q "does not apply" "$tmp/err" && { cat "$tmp/err"; fail "recipe check: a trap without consequence warned"; }; ok
# bench on the CPU: per configuration a row per direction set (both, rowwise, columnwise), each
# followed by one with the per-tensor amax given where the format has one, then the ratio row;
# label, dirs and amax in their columns, then median_ms, input_MB/s and ws_KiB
expect 0 bench --shape 64x64 --iters 1 --batch 3 --format fp8_tensor --format mxfp8 --format 'identity dtype=f32'
[ "$(sed -n 1p "$tmp/out")" = "hq bench: cpu, one core, input 64x64 bf16 (0.0 MiB), median of 1 samples of 3 calls back to back" ] ||
  { cat "$tmp/out"; fail "bench: header"; }
[ "$(sed -n 2p "$tmp/out")" = "format                                   dirs       amax   median_ms   input_MB/s   ws_KiB" ] ||
  { cat "$tmp/out"; fail "bench: column heads"; }
tail -n +3 "$tmp/out" | awk '
  substr($0, 42, 10) ~ /^ratio/ { r = substr($0, 52); gsub(/ +[0-9]+\.[0-9]+/, " N", r); print "|ratio|" r; next }
  { l = substr($0, 1, 40); d = substr($0, 42, 10); a = substr($0, 53, 5); r = substr($0, 58)
    sub(/ +$/, "", l); sub(/ +$/, "", d); sub(/ +$/, "", a)
    gsub(/ +[0-9]+\.[0-9]+/, " N", r); print l "|" d "|" a "|" r }' > "$tmp/rows"
cat > "$tmp/want" <<'ROWS'
fp8_tensor|both|own| N N N
|both|given| N N N
|rowwise|own| N N N
|rowwise|given| N N N
|columnwise|own| N N N
|columnwise|given| N N N
|ratio| N x (rowwise + columnwise alone); given amax N x; one fused call
mxfp8|both|-| N N N
|rowwise|-| N N N
|columnwise|-| N N N
|ratio| N x (rowwise + columnwise alone); one fused call
identity dtype=f32|both|-| N N N
|rowwise|-| N N N
|columnwise|-| N N N
|ratio| N x (rowwise + columnwise alone); one fused call
ROWS
diff "$tmp/want" "$tmp/rows" || { cat "$tmp/out"; fail "bench: rows and columns"; }; ok
# the JSON: everything but timings is determined by the formats' layouts (docs/formats.md): for a
# 64x64 bf16 input (8192 bytes), fp8_tensor writes [64, 64] e4m3 per direction plus an f32
# scale_inv and amax that both directions share (made alone, a direction has its own); mxfp8
# [64, 64] e4m3 and an e8m0 scale of roundup(64,128) x roundup(64/32,4) per direction; identity
# f32 one [64, 64] buffer for both. Reads (a): one per plugin call plus one per amax computed
# inside; bytes (a) = input x reads + outputs, (b) = input + outputs.
expect 0 bench --shape 64x64 --iters 1 --batch 2 --format fp8_tensor --format mxfp8 --format 'identity dtype=f32' --json
jsonrows < "$tmp/out" > "$tmp/rows"
in=8192 f8=$((64 * 64 + 8)) f8b=$((2 * 64 * 64 + 8)) mx=$((64 * 64 + 128 * 4)) id=$((64 * 64 * 4))
row() { # row FORMAT DIRS AMAX OUT READS [EXTRA]: the result object's line
  printf '{"format":"%s","dirs":"%s","amax":"%s","median_ms":T,"input_mb_per_s":T,"bytes_written":%d,"plugin_calls":1,"input_reads_a":%d,"bytes_a":%d,"bytes_b":%d,"workspace_bytes":T,"peak_bytes_beyond_input":T%s' \
    "$1" "$2" "$3" "$4" "$5" $((in * $5 + $4)) $((in + $4)) "${6:-}"
}
given() { # given OUT [EXTRA]: the caller_amax object, the amax pass saved
  printf ',"caller_amax":{"median_ms":T,"amax_pass_ms":T,"input_mb_per_s":T,"input_reads_a":1,"bytes_a":%d,"bytes_b":%d,"workspace_bytes":T,"peak_bytes_beyond_input":T%s}' \
    $((in + $1)) $((in + $1)) "${2:-}"
}
{
  echo '{"device":"cpu","shape":[64,64],"dtype":"bf16","iters":1,"batch":2,"input_bytes":8192,"results":['
  echo "$(row fp8_tensor both own $f8b 2 ',"both_over_parts":T,"hybrid":false')$(given $f8b ',"both_over_parts":T')},"
  echo "$(row fp8_tensor rowwise own $f8 2)$(given $f8)},"
  echo "$(row fp8_tensor columnwise own $f8 2)$(given $f8)},"
  echo "$(row mxfp8 both none $((2 * mx)) 1 ',"both_over_parts":T,"hybrid":false')},"
  echo "$(row mxfp8 rowwise none $mx 1)},"
  echo "$(row mxfp8 columnwise none $mx 1)},"
  echo "$(row 'identity dtype=f32' both none $id 1 ',"both_over_parts":T,"hybrid":false')},"
  echo "$(row 'identity dtype=f32' rowwise none $id 1)},"
  echo "$(row 'identity dtype=f32' columnwise none $id 1)}]}"
} > "$tmp/want"
diff "$tmp/want" "$tmp/rows" || fail "bench --json"; ok
# a hybrid (the default recipe's weight: mxfp8 rowwise, nvfp4 columnwise): two plugin calls, one
# amax (nvfp4's) computed inside, the outputs of both directions those of each alone; no ratio
# with a given amax (mxfp8's rowwise row has none to give)
expect 0 bench --shape 64x64 --iters 1 --recipe "$conf/recipe.ini" --role linear:weight:fc1 --json
jsonrows < "$tmp/out" > "$tmp/rows"
nv=$(sed -n 's/.*"dirs":"columnwise","amax":"own",.*"bytes_written":\([0-9]*\),"plugin_calls":1,"input_reads_a":2,.*/\1/p' "$tmp/rows")
[ -n "$nv" ] || { cat "$tmp/rows"; fail "bench --recipe: the columnwise row"; }
grep -qF "$(row "$conf/recipe.ini linear:weight:fc1" rowwise none $mx 1)}," "$tmp/rows" || { cat "$tmp/rows"; fail "bench --recipe: the rowwise row"; }
both=$(row "$conf/recipe.ini linear:weight:fc1" both own $((mx + nv)) 3 ',"both_over_parts":T,"hybrid":true,"hybrid_target_max":1.1,"hybrid_target_met":T')
grep -qF "$(printf '%s' "$both" | sed 's/"plugin_calls":1/"plugin_calls":2/')" "$tmp/rows" || { cat "$tmp/rows"; fail "bench --recipe: the both row"; }; ok
expect 0 bench --shape 64x64 --iters 1 --recipe "$conf/recipe.ini" --role linear:weight:fc1
grep -q "^ \{41\}ratio  \{5\} *[0-9.]* x (rowwise + columnwise alone); hybrid of mxfp8 + nvfp4, target <= 1.1 x: \(met\|MISSED\)$" "$tmp/out" ||
  { cat "$tmp/out"; fail "bench --recipe: the ratio row"; }; ok
# the stock list, --all's list, and --format replacing either: the configurations in order
labels() { awk 'NR > 2 && substr($0, 1, 1) != " " { l = substr($0, 1, 40); sub(/ +$/, "", l); print l }' "$tmp/out"; }
expect 0 bench --shape 32x32 --iters 1
labels > "$tmp/rows"
printf '%s\n' "identity dtype=bf16" fp8_tensor mxfp8 nvfp4 "nvfp4 rht=true" "nvfp4 stochastic_rounding=true" \
  "nvfp4 block_2d=true" "fp8_block block=1d" "fp8_block block=2d" mxfp4 mxfp6 > "$tmp/want"
diff "$tmp/want" "$tmp/rows" || fail "bench: the stock configurations"; ok
expect 0 bench --all --shape 32x32 --iters 1
labels > "$tmp/rows"
printf '%s\n' "identity dtype=bf16" "identity dtype=f16" "identity dtype=f32" fp8_tensor "fp8_tensor dtype=e5m2" \
  "fp8_tensor power_2_scales=true" "fp8_tensor scaling=delayed" mxfp8 "mxfp8 dtype=e5m2" "mxfp8 swizzle=true" \
  "mxfp8 block_2d=true" "mxfp8 block_2d=true swizzle=true" nvfp4 "nvfp4 swizzle=true" "nvfp4 rht=true" \
  "nvfp4 stochastic_rounding=true" "nvfp4 rht=true stochastic_rounding=true" "nvfp4 block_2d=true" \
  "nvfp4 block_2d=true swizzle=true" "fp8_block block=1d" "fp8_block block=1d dtype=e5m2" \
  "fp8_block block=1d power_2_scales=false" "fp8_block block=2d" "fp8_block block=2d power_2_scales=false" \
  mxfp4 "mxfp4 scale=rceil" "mxfp4 stochastic_rounding=true" mxfp6 "mxfp6 elem=e3m2" \
  "mxfp6 stochastic_rounding=true" > "$tmp/want"
diff "$tmp/want" "$tmp/rows" || fail "bench --all: the 30 configurations"; ok
expect 0 bench --all --shape 32x32 --iters 1 --format mxfp8 --format "nvfp4, rht=true"
[ "$(labels | tr '\n' '|')" = "mxfp8|nvfp4 rht=true|" ] || { cat "$tmp/out"; fail "bench --format replaces --all"; }; ok
# failures: exit status 1
expect 1 bench --format nosuch --shape 8x8 --iters 1
grep -q "^hq bench: nosuch: bench:2: plugin 'nosuch' was not found on the plugin search path" "$tmp/err" || { cat "$tmp/err"; fail "bench: a plugin not found"; }; ok
if ! grep -q '"devices":\[{' "$tmp/info.json"; then
  expect 1 bench --device cuda --shape 8x8 --iters 1
  expect 1 bench --gemm --device cuda --shape 32x32x32 --iters 1; [ -s "$tmp/out" ] && fail "bench --gemm without a GPU: stdout"
  [ -n "$cuda" ] || [ "$(cat "$tmp/err")" = "hq bench --gemm: this hq was built without CUDA" ] || fail "bench --gemm without CUDA"; ok
fi
# bench --gemm on the CPU: per shape the direct sgemm, then hq on f32 tensors, fp8_tensor and
# mxfp8 against it; --shape repeatable, the later --iters wins
expect 0 bench --gemm --device cpu --shape 32x32x32 --shape=64x32x64 --iters 3 --iters=1 --json
jsonrows < "$tmp/out" > "$tmp/rows"
[ "$(head -n 1 "$tmp/rows")" = '{"device":"cpu","iters":1,"batch":1,"d_dtype":"f32","results":[' ] || { cat "$tmp/rows"; fail "bench --gemm --json: head"; }
sed -n 's/^{"shape":\[\([0-9,]*\)\],"kind":"\([^"]*\)".*/\1 \2/p' "$tmp/rows" > "$tmp/got"
for s in 32,32,32 64,32,64; do
  printf '%s\n' "$s sgemm (direct)" "$s hq f32 tensors" "$s hq fp8_tensor (raw dequantize + sgemm)" "$s hq mxfp8 (raw dequantize + sgemm)"
done > "$tmp/want"
diff "$tmp/want" "$tmp/got" || fail "bench --gemm --json: the rows"; ok
expect 0 bench --gemm --device=cpu --shape 32x32x32 --iters 1
[ "$(sed -n 1p "$tmp/out")" = "hq bench --gemm: cpu (the BLAS libhqcore uses), D f32, median of 1 samples of 1 call" ] || { cat "$tmp/out"; fail "bench --gemm: header"; }
[ "$(sed -n 2p "$tmp/out")" = "m x n x k            kind                                         path           median_ms  GFLOP/s  vs baseline" ] ||
  { cat "$tmp/out"; fail "bench --gemm: column heads"; }
[ "$(tail -n +3 "$tmp/out" | cut -c1-65 | sed 's/ *$//')" = "32x32x32             sgemm (direct)
                     hq f32 tensors
                     hq fp8_tensor (raw dequantize + sgemm)
                     hq mxfp8 (raw dequantize + sgemm)" ] || { cat "$tmp/out"; fail "bench --gemm: the rows"; }; ok
# bench --gemm runs on the CPU unless --device says otherwise, as every command; hq bench --help
# points at it
expect 0 bench --gemm --shape 32x32x32 --iters 1
[ "$(sed -n 1p "$tmp/out")" = "hq bench --gemm: cpu (the BLAS libhqcore uses), D f32, median of 1 samples of 1 call" ] || { cat "$tmp/out"; fail "bench --gemm: the CPU by default"; }; ok
expect 0 bench --help; grep -q "^hq bench --gemm \[--device cpu|cuda\[:N\]\] \.\.\.: GEMM throughput instead" "$tmp/out" || fail "bench --help: --gemm"; ok
# bench --gemm --format / --recipe --role: the user's rows replace hq's quantized default ones,
# each against the direct sgemm
expect 0 bench --gemm --shape 32x32x32 --iters 1 --format 'nvfp4 rht=true' --format fp8_block --recipe "$conf/recipe.ini" --role linear:input:fc1 --json
jsonrows < "$tmp/out" > "$tmp/rows"
sed -n 's/^{"shape":\[\([0-9,]*\)\],"kind":"\([^"]*\)","path":"\([^"]*\)".*/\1 \2 \3/p' "$tmp/rows" > "$tmp/got"
printf '%s\n' "32,32,32 sgemm (direct) direct" "32,32,32 hq f32 tensors cpu" "32,32,32 hq nvfp4 rht=true cpu" \
  "32,32,32 hq fp8_block cpu" "32,32,32 hq $conf/recipe.ini linear:input:fc1 cpu" > "$tmp/want"
diff "$tmp/want" "$tmp/got" || { cat "$tmp/out"; fail "bench --gemm --format --recipe: the rows"; }; ok
usage_error "hq bench --gemm: --recipe and --role go together" bench --gemm --role linear:input:x
# --path chooses the path of the user's rows: emulated forces the plain emulated one, and says so
expect 0 bench --gemm --shape 32x32x32 --iters 1 --format mxfp8 --path emulated
grep -q "^ *hq mxfp8 .*\[the caller forced the emulated path\]" "$tmp/out" || { cat "$tmp/out"; fail "bench --gemm --path emulated"; }; ok
usage_error "hq bench --gemm: --path 'fuse' is not auto, fused, unfused or emulated" bench --gemm --format mxfp8 --path fuse
usage_error "hq bench --gemm: --path chooses the path of --format and --recipe rows: give one" bench --gemm --path unfused
usage_error "hq bench --gemm: --d 'f16' is not bf16 or f32" bench --gemm --d f16
usage_error "hq bench --gemm: --d f32 chooses a GPU's D: the CPU's D is always f32" bench --gemm --d f32
usage_error "hq bench --gemm: --trainer times the trainer's GEMMs with their own D (f32): no --d" bench --gemm --trainer --d bf16
usage_error "hq bench --gemm: --format 'nvfp4 rht' is not 'PLUGIN[ key=value...]'" bench --gemm --format 'nvfp4 rht'
failure "hq bench --gemm: $tmp/none.ini: cannot open: No such file or directory" bench --gemm --shape 32x32x32 --recipe "$tmp/none.ini" --role a:b:c
# quantize lists each direction's buffers: name, dtype, shape, bytes, and whether a columnwise
# buffer is the rowwise one (per-tensor FP8's shared scale)
$hq quantize --recipe "$conf/examples/fp8_current.ini" --role linear:weight:w --random 64x32 --json > "$tmp/q.json" || fail "quantize --json"
grep -q '"buffers":\[{"name":"data","dtype":"e4m3","shape":\[64,32\],"bytes":2048,"shared_with_rowwise":false}' "$tmp/q.json" || { cat "$tmp/q.json"; fail "quantize --json rowwise buffers"; }; ok
grep -q '{"name":"columnwise_data","dtype":"e4m3","shape":\[32,64\],"bytes":2048,"shared_with_rowwise":false},{"name":"scale_inv","dtype":"f32","shape":\[1\],"bytes":4,"shared_with_rowwise":true}' "$tmp/q.json" || fail "quantize --json shared buffer"; ok
$hq quantize --recipe "$conf/examples/fp8_current.ini" --role linear:weight:w --random 64x32 | grep -q 'scale_inv .*(the rowwise buffer)' || fail "quantize text buffers"; ok
# every command takes --plugin-dir (bench too): an empty directory changes nothing
expect 0 bench --shape 32x32 --iters 1 --format fp8_tensor --json; jsonrows < "$tmp/out" > "$tmp/a"
expect 0 bench --plugin-dir "$tmp" --shape 32x32 --iters 1 --format fp8_tensor --json; jsonrows < "$tmp/out" > "$tmp/b"
cmp -s "$tmp/a" "$tmp/b" || fail "bench --plugin-dir"; ok
# quantize --output: each direction's dequantized tensor as .npy (f32, [rows, cols], C order)
$hq quantize --recipe "$conf/examples/fp8_current.ini" --role linear:weight:w --random 48x32 --output "$tmp/deq.npy" > "$tmp/out" || fail "quantize --output"
grep -q "dequantized -> $tmp/deq.columnwise.npy (f32, 48x32)" "$tmp/out" || { cat "$tmp/out"; fail "quantize --output text"; }; ok
for f in deq.npy deq.columnwise.npy; do
  [ "$(wc -c < "$tmp/$f")" -eq $((128 + 48 * 32 * 4)) ] || fail "quantize --output: size of $f"
  printf '\223NUMPY\001\000\166\000' | cmp -s - "$tmp/$f" -n 10 || fail "quantize --output: .npy magic/version/header length of $f"
  head -c 128 "$tmp/$f" | tail -c 118 | grep -q "^{'descr': '<f4', 'fortran_order': False, 'shape': (48, 32), } *\$" || fail "quantize --output: .npy header of $f"; ok
done
if python3 -c 'import numpy' 2>/dev/null; then
  python3 -c "
import numpy as np, sys
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert a.dtype == np.float32 and a.shape == (48, 32) and b.shape == (48, 32), (a.dtype, a.shape)
assert np.isfinite(a).all() and 0.5 < np.abs(a).mean() < 1.5
" "$tmp/deq.npy" "$tmp/deq.columnwise.npy" || fail "numpy cannot read quantize --output"; ok
fi
# hq reads what it wrote: through identity (f32 kept) the file comes back byte for byte
printf '[role *:*:*]\nrowwise = identity\ncolumnwise = identity\n' > "$tmp/id.ini"
$hq quantize --recipe "$tmp/id.ini" --role a:b:c --input "$tmp/deq.npy" --output "$tmp/rt" --json > "$tmp/out" || fail "quantize --input of an --output"
cmp -s "$tmp/deq.npy" "$tmp/rt.npy" && cmp -s "$tmp/deq.npy" "$tmp/rt.columnwise.npy" || fail "identity round trip of a .npy"; ok
grep -q "\"output\":\"$tmp/rt.columnwise.npy\"" "$tmp/out" || fail "quantize --json output path"; ok
$hq quantize --recipe "$tmp/id.ini" --role a:b:c --random 4x4 --output "$tmp/no/such/dir/x.npy" >/dev/null 2>"$tmp/err"; [ $? -eq 1 ] || fail "quantize --output to a missing directory exit"
grep -q "no/such/dir/x.npy: cannot create" "$tmp/err" || fail "quantize --output error message"; ok
# quantize --save: the quantized tensor itself as a safetensors checkpoint
mx4x="--recipe $conf/examples/mxfp4.ini --role linear:weight:fc1"
mx4="$mx4x --random 64x64"
expect 0 quantize $mx4 --save "$tmp/q.safetensors" --output "$tmp/q"
grep -qxF "saved as 'fc1' in $tmp/q.safetensors (safetensors)" "$tmp/out" || { cat "$tmp/out"; fail "quantize --save text"; }; ok
expect 0 quantize $mx4 --save "$tmp/q2.safetensors" --name layers.0.w --json
grep -qF "\"saved\":{\"path\":\"$tmp/q2.safetensors\",\"name\":\"layers.0.w\"}" "$tmp/out" || fail "quantize --save --json"; ok
usage_error "hq quantize: --save needs a file name" quantize $qr --save=
usage_error "hq quantize: --name names the tensor in --save's file: give --save too" quantize $qr --name x
# the checkpoint writer's refusals: a name it cannot store, a directory that is not there; no file
expect 1 quantize $mx4 --save "$tmp/bad.safetensors" --name /x
grep -q "^hq quantize: --save $tmp/bad.safetensors: .*'/x'" "$tmp/err" || { cat "$tmp/err"; fail "quantize --save bad name"; }
[ ! -e "$tmp/bad.safetensors" ] || fail "quantize --save wrote a file it refused"; ok
expect 1 quantize $mx4 --save "$tmp/no/such/dir/q.safetensors"
grep -q "no/such/dir/q.safetensors" "$tmp/err" || { cat "$tmp/err"; fail "quantize --save to a missing directory"; }; ok
# the file's entries and metadata, and its codes decoded by hand from docs/formats.md (E2M1
# nibbles, low nibble first, times 2^(E8M0 - 127); one scale per 32 along the row, or per 32
# down the column for the columnwise copy, also stored [M, K]) give --output's values bit for bit
if python3 -c 'import numpy' 2>/dev/null; then
  python3 -c "
import json, struct, sys, numpy as np
d = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', d[:8])[0]
h = json.loads(d[8:8 + n])
meta = json.loads(h['__metadata__']['fc1/hq'])
assert meta['formats']['rowwise']['plugin'] == 'mxfp4' and meta['rows'] == 64, meta
def buf(name, shape):
    e = h['fc1/' + name]
    assert e['dtype'] == 'U8' and e['shape'] == list(shape), (name, e)
    a, b = e['data_offsets']
    return np.frombuffer(d[8 + n + a:8 + n + b], np.uint8).reshape(shape)
lut = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
def codes(b):  # [r, c/2] bytes -> [r, c] codes
    return np.stack([b & 15, b >> 4], axis=-1).reshape(b.shape[0], -1)
def pow2(s):
    return np.ldexp(np.float32(1), s.astype(np.int32) - 127).astype(np.float32)
row = lut[codes(buf('data', (64, 32)))] * np.repeat(pow2(buf('scale_inv', (64, 2))), 32, axis=1)
col = lut[codes(buf('columnwise_data', (64, 32)))] * \\
    np.repeat(pow2(buf('columnwise_scale_inv', (2, 64))), 32, axis=0)
for got, f in ((row, sys.argv[2]), (col, sys.argv[3])):
    want = np.load(f)
    assert want.shape == got.shape and np.array_equal(want.view(np.uint32), got.view(np.uint32)), f
" "$tmp/q.safetensors" "$tmp/q.npy" "$tmp/q.columnwise.npy" || fail "quantize --save: the file's codes"; ok
fi
# quantize --input FILE.safetensors --tensor NAME: an entry of another tool's file (no hq
# metadata, no checksums; here an F16 stack [2, 32, 64], flattened to 64 x 64, and an I64 entry)
if command -v python3 >/dev/null 2>&1; then
  python3 -c "
import json, struct, sys
vals = [((i * 37) % 101 - 50) / 16.0 for i in range(2 * 32 * 64)]
stack = struct.pack('<%de' % len(vals), *vals)
ids = struct.pack('<4q', 1, 2, 3, 4)
h = json.dumps({'__metadata__': {'format': 'pt', 'note': 'two\\nlines'},
                'stack': {'dtype': 'F16', 'shape': [2, 32, 64], 'data_offsets': [0, len(stack)]},
                'ids': {'dtype': 'I64', 'shape': [4], 'data_offsets': [len(stack), len(stack) + 32]}})
h += ' ' * (-len(h) % 8)
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(h)) + h.encode() + stack + ids)
" "$tmp/m.safetensors" || fail "writing a safetensors file"
  expect 0 quantize --recipe "$tmp/id.ini" --role a:b:c --input "$tmp/m.safetensors" --tensor stack --output "$tmp/st"
  grep -q "shape 64x64 f16 on cpu" "$tmp/out" || { cat "$tmp/out"; fail "quantize --tensor: shape and dtype"; }; ok
  failure "hq quantize: $tmp/m.safetensors is a safetensors file: give --tensor NAME, one of its entries: 'stack' [2, 32, 64] F16, 'ids' [4] I64" quantize $mx4x --input "$tmp/m.safetensors"
  failure "hq quantize: $tmp/m.safetensors: entry 'ids' holds I64 elements; hq quantize takes F32, F16 or BF16" quantize $mx4x --input "$tmp/m.safetensors" --tensor ids
  expect 1 quantize $mx4x --input "$tmp/m.safetensors" --tensor nope
  grep -qF "'nope': no such entry (the file holds 'stack' [2, 32, 64] F16, 'ids' [4] I64)" "$tmp/err" || { cat "$tmp/err"; fail "quantize --tensor of no entry"; }; ok
  # --all: every tensor of a model file, each with its own role (the entry's name), the recipe's
  # globs choosing the formats (embed.* identity BF16, the rest MXFP4); 1-D and I64 skipped
  python3 -c "
import json, struct, sys
ents, data = {}, b''
def add(name, shape, code, vals):
    global data
    raw = struct.pack('<%d%s' % (len(vals), code), *vals)
    ents[name] = {'dtype': {'e': 'F16', 'f': 'F32', 'q': 'I64'}[code], 'shape': shape,
                  'data_offsets': [len(data), len(data) + len(raw)]}
    data += raw
f = lambda n, s: [((i * s) % 97 - 48) / 8.0 for i in range(n)]
add('embed.weight', [96, 64], 'e', f(96 * 64, 7))
add('layers.0.up.weight', [128, 64], 'f', f(128 * 64, 13))
add('layers.0.norm.weight', [64], 'f', [1.0] * 64)
add('layers.0.down.weight', [64, 128], 'f', f(64 * 128, 29))
add('ids', [4], 'q', [1, 2, 3, 4])
h = json.dumps({'__metadata__': {'format': 'pt'}, **ents})
h += ' ' * (-len(h) % 8)
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(h)) + h.encode() + data)
" "$tmp/model.safetensors" || fail "writing a model file"
  printf '[format mx]\nplugin = mxfp4\n[format hp]\nplugin = identity\ndtype = bf16\n[role linear:weight:*]\nrowwise = mx\ncolumnwise = mx\n[role linear:weight:embed.*]\nrowwise = hp\ncolumnwise = hp\n' > "$tmp/conv.ini"
  expect 0 quantize --recipe "$tmp/conv.ini" --role 'linear:weight:*' --input "$tmp/model.safetensors" --all --save "$tmp/model-mx.safetensors"
  grep -qE '^embed.weight +96x64 +rowwise +hp +identity +16.000 ' "$tmp/out" &&
    grep -qE '^layers.0.up.weight +128x64 +rowwise +mx +mxfp4 +4.250 ' "$tmp/out" &&
    grep -qE '^ +columnwise +mx +mxfp4 +4.250 ' "$tmp/out" &&
    grep -qxF "3 tensors quantized (77824 bytes -> 29696, both directions), 0 failed, 2 skipped (1-D, or not F32 / F16 / BF16); saved in $tmp/model-mx.safetensors" "$tmp/out" || { cat "$tmp/out"; fail "quantize --all: the table"; }; ok
  expect 0 info --checkpoint "$tmp/model-mx.safetensors"
  grep -qF "    layers.0.down.weight: [64, 128] f32; rowwise mx (mxfp4: " "$tmp/out" && grep -qF "    embed.weight: [96, 64] f16; rowwise hp (identity: dtype=bf16)" "$tmp/out" || { cat "$tmp/out"; fail "quantize --all --save: the file"; }; ok
  expect 0 quantize --recipe "$tmp/conv.ini" --role 'linear:weight:*' --input "$tmp/model.safetensors" --all --json
  grep -qF '{"name":"ids","skipped":"not F32, F16 or BF16"}' "$tmp/out" && grep -qF '"quantized":3,"failed":0}' "$tmp/out" || fail "quantize --all --json"; ok
  # a tensor the format refuses (40 rows for MXFP4's 32-row blocks): its line says why, the others
  # are still reported, exit 1, and --save writes nothing
  python3 -c "
import json, struct, sys
vals = [((i * 11) % 97 - 48) / 8.0 for i in range(40 * 64)]
raw = struct.pack('<%df' % len(vals), *vals)
h = json.dumps({'a.weight': {'dtype': 'F32', 'shape': [40, 64], 'data_offsets': [0, len(raw)]},
                'b.weight': {'dtype': 'F32', 'shape': [32, 64], 'data_offsets': [len(raw), len(raw) + 32 * 64 * 4]}})
h += ' ' * (-len(h) % 8)
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(h)) + h.encode() + raw + raw[:32 * 64 * 4])
" "$tmp/odd.safetensors" || fail "writing a model file"
  expect 1 quantize --recipe "$tmp/conv.ini" --role 'linear:weight:*' --input "$tmp/odd.safetensors" --all --save "$tmp/odd-mx.safetensors"
  grep -qE "^a.weight +40x64 +role linear:weight:a.weight, rowwise format 'mx' \(plugin mxfp4\), shape \[40, 64\]: mxfp4: rows = 40 is not a multiple of 32$" "$tmp/out" &&
    grep -qE '^b.weight +32x64 +rowwise +mx ' "$tmp/out" || { cat "$tmp/out"; fail "quantize --all: a refused tensor"; }
  [ ! -e "$tmp/odd-mx.safetensors" ] && grep -qxF "hq quantize: --save: $tmp/odd-mx.safetensors not written (1 tensor failed)" "$tmp/err" || { cat "$tmp/err"; fail "quantize --all: no file after a failure"; }; ok
  usage_error "hq quantize: --all: give --role MODULE:TENSOR:* (each entry's name takes the *), not linear:weight:w" quantize --recipe "$tmp/conv.ini" --role linear:weight:w --input "$tmp/model.safetensors" --all
  usage_error "hq quantize: --all quantizes every entry of a safetensors --input (no --shape, --tensor, --output or --name)" quantize --recipe "$tmp/conv.ini" --role 'linear:weight:*' --input "$tmp/model.safetensors" --all --tensor x
  # the error names the missing entry, not the 9-dimensional one the listing could not describe
  python3 -c "
import json, struct, sys
h = json.dumps({'a': {'dtype': 'F32', 'shape': [1] * 9, 'data_offsets': [0, 4]}})
h += ' ' * (-len(h) % 8)
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(h)) + h.encode() + struct.pack('<f', 1))
" "$tmp/nine.safetensors" || fail "writing a safetensors file"
  expect 1 quantize $mx4x --input "$tmp/nine.safetensors" --tensor nope
  grep -qF "'nope': no such entry" "$tmp/err" || { cat "$tmp/err"; fail "quantize --tensor: the error of a missing entry"; }; ok
  # hq's own checkpoint (verified: it has checksums); a quantized buffer is no high-precision input
  failure "hq quantize: $tmp/q.safetensors: entry 'fc1/data' holds U8 elements; hq quantize takes F32, F16 or BF16" quantize $mx4x --input "$tmp/q.safetensors" --tensor fc1/data
  if python3 -c 'import numpy' 2>/dev/null; then
    python3 -c "
import numpy as np, sys
want = np.array([((i * 37) % 101 - 50) / 16.0 for i in range(2 * 32 * 64)], np.float16)
got = np.load(sys.argv[1])
assert got.shape == (64, 64) and np.array_equal(got.ravel(), want.astype(np.float32)), got.shape
" "$tmp/st.npy" || fail "quantize --tensor: the values (identity, f32)"; ok
  fi
fi
usage_error "hq quantize: --tensor names an entry of a safetensors --input (whose shape the file gives: no --shape)" \
  quantize --recipe "$conf/recipe.ini" --role a:b:c --input x.safetensors --tensor x --shape 4x4
# info --checkpoint: what a checkpoint holds, every entry checked against its checksum
expect 0 info --checkpoint "$tmp/q.safetensors"
grep -qE '^  fc1/columnwise_scale_inv +U8 +\[2, 64\] +128$' "$tmp/out" || { cat "$tmp/out"; fail "info --checkpoint: an entry"; }
grep -qxF "    fc1: [64, 64] f32; rowwise mx (mxfp4: scale=floor, stochastic_rounding=false, seed=0, raw_copy=none); columnwise mx (mxfp4: scale=floor, stochastic_rounding=false, seed=0, raw_copy=none)" "$tmp/out" || { cat "$tmp/out"; fail "info --checkpoint: the quantized tensors"; }
grep -qxF "  checksums: every entry verified (4352 bytes read)" "$tmp/out" || fail "info --checkpoint: verified"; ok
expect 0 info --checkpoint "$tmp/q.safetensors" --json
grep -qF '"checksums":"verified"' "$tmp/out" && grep -qF '"quantized":[{"name":"fc1","metadata":"{' "$tmp/out" || fail "info --checkpoint --json"; ok
# a flipped bit in the last entry's last byte: listed, then exit 1 naming that entry
cp "$tmp/q.safetensors" "$tmp/flip.safetensors"
last=$(($(wc -c < "$tmp/flip.safetensors") - 1))
b=$(od -An -tu1 -j "$last" -N1 "$tmp/flip.safetensors" | tr -d ' ')
printf "$(printf '\\%03o' $((b ^ 1)))" | dd of="$tmp/flip.safetensors" bs=1 seek="$last" conv=notrunc 2>/dev/null
expect 1 info --checkpoint "$tmp/flip.safetensors"
grep -q "^hq info: checkpoint $tmp/flip.safetensors: entry 'fc1/columnwise_scale_inv' is corrupt" "$tmp/err" || { cat "$tmp/err"; fail "info --checkpoint of a flipped bit"; }; ok
if [ -f "$tmp/m.safetensors" ]; then
  expect 0 info --checkpoint "$tmp/m.safetensors"
  grep -qE "^  stack +F16 +\[2, 32, 64\] +8192$" "$tmp/out" && grep -qxF "  metadata format = pt" "$tmp/out" && grep -qxF '  metadata note = two\nlines' "$tmp/out" &&
    grep -qxF "  checksums: none (a file another tool wrote): not verified" "$tmp/out" || { cat "$tmp/out"; fail "info --checkpoint of a foreign file"; }; ok
fi
# info lists each format's buffers per direction for a sample shape, as quantize --json does
$hq info --json --shape 64x32 > "$tmp/info64.json" || fail "info --shape"
grep -q '"sample_shape":\[64,32\]' "$tmp/info64.json" || fail "info --json sample_shape"; ok
grep -q '"directions":\[{"direction":"rowwise","bytes":2056,"buffers":\[{"name":"data","dtype":"e4m3","shape":\[64,32\],"bytes":2048,"shared_with_rowwise":false},{"name":"scale_inv","dtype":"f32","shape":\[1\],"bytes":4,"shared_with_rowwise":false}' "$tmp/info64.json" || fail "info --json fp8_tensor rowwise buffers"; ok
grep -q '{"direction":"columnwise","bytes":2048,"buffers":\[{"name":"columnwise_data","dtype":"e4m3","shape":\[32,64\],"bytes":2048,"shared_with_rowwise":false},{"name":"scale_inv","dtype":"f32","shape":\[1\],"bytes":4,"shared_with_rowwise":true}' "$tmp/info64.json" || fail "info --json fp8_tensor columnwise buffers"; ok
grep -q '"directions":\[{"direction":"rowwise","bytes":8192,"buffers":\[{"name":"data","dtype":"f32","shape":\[64,32\],"bytes":8192,"shared_with_rowwise":false}\]},{"direction":"columnwise","bytes":0,"buffers":\[{"name":"data","dtype":"f32","shape":\[64,32\],"bytes":8192,"shared_with_rowwise":true}\]}\]' "$tmp/info64.json" || fail "info --json identity buffers (one, shared)"; ok
$hq info > "$tmp/info.txt" || fail "info"
grep -q '^    columnwise buffers of a 256x256 tensor (65536 bytes):$' "$tmp/info.txt" || fail "info text buffers heading"; ok
grep -q '^      scale_inv  *f32  *1  *4  (the rowwise buffer)$' "$tmp/info.txt" || fail "info text shared buffer"; ok
$hq info --shape 10x7 | grep -q "buffers of a 10x7 tensor: none (.*mxfp8: rows = 10 is not a multiple of 32)" || fail "info: a shape a format refuses"; ok
# man pages, made at build time from each command's --help: NAME, and every option the help names
man=$(dirname "$hq")/../man
for c in "" info recipe quantize bench train; do
  page=$man/hq${c:+-$c}.1
  [ -f "$page" ] || fail "man page $page was not built"
  sed -n '/^\.SH NAME$/{n;p;q;}' "$page" | grep -q "^hq${c:+\\\\-$c} \\\\- [a-z]" || fail "$page: NAME section"
  for o in $($hq $c --help | grep -o -- '--[a-z][a-z-]*' | sort -u); do
    grep -qF -- "$(printf '%s' "$o" | sed 's/-/\\-/g')" "$page" || fail "$page lacks $o"
  done; ok
done
grep -q '^\\fB\\-\\-output FILE.npy\\fR$' "$man/hq-quantize.1" || fail "hq-quantize.1: --output entry"; ok
# a delayed-scaling recipe quantizes through the CLI (its quantizer bound to the recipe's state)
$hq quantize --recipe "$conf/examples/fp8_delayed.ini" --role linear:weight:fc1 --random 64x64 > "$tmp/out" || { cat "$tmp/out"; fail "quantize with delayed scaling"; }; ok
if command -v groff > /dev/null 2>&1; then
  groff -man -Tascii -P-c -P-b -P-u "$man/hq-quantize.1" 2>&1 | grep -q '^ *--output FILE.npy$' || fail "groff renders hq-quantize.1"; ok
fi
# docs/plugin-guide.md section 11 shows examples/format/int8_row.c as it is
src=${HQ_TEST_SRCDIR:?}/..
awk '/^## 11\./{s=1} s&&/^```c$/{f=1;next} f&&/^```$/{exit} f' "$src/docs/plugin-guide.md" | diff - "$src/examples/format/int8_row.c" > "$tmp/d" || { cat "$tmp/d"; fail "docs/plugin-guide.md section 11 differs from examples/format/int8_row.c"; }; ok
# a hostile .npy whose shape product overflows is refused, naming the shape (never another shape)
printf '\223NUMPY\001\000\166\000' > "$tmp/huge.npy"
printf "%-117s\n" "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }" >> "$tmp/huge.npy"
head -c 64 /dev/zero >> "$tmp/huge.npy"
printf '[role *:*:*]\nrowwise = identity\n' > "$tmp/idr.ini"
$hq quantize --recipe "$tmp/idr.ini" --role a:b:c --input "$tmp/huge.npy" > /dev/null 2> "$tmp/err"; [ $? -eq 1 ] || fail "overflowing .npy shape exit status"
grep -q "shape (4294967296, 4294967296, 16) has more than 2^40 elements" "$tmp/err" || { cat "$tmp/err"; fail "overflowing .npy shape message"; }; ok
# non-finite input: reported (text and JSON), refused with --finite-only
python3 - "$tmp/nan.npy" <<'PY' 2>/dev/null || printf '\223NUMPY\001\000\166\000%-117s\n' "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 32), }" > "$tmp/nan.npy"
import struct, sys
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 32), }"
hdr = hdr + ' ' * (117 - len(hdr)) + '\n'
vals = [0.5] * 64
vals[37] = float('nan'); vals[40] = float('inf')
open(sys.argv[1], 'wb').write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(hdr)) + hdr.encode() + struct.pack('<64f', *vals))
PY
if [ "$(wc -c < "$tmp/nan.npy")" -eq $((128 + 256)) ]; then
  $hq quantize --recipe "$tmp/idr.ini" --role a:b:c --input "$tmp/nan.npy" > "$tmp/out" || fail "quantize of NaN input"
  grep -q "input holds 2 NaN/Inf values, the first at \[1, 5\]" "$tmp/out" || { cat "$tmp/out"; fail "quantize does not report NaN input"; }; ok
  $hq quantize --recipe "$tmp/idr.ini" --role a:b:c --input "$tmp/nan.npy" --json | grep -q '"nonfinite_inputs":2' || fail "quantize --json nonfinite_inputs"; ok
  $hq quantize --recipe "$tmp/idr.ini" --role a:b:c --input "$tmp/nan.npy" --finite-only > /dev/null 2> "$tmp/err"; [ $? -eq 1 ] || fail "--finite-only exit status"
  grep -q "2 NaN/Inf values, the first at \[1, 5\]" "$tmp/err" || { cat "$tmp/err"; fail "--finite-only message"; }; ok
fi
# docs/recipes.md lists every shipped example recipe, and nothing else
ls "$conf/examples" | grep '\.ini$' | sort > "$tmp/want"
sed -n 's/^| `\([a-z0-9_]*\.ini\)` | .*/\1/p' "${HQ_TEST_SRCDIR:?}/../docs/recipes.md" | sort > "$tmp/got"
diff "$tmp/want" "$tmp/got" || fail "docs/recipes.md: the list of conf/examples"; ok
# hq info says where the shipped recipes are (HQ_CONF_DIR here; $(datadir)/hq installed)
expect 0 info; grep -qx "shipped recipes: $conf (recipe.ini, the default; examples/\*.ini)" "$tmp/out" || { cat "$tmp/out"; fail "info: the recipe directory"; }
grep -qF "\"recipe_dir\":\"$conf\"" "$tmp/info.json" || fail "info --json: recipe_dir"; ok
# the element cap named as such; a directory given to --input; an all-NaN input: its statistics
# are undefined (never relative RMS 0 / SQNR inf), with the NaN count
usage_error "hq quantize: --random '100000000x100000000' has more than 2^40 (1099511627776) elements, the cap on a tensor's size" \
  quantize --recipe "$tmp/idr.ini" --role a:b:c --random 100000000x100000000
failure "hq quantize: $tmp: is a directory, not a .npy or raw file" quantize --recipe "$tmp/idr.ini" --role a:b:c --input "$tmp"
i=0; : > "$tmp/allnan.f32"; while [ $i -lt 64 ]; do printf '\000\000\300\177' >> "$tmp/allnan.f32"; i=$((i + 1)); done
expect 0 quantize --recipe "$tmp/idr.ini" --role a:b:c --input "$tmp/allnan.f32" --shape 2x32 --dtype f32
[ "$(sed -n 5p "$tmp/out")" = "           (statistics undefined: all 64 elements are non-finite, 64 of them NaN in the input)" ] ||
  { cat "$tmp/out"; fail "quantize: all-NaN statistics"; }
sed -n 4p "$tmp/out" | grep -q "^rowwise    identity     identity             256   32.000          nan          nan       nan$" ||
  { cat "$tmp/out"; fail "quantize: all-NaN row"; }; ok
expect 0 quantize --recipe "$tmp/idr.ini" --role a:b:c --input "$tmp/allnan.f32" --shape 2x32 --dtype f32 --json
grep -q '"rel_rms_error":null,"max_abs_error":null,"sqnr_db":null,"nonfinite":64,"nan_inputs":64,"statistics_defined":false' "$tmp/out" ||
  { cat "$tmp/out"; fail "quantize --json: all-NaN statistics"; }; ok
# options: decimal integers, conflicting options, bench exit status, messages
# integers are decimal: a leading 0 is not octal, 0x is not hex, no blank or sign before the digits
expect 0 quantize $q --random 64x32 --seed 7 --json; cp "$tmp/out" "$tmp/a"
expect 0 quantize $q --random 64x32 --seed 07 --json
cmp -s "$tmp/a" "$tmp/out" || fail "quantize --seed 07 is not 7"; ok
expect 0 quantize $q --random 64x32 --seed 010 --json; cp "$tmp/out" "$tmp/a"
expect 0 quantize $q --random 64x32 --seed 10 --json
cmp -s "$tmp/a" "$tmp/out" || fail "quantize --seed 010 is not 10"; ok
expect 0 quantize $q --random 64x32 --seed 09 --json; cp "$tmp/out" "$tmp/a"
expect 0 quantize $q --random 64x32 --seed 9 --json
cmp -s "$tmp/a" "$tmp/out" || fail "quantize --seed 09 is not 9"; ok
usage_error "hq quantize: --seed '0x7' is not an integer" quantize $q --random 64x32 --seed 0x7
usage_error "hq train: --steps '0x10' is not an integer in [1, 10000000]" train --seed 09 --steps 0x10
usage_error "hq bench: --batch ' 2' is not an integer in [1, 1000]" bench --batch ' 2'
usage_error "hq bench: --iters '+2' is not an integer in [1, 100000]" bench --iters +2
expect 0 bench --gemm --shape 32x32x32 --iters 010 --json
grep -q '"iters":10,' "$tmp/out" || { cat "$tmp/out"; fail "bench --gemm --iters 010 is not 10"; }; ok
# bench: a row that fails makes the exit status 1 (its line says failed); a format without a path
# on the device stays skipped (exit 0)
failure "hq bench: 3 timings failed (see above)" bench --iters 1 --format mxfp8 --shape 33x64
grep -q "^mxfp8  *both       failed: .*rows = 33 is not a multiple of 32$" "$tmp/out" || { cat "$tmp/out"; fail "bench: the failed row"; }; ok
failure "hq bench: 3 timings failed (see above)" bench --iters 1 --format mxfp8 --shape 33x64 --json
grep -q '{"format":"mxfp8","dirs":"columnwise","error":"[^"]*rows = 33 is not a multiple of 32"}' "$tmp/out" || { cat "$tmp/out"; fail "bench --json: the failed row"; }; ok
failure "hq bench --gemm: 1 row failed (see the table)" bench --gemm --iters 1 --shape 64x64x64 --format nosuch
grep -q "^ *hq nosuch  *-  *-  *-  (failed: nosuch: bench:2: plugin 'nosuch' was not found" "$tmp/out" || { cat "$tmp/out"; fail "bench --gemm: the failed row"; }; ok
expect 1 bench --gemm --iters 1 --shape 64x64x64 --format nosuch --json
grep -q '"kind":"hq nosuch","error":"nosuch: bench:2: plugin' "$tmp/out" || { cat "$tmp/out"; fail "bench --gemm --json: the failed row"; }; ok
if [ -n "${HQ_MPIRUN:-}" ] && command -v "$HQ_MPIRUN" > /dev/null 2>&1 && [ -x "${HQ_TEST_DIST_MPI:-}" ]; then
  # shellcheck disable=SC2086
  (. "${HQ_TEST_SRCDIR:?}/mpirun_env.sh"; timeout 120 "$HQ_MPIRUN" $flags -np 1 "$hq" bench --dist \
    --format nosuch --shape 64x64 --iters 1 --warmup 0 > "$tmp/out" 2> "$tmp/err")
  [ $? -eq 1 ] || { cat "$tmp/out" "$tmp/err"; fail "bench --dist --format nosuch: exit status"; }
  grep -q "^nosuch  *failed: bench:2: plugin 'nosuch' was not found" "$tmp/out" || { cat "$tmp/out"; fail "bench --dist: the failed row"; }
  grep -q "^hq bench --dist: 1 format failed (see the table)$" "$tmp/err" || { cat "$tmp/err"; fail "bench --dist: the failure"; }; ok
fi
# an option that does not apply with the others is refused naming both (a raw --input keeps
# --shape and --dtype; --seed also seeds stochastic rounding, so it applies to --input too)
qi="quantize --recipe $tmp/idr.ini --role a:b:c"
expect 0 $qi --random 64x64 --output "$tmp/a64" --save "$tmp/a64.safetensors"
usage_error "hq quantize: --shape does not apply to --input $tmp/a64.npy: a .npy file gives its own shape (64x64)" $qi --input "$tmp/a64.npy" --shape 32x128
usage_error "hq quantize: --dtype does not apply to --input $tmp/a64.npy: a .npy file gives its own dtype (f32)" $qi --input "$tmp/a64.npy" --dtype bf16
usage_error "hq quantize: --scale scales --random's values: it does not apply to --input" $qi --input "$tmp/a64.npy" --seed 5 --scale 100
expect 0 $qi --input "$tmp/a64.npy" --seed 5
usage_error "hq quantize: --shape gives a raw --input file's shape: it does not apply to --random, whose RxC is the shape" $qi --random 64x64 --shape 32x32
usage_error "hq quantize: --tensor names an entry of a safetensors --input: it does not apply to --random" $qi --random 64x64 --tensor foo
usage_error "hq quantize: --all quantizes every entry of a safetensors --input: it does not apply to --random" $qi --random 64x64 --all
usage_error "hq quantize: --dtype does not apply to a safetensors --input: the file gives each entry's dtype" $qi --input "$tmp/a64.safetensors" --tensor c/data --dtype bf16
usage_error "hq quantize: --shape does not apply to a safetensors --input: the file gives each entry's shape" $qi --input "$tmp/a64.safetensors" --shape 4x4
head -c 512 "$tmp/a64.npy" | tail -c 384 > "$tmp/raw96.f32"
expect 0 $qi --input "$tmp/raw96.f32" --shape 4x24 --dtype f32
grep -q "shape 4x24 f32 on cpu" "$tmp/out" || { cat "$tmp/out"; fail "quantize: a raw --input's --shape and --dtype"; }; ok
expect 0 $qi --input "$tmp/raw96.f32" --shape 8x24 --dtype bf16
grep -q "shape 8x24 bf16 on cpu" "$tmp/out" || { cat "$tmp/out"; fail "quantize: a raw --input's --dtype bf16"; }; ok
usage_error "hq info: --shape sets the sample tensor of the format listing: it does not apply to --checkpoint" info --checkpoint "$tmp/a64.safetensors" --shape 64x64
# --scale keeps --random's values (|x| < 6 X) finite and X normal in --dtype
usage_error "hq quantize: --scale '1e39' is outside [1.1754944e-38, 5.6713724e+37] for --dtype f32: --random's values (|x| up to 6 X) would overflow to Inf" $qi --random 64x64 --scale 1e39
usage_error "hq quantize: --scale '1e-50' is outside [1.1754944e-38, 5.6713724e+37] for --dtype f32: --random's values (|x| up to 6 X) would be mostly zeros or subnormal numbers" $qi --random 64x64 --scale 1e-50
usage_error "hq quantize: --scale '20000' is outside [6.1035156e-05, 10917.333] for --dtype f16: --random's values (|x| up to 6 X) would overflow to Inf" $qi --random 64x64 --scale 20000 --dtype f16
expect 0 $qi --random 64x64 --scale 5e37 --json
grep -q '"nonfinite_inputs":0,' "$tmp/out" || { cat "$tmp/out"; fail "quantize --scale 5e37: non-finite input"; }; ok
expect 0 $qi --random 64x64 --scale 2e-38
# --role: a [role] pattern's rules (no empty part), and a warning when no section matches it
usage_error "hq quantize: --role '::' has an empty part (use '*' to match anything)" $qi --random 64x64 --role ::
usage_error "hq quantize: --role 'linear::fc1' has an empty part (use '*' to match anything)" $qi --random 64x64 --role linear::fc1
usage_error "hq quantize: --role 'a:b[:c': part 'b[' holds '[': role patterns use only '*' and '?' wildcards" $qi --random 64x64 --role 'a:b[:c'
for r in LINEAR:WEIGHT:FC1 conv:weight:fc1; do
  expect 0 quantize --recipe "$conf/recipe.ini" --role $r --random 64x64
  [ "$(cat "$tmp/err")" = "hq quantize: warning: recipe $conf/recipe.ini: role $r matches no [role] section: both directions stay in high precision (say \`unmatched = identity\` in [recipe] if that is meant)" ] ||
    { cat "$tmp/err"; fail "quantize --role $r: no warning"; }; ok
done
expect 0 quantize --recipe "$conf/recipe.ini" --role linear:weight:fc1 --random 64x64
[ -s "$tmp/err" ] && { cat "$tmp/err"; fail "quantize --role linear:weight:fc1 warned"; }; ok
printf '[recipe]\nunmatched = identity\n[role linear:*:*]\nrowwise = identity\n' > "$tmp/um3.ini"
expect 0 quantize --recipe "$tmp/um3.ini" --role conv:weight:fc1 --random 64x64
[ -s "$tmp/err" ] && { cat "$tmp/err"; fail "quantize warned under unmatched = identity"; }; ok
# messages: a directory given as a file says so
mkdir -p "$tmp/adir"
failure "hq recipe check: $tmp/adir: is a directory, not a recipe file" recipe check "$tmp/adir"
failure "hq quantize: $tmp/adir: is a directory, not a recipe file" quantize --recipe "$tmp/adir" --role a:b:c --random 4x4
failure "hq train: $tmp/adir: is a directory, not a text file" train --data "$tmp/adir" --steps 1
failure "hq train: recipe $tmp/adir: $tmp/adir: is a directory, not a recipe file" train --recipe "$tmp/adir" --steps 1
# a .npy header's shape is read whole or refused as malformed (never a shorter shape)
npyhdr() { # FILE SHAPE: a float32 .npy file of SHAPE's header and 64x64 values
  h="{'descr': '<f4', 'fortran_order': False, 'shape': $2, }"
  { printf '\223NUMPY\001\000\166\000'; printf '%s' "$h"; printf "%$((128 - 10 - ${#h} - 1))s\n" ""; head -c 16384 /dev/zero; } > "$1"
}
for sh in "(64, abc)" "(64 64)" "(64, 64 x)" "(64,, 64)" "[64, 64]" "(-64, 64)"; do
  npyhdr "$tmp/bad.npy" "$sh"
  failure "hq quantize: $tmp/bad.npy: .npy header's shape $sh is malformed (a tuple of decimal integers expected)" $qi --input "$tmp/bad.npy"
done
for sh in "(64, 0)" "()"; do
  npyhdr "$tmp/bad.npy" "$sh"
  failure "hq quantize: $tmp/bad.npy: .npy shape $sh is not 1 to 16 positive dimensions" $qi --input "$tmp/bad.npy"
done
for sh in "(64, 64)" "(64,64,)" "(4096,)" "(64L, 64L)" "( 2 , 32 , 64 )"; do
  npyhdr "$tmp/ok.npy" "$sh"; expect 0 $qi --input "$tmp/ok.npy"; ok
done
# hq recipe names an unknown subcommand
usage_error "hq recipe: 'bogus' is not a subcommand: the one is check (see \`hq recipe --help\`)" recipe bogus
usage_error "hq recipe: 'frobnicate' is not a subcommand: the one is check (see \`hq recipe --help\`)" recipe frobnicate --json
# hq train --data: the word length limit named in the error, with the words it left out
{ printf 'abc\n'; head -c 1001 /dev/zero | tr '\000' 'q'; printf '\n'; } > "$tmp/long.txt"
failure "hq train: $tmp/long.txt: 1 word(s) of 1 to 1000 letters a-z (whitespace-separated, lowercase; 1 longer one left out); at least 2 are needed (one to train on, one held out)" train --data "$tmp/long.txt" --steps 1
# recipe check: a shadowed (dead) [role] section is a warning on stderr naming both FILE:LINEs
printf '[format f8]\nplugin = fp8_tensor\n[role *:*:*]\nrowwise = f8\n[role *:*:*]\nrowwise = identity\n' > "$tmp/dup.ini"
expect 0 recipe check "$tmp/dup.ini"
grep -qx "hq recipe check: warning: $tmp/dup.ini:3: \[role \*:\*:\*\] never applies: \[role \*:\*:\*\] at $tmp/dup.ini:5 wins every role it matches (the same pattern, written later); merge the two sections or delete one" "$tmp/err" ||
  { cat "$tmp/err"; fail "recipe check: no warning for a shadowed section"; }
grep -q "shadowed: \[role \*:\*:\*\] (line 5)" "$tmp/out" && [ "$(tail -n 1 "$tmp/out")" = valid ] || { cat "$tmp/out"; fail "recipe check: the shadowed line and valid"; }; ok
expect 0 recipe check "$conf/recipe.ini"
grep -q "never applies" "$tmp/err" && { cat "$tmp/err"; fail "recipe check: a shadow warning for recipe.ini"; }; ok
# output paths (devices, FIFOs, symlinks, long paths, partial files)
mkdir "$tmp/op"
q64="quantize --recipe $conf/examples/fp8_current.ini --role linear:weight:w --random 64x64"
notreg="not a regular file (%s): hq writes its output only to a regular file or a new one"
# a device or a FIFO given as an output is refused before any work, and stays what it was
mkfifo "$tmp/op/fifo" "$tmp/op/fifo.npy" || fail "mkfifo"
failure "hq quantize: --save $tmp/op/fifo: $(printf "$notreg" "a FIFO")" $q64 --save "$tmp/op/fifo"
[ -s "$tmp/out" ] && fail "quantize --save FIFO: it quantized before refusing"
[ -p "$tmp/op/fifo" ] || fail "quantize --save replaced a FIFO"
failure "hq quantize: --output $tmp/op/fifo.npy: $(printf "$notreg" "a FIFO")" $q64 --output "$tmp/op/fifo"
[ -p "$tmp/op/fifo.npy" ] || fail "quantize --output replaced a FIFO"
failure "hq quantize: --save /dev/null: $(printf "$notreg" "a character device")" $q64 --save /dev/null
[ -c /dev/null ] || fail "quantize --save /dev/null: /dev/null is no longer a character device"
# a symbolic link is followed: the file it names is written, the link stays a link
ln -s target.st "$tmp/op/link.st"; ln -s t.npy "$tmp/op/l.npy"; ln -s fifo "$tmp/op/lf.st"
expect 0 $q64 --save "$tmp/op/link.st" --output "$tmp/op/l"
[ -L "$tmp/op/link.st" ] && [ -L "$tmp/op/l.npy" ] || fail "quantize: a symbolic link output replaced"
expect 0 info --checkpoint "$tmp/op/target.st"
[ "$(wc -c < "$tmp/op/t.npy")" -eq $((128 + 64 * 64 * 4)) ] || fail "quantize --output: the link's target"
failure "hq quantize: --save $tmp/op/lf.st: $(printf "$notreg" "a FIFO, the link's target $tmp/op/fifo")" $q64 --save "$tmp/op/lf.st"
# a failed write (a file size limit, as a full disk) leaves no part of a file, and an old file whole
printf old > "$tmp/op/big.columnwise.npy"
(trap '' XFSZ; ulimit -f 64; $hq $q64 --random 256x256 --output "$tmp/op/big" > "$tmp/out" 2> "$tmp/err"); rc=$?
[ $rc -eq 1 ] && [ "$(tail -n 1 "$tmp/err")" = "hq quantize: --output $tmp/op/big.npy: write error: File too large (nothing written there)" ] ||
  { cat "$tmp/err"; fail "quantize --output past a file size limit: exit status $rc"; }
[ ! -e "$tmp/op/big.npy" ] && [ "$(cat "$tmp/op/big.columnwise.npy")" = old ] || fail "quantize --output: a partial .npy left"
ls "$tmp/op" | grep -q '\.tmp\.' && fail "quantize: a temporary file left in $tmp/op"; ok
# hq train: every file a run saves to is checked before the first step, by the same rule (a
# refusal comes before the data and memory lines: "hq train: memory" on stdout means it trained)
. "${HQ_TEST_SRCDIR:?}/train_corpus.sh"
if train_corpus "$tmp/op/words.txt"; then
  tr1="train --data $tmp/op/words.txt --batch 32 --hidden 64 --layers 1 --eval-every 0 --steps 1 --recipe $conf/examples/fp8_delayed.ini"
  failure "hq train: --checkpoint $tmp/op/fifo: $(printf "$notreg" "a FIFO")" $tr1 --baseline none --checkpoint "$tmp/op/fifo"
  grep -q "^hq train: memory" "$tmp/out" && fail "train --checkpoint FIFO: it trained before refusing"
  [ -p "$tmp/op/fifo" ] || fail "train --checkpoint replaced a FIFO"
  for b in none fp32; do   # one run writes the path, two runs files beside it: refused alike
    failure "hq train: --checkpoint /dev/null: $(printf "$notreg" "a character device")" $tr1 --baseline $b --checkpoint /dev/null
    [ -c /dev/null ] || fail "train --checkpoint /dev/null: /dev/null is no longer a character device"
  done
  ln -s ck-target.st "$tmp/op/ck-link.st"
  expect 0 $tr1 --baseline none --checkpoint "$tmp/op/ck-link.st"
  [ -L "$tmp/op/ck-link.st" ] && [ -s "$tmp/op/ck-target.st" ] || fail "train --checkpoint: a symbolic link replaced"; ok
  # long paths (6 directories of 240 bytes): two runs save two files, never one cut name
  long=$tmp/op; for i in 1 2 3 4 5 6; do long=$long/$(printf '%0240d' 0); done
  mkdir -p "$long" || fail "mkdir of a long path"
  expect 0 $tr1 --checkpoint "$long/ck.safetensors"
  [ -s "$long/ck-fp32.safetensors" ] && [ -s "$long/ck-fp8-delayed-hybrid.safetensors" ] ||
    { ls "$long"; fail "train --checkpoint under a long path: a run's file missing"; }; ok
  failure "hq train: --checkpoint $long/none/ck.safetensors: the directory $long/none: No such file or directory" \
    $tr1 --checkpoint "$long/none/ck.safetensors"
  grep -q "^hq train: memory" "$tmp/out" && fail "train --checkpoint: a long missing directory found after training"
  huge=$long; while [ ${#huge} -lt 4200 ]; do huge=$huge/$(printf '%0240d' 0); done
  expect 1 $tr1 --checkpoint "$huge/ck"
  grep -q "\.\.\.: the path is $((${#huge} + 3)) bytes long, more than the system takes (PATH_MAX" "$tmp/err" && ! grep -q "^hq train: memory" "$tmp/out" ||
    { cat "$tmp/err"; fail "train --checkpoint longer than PATH_MAX"; }; ok
  # a file name with no room for the writer's temporary suffix: refused before the first step
  expect 1 $tr1 --baseline none --checkpoint "$tmp/op/$(printf '%0245d' 0)"
  grep -q "File name too long" "$tmp/err" && ! grep -q "^hq train: memory" "$tmp/out" || { cat "$tmp/err"; fail "train --checkpoint of a long name"; }; ok
  # a long TMPDIR: --verify-resume's directory and gnuplot's messages go there, never to a cut name
  TMPDIR=$long $hq $tr1 --baseline none --steps 2 --verify-resume > "$tmp/out" 2> "$tmp/err" ||
    { cat "$tmp/err"; fail "train --verify-resume with a long TMPDIR"; }; ok
  if command -v gnuplot > /dev/null 2>&1; then
    ln -s plot-target.png "$tmp/op/plot.png"
    TMPDIR=$long $hq $tr1 --plot "$tmp/op/plot.png" > "$tmp/out" 2> "$tmp/err" ||
      { cat "$tmp/err"; fail "train --plot with a long TMPDIR"; }
    [ -L "$tmp/op/plot.png" ] && [ -s "$tmp/op/plot-target.png" ] || fail "train --plot: a symbolic link replaced"; ok
  fi
  ls -a "$tmp/op" "$long" | grep -q '\.tmp\.\|hq-train-probe' && fail "train: a temporary file left"
  # a long HQ_CONF_DIR: the shipped recipes' directory and the default recipe, never cut
  cp "$conf/recipe.ini" "$long/"
  HQ_CONF_DIR=$long $hq info > "$tmp/out" 2> "$tmp/err" || fail "info with a long HQ_CONF_DIR"
  grep -qxF "shipped recipes: $long (recipe.ini, the default; examples/*.ini)" "$tmp/out" ||
    fail "info: a long HQ_CONF_DIR cut"
  HQ_CONF_DIR=$long $hq ${tr1%% --recipe *} --baseline none > "$tmp/out" 2> "$tmp/err" ||
    { cat "$tmp/err"; fail "train: the default recipe in a long HQ_CONF_DIR"; }; ok
fi
echo "PASS: $n checks"
