#!/usr/bin/env python3
"""train_ab.py -- the before/after throughput table of docs/performance.md from `hq train --json`.

    scripts/train_ab.py "default, before=d0.json" "default, after=d1.json" \\
                        "wide, before=w0.json" "wide, after=w1.json"

Each argument is LABEL=FILE: FILE is the output of one `hq train --json` run (every recipe of
one model size, one build), LABEL its column's heading. Prints a Markdown table, one row per
recipe of the first file in its order, each cell the run's tokens/s and its ratio to the
baseline of the same file (the `--baseline` run, which every file needs), as the performance
notes print them; a recipe a file lacks gets "--". Ratios are taken within one file, so builds
and sizes compare by ratio even when the machine's clocks moved between runs.
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


def load(arg):
    label, sep, path = arg.partition("=")
    if not sep or not label or not path:
        sys.exit("train_ab.py: '%s' is not LABEL=FILE" % arg)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("train_ab.py: %s: %s" % (path, e))
    runs = doc.get("recipes") if isinstance(doc, dict) else None
    if not isinstance(runs, list) or not runs:
        sys.exit("train_ab.py: %s: no 'recipes' list (not the output of hq train --json?)" % path)
    base = [r for r in runs if r.get("baseline")]
    if len(base) != 1:
        sys.exit("train_ab.py: %s: %d baseline runs, expected 1 (run hq train with --baseline)"
                 % (path, len(base)))
    return label, runs, base[0]["tokens_per_second"]


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    cols = [load(a) for a in argv[1:]]
    print("| recipe | " + " | ".join(label for label, _, _ in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r0 in cols[0][1]:
        name = r0["name"]
        cells = []
        for _, runs, base in cols:
            r = next((x for x in runs if x["name"] == name), None)
            if r is None or not base:
                cells.append("--")
            else:
                t = r["tokens_per_second"]
                cells.append("%s (%.2fx)" % (rate(t), t / base))
        print("| %s | %s |" % (name, " | ".join(cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
