#!/bin/sh
# help2roff.sh -- write the man page of `hq` or of one of its subcommands (roff, man(7) macros)
# from the command's own --help text, so that the two never drift: `make` runs it on the
# freshly built hq (Makefile.am, man1_MANS).
#
#   scripts/help2roff.sh HQ            > hq.1          HQ: the hq program to run
#   scripts/help2roff.sh HQ info       > hq-info.1     (recipe, quantize, bench, train alike)
#
# NAME: a subcommand's summary is its entry in `hq --help`'s command list. SYNOPSIS: the usage
# lines. DESCRIPTION: the rest; an indented "TAG  text" line (an option, a command) starts a
# tagged paragraph, deeper-indented lines continue it; other text is filled prose.
set -eu
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 HQ [SUBCOMMAND]" >&2
  exit 2
fi
hq=$1
cmd=${2:-}
AWK=${AWK:-awk}
version=$("$hq" --version | sed -n '1s/^\(hq [^ ]*\).*/\1/p')
tmp=${TMPDIR:-/tmp}/help2roff.$$
trap 'rm -f "$tmp.top" "$tmp.cmd"' EXIT
"$hq" --help > "$tmp.top"
if [ -n "$cmd" ]; then
  "$hq" "$cmd" --help > "$tmp.cmd"
  page=hq-$cmd
else
  cp "$tmp.top" "$tmp.cmd"
  page=hq
fi

"$AWK" -v page="$page" -v cmd="$cmd" -v version="$version" -v top="$tmp.top" '
function esc(s) {
  gsub(/\\/, "\\e", s)
  gsub(/-/, "\\-", s)
  if (s ~ /^[.\047]/) s = "\\&" s
  return s
}
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
# The summary of subcommand c in the top-level help: its "  c ...   text" entry and the
# deeper-indented lines that continue it.
function summary(c,    line, s, on) {
  s = ""; on = 0
  while ((getline line < top) > 0) {
    if (on && line ~ /^      +[^ ]/) { s = s " " trim(line); continue }
    on = 0
    if (line ~ "^  " c "( [a-z]+)?  +[^ ]") {
      sub("^  " c "( [a-z]+)?  +", "", line)
      s = line; on = 1
    }
  }
  close(top)
  return s
}
BEGIN {
  if (cmd == "") name = "hybrid quantization runtime: formats, recipes, quantize, bench and train"
  else name = summary(cmd)
  if (name == "") {
    print "help2roff: no summary of \"" cmd "\" in hq --help" > "/dev/stderr"
    exit 1
  }
  up = toupper(page)
  printf ".TH %s 1 \"\" \"%s\" \"hq manual\"\n", esc(up), version
  print ".SH NAME"
  print esc(page) " \\- " esc(name)
  print ".SH SYNOPSIS"
  print ".nf"
  part = 0   # 0 synopsis, 1 description
  inlist = 0 # inside a tagged paragraph list
  para = 0   # some prose or list written since the last paragraph break
}
part == 0 {
  if ($0 ~ /^[ \t]*$/) { print ".fi"; print ".SH DESCRIPTION"; part = 1; next }
  line = $0
  if (NR == 1) sub(/^usage: /, "", line); else sub(/^       /, "", line)
  print esc(line)
  next
}
/^[ \t]*$/ { if (para) print ".PP"; para = 0; inlist = 0; next }
# "  TAG  text": a command or an option with its description
/^  [^ ]/ && /[^ ]  +[^ ]/ {
  line = $0
  sub(/^  /, "", line)
  tag = line; sub(/  +.*/, "", tag)
  text = trim(substr(line, length(tag) + 1))
  print ".TP"
  print "\\fB" esc(tag) "\\fR"
  print esc(text)
  inlist = 1; para = 1
  next
}
# deeper-indented: continues the description of the entry above
/^   / && inlist { print esc(trim($0)); next }
# a heading such as "commands:"
/^[a-z][a-z ]*:$/ { sub(/:$/, ""); print ".SS " esc($0); inlist = 0; para = 0; next }
{
  if (inlist) { print ".PP"; inlist = 0 }
  # "Label: ..." after a finished sentence starts a new line ("Exit status: ...", "CPU: ...")
  else if (para && prev ~ /[.)]$/ && $0 ~ /^[A-Za-z][A-Za-z ]*: /) print ".br"
  print esc(trim($0)); para = 1
}
{ prev = $0 }
END {
  if (part == 0) print ".fi"
  print ".SH SEE ALSO"
  if (cmd == "") { # every command of the list, hq\-NAME(1)
    see = ""
    while ((getline line < top) > 0)
      if (line ~ /^  [a-z]+( [a-z]+)?  +[^ ]/) {
        split(line, w, " ")
        see = see (see == "" ? "" : ", ") "\\fBhq\\-" w[1] "\\fR(1)"
      }
    print see
  } else print "\\fBhq\\fR(1)"
  print ".PP"
  print "The Markdown documentation in hq\\(aqs source tree, docs/: the numerics of every format"
  print "(formats.md), the recipe reference (recipes.md), the plugin guide (plugin\\-guide.md)"
  print "and the embedder guide (embedding.md)."
}
' "$tmp.cmd"
