#!/usr/bin/env python3
"""train_ab.py -- the before/after throughput table of docs/performance.md from `hq train --json`.

    scripts/train_ab.py "default, before=d0.json" "default, after=d1.json" \\
                        "wide, before=w0.json" "wide, after=w1.json"
    scripts/train_ab.py "default, before=d0a.json,d0b.json,d0c.json" ...
    scripts/train_ab.py --baseline bf16-baseline "default=d1.json,d2.json" ...

Each argument is LABEL=FILE[,FILE...]: each FILE is the output of one `hq train --json` run
(every recipe of one model size, one build), several of them the rounds of the same column
(interleaved with the other columns' runs, so that the machine's drift falls on every column
alike); LABEL is the column's heading. Prints a Markdown table, one row per recipe of the
column's first file in the first column's order, each cell the run's tokens/s and its ratio to
the baseline of the same file (the `--baseline` run, which every file needs, or with --baseline
NAME the recipe of that name, for runs made with `hq train --baseline none`), as the
performance notes print them -- over several rounds the smallest and largest of each, "2.03-
2.19M (0.89-0.93x)" -- and the held-out loss where the rounds disagree on it ("loss differs"),
since the same recipe from the same seed gives the same loss bit for bit; a recipe a column's
files lack gets "--"; after the table, the machines the files name (hq train's `machine`).
Ratios are taken within one file, so builds and sizes compare by ratio even when the machine's
clocks moved between runs.
scripts/gpu-check.sh --train-ab makes the files on a GPU (docs/building.md).
"""
import json
import sys


def rate(r):
    """tokens/s as hq train prints it: 2.50M, 720.4k"""
    if r >= 1e6:
        return "%.2fM" % (r / 1e6)
    if r >= 1e3:
        return "%.1fk" % (r / 1e3)
    return "%.0f" % r


def machine(doc):
    """the machine line of one document's `machine` (hq train --json), None for older files"""
    m = doc.get("machine") if isinstance(doc, dict) else None
    if not isinstance(m, dict):
        return None
    gpu = m.get("gpu") or "no GPU"
    return "%s, host %s (%s CPUs)" % (gpu, m.get("host_cpu") or "unnamed", m.get("host_cpus"))


def load_file(path, base_name=None):
    """(runs, baseline tokens/s, machine line) of one hq train --json document; base_name: the
    recipe whose run is the baseline, else the run hq train marked as one"""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("train_ab.py: %s: %s" % (path, e))
    runs = doc.get("recipes") if isinstance(doc, dict) else None
    if not isinstance(runs, list) or not runs:
        sys.exit("train_ab.py: %s: no 'recipes' list (not the output of hq train --json?)" % path)
    if base_name:
        base = [r for r in runs if r.get("name") == base_name]
        if len(base) != 1:
            sys.exit("train_ab.py: %s: %d runs of recipe '%s', expected 1"
                     % (path, len(base), base_name))
    else:
        base = [r for r in runs if r.get("baseline")]
        if len(base) != 1:
            sys.exit("train_ab.py: %s: %d baseline runs, expected 1 (run hq train with "
                     "--baseline, or name the baseline recipe: --baseline NAME)"
                     % (path, len(base)))
    return runs, base[0]["tokens_per_second"], machine(doc)


def load(arg, base_name=None):
    """(label, [(runs, baseline), ...]) of one LABEL=FILE[,FILE...] argument"""
    label, sep, paths = arg.partition("=")
    if not sep or not label or not paths or "" in paths.split(","):
        sys.exit("train_ab.py: '%s' is not LABEL=FILE[,FILE...]" % arg)
    return label, [load_file(p, base_name) for p in paths.split(",")]


def span(lo, hi, fmt):
    a, b = fmt(lo), fmt(hi)
    return a if a == b else "%s-%s" % (a, b)


def cell(name, rounds):
    got = [(next((x for x in runs if x["name"] == name), None), base) for runs, base, _ in rounds]
    got = [(r, base) for r, base in got if r is not None and base]
    if not got:
        return "--"
    t = [r["tokens_per_second"] for r, _ in got]
    x = [r["tokens_per_second"] / base for r, base in got]
    s = "%s (%sx)" % (span(min(t), max(t), rate), span(min(x), max(x), lambda v: "%.2f" % v))
    if len({json.dumps(r.get("eval_loss")) for r, _ in got}) > 1:
        s += ", loss differs"
    return s


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    args, base_name = argv[1:], None
    if args[0] == "--baseline":
        if len(args) < 3:
            sys.exit("train_ab.py: --baseline NAME needs a recipe name and a column")
        base_name, args = args[1], args[2:]
    cols = [load(a, base_name) for a in args]
    print("| recipe | " + " | ".join(label for label, _ in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r0 in cols[0][1][0][0]:
        name = r0["name"]
        print("| %s | %s |" % (name, " | ".join(cell(name, rounds) for _, rounds in cols)))
    # the machines the files were measured on, each once (files from before hq train's
    # `machine` have none)
    seen = []
    for _, rounds in cols:
        for _, _, m in rounds:
            if m and m not in seen:
                seen.append(m)
    if seen:
        print("\nMeasured on: %s." % "; ".join(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
