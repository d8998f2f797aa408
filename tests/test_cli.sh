#!/bin/sh
# test_cli.sh -- the hq command: help, info (text and JSON), recipe check of the shipped and of
# broken recipes (exit status, file:line), quantize (random, .npy, raw, bad input), usage errors.
# Exit 0 pass, 1 fail (automake's protocol).
set -u
hq=${HQ_BIN:?HQ_BIN is set by make check}
conf=${HQ_CONF_DIR:?}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hq_cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
n=0
fail() { echo "FAIL: $*"; exit 1; }
ok() { n=$((n + 1)); }

# help and usage errors
$hq --help | grep -q "recipe check" || fail "hq --help"; ok
for c in info quantize bench; do $hq $c --help | grep -q "usage: hq $c" || fail "hq $c --help"; ok; done
$hq recipe --help | grep -q "usage: hq recipe check" || fail "hq recipe --help"; ok
$hq help quantize | grep -q "usage: hq quantize" || fail "hq help quantize"; ok
$hq frobnicate 2>"$tmp/e"; [ $? -eq 2 ] || fail "unknown command exit status"
grep -q "'frobnicate' is not a command" "$tmp/e" || fail "unknown command message"; ok
$hq info --bogus 2>/dev/null; [ $? -eq 2 ] || fail "unknown option exit status"; ok
$hq --version | grep -q "plugin ABI 2.4" || fail "--version"; ok

# info lists the built-in identity and the stock formats with their options
$hq info --json > "$tmp/info.json" || fail "info --json"
for s in '"name":"identity"' '"name":"fp8_tensor"' '"name":"mxfp8"' '"name":"nvfp4"' '"name":"fp8_block"' \
         '"name":"rht_sign_mask","type":"int","default":"0xD7E8"' '"name":"block","type":"enum","default":"1d"' '"name":"power_2_scales","type":"bool","default":"false"' \
         '"name":"dtype","type":"enum","default":"e4m3"' '"choices":\["e4m3","e5m2"\]' '"abi":{"major":2,"minor":4}'; do
  grep -q "$s" "$tmp/info.json" || fail "info --json lacks $s"; ok
done
$hq info | grep -q "amax_epsilon" || fail "info text lacks options"; ok
# the capability flags by name: nvfp4 and fp8_tensor fold their factor (ABI 2.3), mxfp8 does not
for f in nvfp4 fp8_tensor; do
  grep -q "\"name\":\"$f\",\"version\":\"[^\"]*\",\"description\":\"[^\"]*\",\"file\":\"[^\"]*\",\"caps\":\"cpu[^\"]*,deq-factor\"" "$tmp/info.json" ||
    fail "info --json: $f's caps lack deq-factor"; ok
done
grep -q '"name":"mxfp8","version":"[^"]*","description":"[^"]*","file":"[^"]*","caps":"[^"]*deq-factor' "$tmp/info.json" &&
  fail "info --json: mxfp8 claims deq-factor"; ok
$hq info | grep -q '^  nvfp4 [^ ]*  \[cpu.*deq-factor\]$' || fail "info text: nvfp4's caps"; ok
# identity is built into libhqcore: listed first, with that in place of a file, in both forms
grep -q '"plugins":\[{"name":"identity",' "$tmp/info.json" || fail "info --json: identity is not the first format"; ok
grep -q '"name":"identity","version":"[^"]*","description":"[^"]*","file":"(built into libhqcore)"' "$tmp/info.json" || fail "info --json: identity's file"; ok
[ "$(grep -o '"name":"identity"' "$tmp/info.json" | wc -l)" -eq 1 ] || fail "info --json lists identity more than once"; ok
$hq info > "$tmp/info.txt" || fail "info"
grep -A2 '^  identity ' "$tmp/info.txt" | grep -q '^    (built into libhqcore)$' || { cat "$tmp/info.txt"; fail "info text: identity's file"; }; ok
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
  $hq recipe check "$f" > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "recipe check $f"; }
  grep -q "^valid" "$tmp/out" || fail "recipe check $f did not say valid"; ok
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
$hq recipe check "$tmp/nonexistent.ini" 2>"$tmp/err"; [ $? -eq 1 ] || fail "missing file exit"
grep -q "cannot open" "$tmp/err" || fail "missing file message"; ok
$hq recipe check 2>/dev/null; [ $? -eq 2 ] || fail "recipe check without file"; ok

# quantize: random input, JSON fields, error in the FP8 band
$hq quantize --recipe "$conf/examples/fp8_current_hybrid.ini" --role linear:weight:fc1 --random 128x256 --json > "$tmp/q.json" || fail "quantize --json"
for s in '"direction":"rowwise"' '"direction":"columnwise"' '"plugin":"fp8_tensor"' '"rel_rms_error":0.02' '"bytes":32776' '"fused":true'; do
  grep -q "$s" "$tmp/q.json" || { cat "$tmp/q.json"; fail "quantize --json lacks $s"; }; ok
done
# the default recipe: MXFP8 rowwise (E4M3: 2-3% error), NVFP4 columnwise (8-12%)
$hq quantize --recipe "$conf/recipe.ini" --role linear:weight:fc1 --random 256x256 --json > "$tmp/q.json" || fail "quantize default recipe"
for s in '"format":"mx","plugin":"mxfp8","bytes":67584' '"format":"nv_w","plugin":"nvfp4","bytes":36868' '"fused":false'; do
  grep -q "$s" "$tmp/q.json" || { cat "$tmp/q.json"; fail "default recipe lacks $s"; }; ok
done
$hq quantize --recipe "$conf/recipe.ini" --role linear:weight:lm_head --random 8x8 | grep -q "identity" || fail "lm_head stays identity"; ok
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
$hq quantize --recipe "$conf/recipe.ini" --role a:b:c --input "$tmp/raw.bin" 2>"$tmp/err"; [ $? -eq 1 ] || fail "raw without shape"
grep -q "not a .npy file" "$tmp/err" || fail "raw without shape message"; ok
# a shape a format cannot take: the error names the role, direction, format, shape and rule
$hq quantize --recipe "$conf/recipe.ini" --role linear:weight:fc1 --random 100x64 2>"$tmp/err"; [ $? -eq 1 ] || fail "bad shape exit"
grep -q "role linear:weight:fc1, rowwise format 'mx' (plugin mxfp8), shape \[100, 64\]: mxfp8: rows = 100 is not a multiple of 32" "$tmp/err" || { cat "$tmp/err"; fail "bad shape message"; }; ok
# usage errors
$hq quantize --recipe "$conf/recipe.ini" --role a:b --random 4x4 2>"$tmp/err"; [ $? -eq 2 ] || fail "bad role exit"
grep -q "not module_type:tensor_type:name" "$tmp/err" || fail "bad role message"; ok
$hq quantize --recipe "$conf/recipe.ini" --role a:b:c --random 4x 2>/dev/null; [ $? -eq 2 ] || fail "bad shape"; ok
$hq quantize --recipe "$conf/recipe.ini" --role a:b:c 2>/dev/null; [ $? -eq 2 ] || fail "no input"; ok
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
# bench runs (tiny) on the CPU
$hq bench --shape 64x64 --iters 1 --format fp8_tensor > "$tmp/b" || fail "bench"
grep -q "input_MB/s" "$tmp/b" || fail "bench output"; ok
$hq bench --format 'nosuch' --shape 8x8 --iters 1 2>"$tmp/err"; [ $? -eq 1 ] || fail "bench unknown plugin exit"; ok
# --batch: calls back to back per timed sample, said in the header and the JSON; bad values refused
$hq bench --shape 64x64 --iters 1 --batch 3 --format fp8_tensor > "$tmp/b" || fail "bench --batch"
grep -q "median of 1 samples of 3 calls back to back" "$tmp/b" || { cat "$tmp/b"; fail "bench --batch header"; }; ok
$hq bench --shape 64x64 --iters 1 --batch 2 --format fp8_tensor --json | grep -q '"batch":2' || fail "bench --batch json"; ok
# --all: every stock option that changes a kernel or a layout, one configuration each
$hq bench --all --shape 32x32 --iters 1 > "$tmp/b" || fail "bench --all"
for c in "identity dtype=f16" "fp8_tensor scaling=delayed" "mxfp8 block_2d=true swizzle=true" \
         "nvfp4 rht=true stochastic_rounding=true" "fp8_block block=2d power_2_scales=false"; do
  grep -q "^$c  *both" "$tmp/b" || { cat "$tmp/b"; fail "bench --all: $c"; }
done
[ "$(grep -c '^[^ ].* both ' "$tmp/b")" -eq 24 ] ||
  { cat "$tmp/b"; fail "bench --all: 24 configurations"; }
ok
$hq bench --all --shape 32x32 --iters 1 --format mxfp8 > "$tmp/b" || fail "bench --all --format"
[ "$(grep -c '^[^ ].* both ' "$tmp/b")" -eq 1 ] ||
  { cat "$tmp/b"; fail "bench --format replaces --all"; }
ok
$hq bench --shape 8x8 --batch 0 2>"$tmp/err"; [ $? -eq 2 ] || fail "bench --batch 0 exit"
grep -q "hq bench: --batch '0' is not an integer in \[1, 1000\]" "$tmp/err" || { cat "$tmp/err"; fail "bench --batch 0 message"; }; ok
# quantize lists each direction's buffers: name, dtype, shape, bytes, and whether a columnwise
# buffer is the rowwise one (per-tensor FP8's shared scale)
$hq quantize --recipe "$conf/examples/fp8_current.ini" --role linear:weight:w --random 64x32 --json > "$tmp/q.json" || fail "quantize --json"
grep -q '"buffers":\[{"name":"data","dtype":"e4m3","shape":\[64,32\],"bytes":2048,"shared_with_rowwise":false}' "$tmp/q.json" || { cat "$tmp/q.json"; fail "quantize --json rowwise buffers"; }; ok
grep -q '{"name":"columnwise_data","dtype":"e4m3","shape":\[32,64\],"bytes":2048,"shared_with_rowwise":false},{"name":"scale_inv","dtype":"f32","shape":\[1\],"bytes":4,"shared_with_rowwise":true}' "$tmp/q.json" || fail "quantize --json shared buffer"; ok
$hq quantize --recipe "$conf/examples/fp8_current.ini" --role linear:weight:w --random 64x32 | grep -q 'scale_inv .*(the rowwise buffer)' || fail "quantize text buffers"; ok
# every command takes --plugin-dir (bench too)
$hq bench --plugin-dir "$tmp" --shape 32x32 --iters 1 --format fp8_tensor > "$tmp/b" || fail "bench --plugin-dir"; ok
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
$hq info --shape 0x7 2>/dev/null; [ $? -eq 2 ] || fail "info --shape 0x7 exit"; ok
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
echo "PASS: $n checks"
