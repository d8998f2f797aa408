#!/usr/bin/env python3
"""ncu_steps.py [--step-kernel REGEX] [--top N] LABEL=CSV... | --launches CSV -- where a training
step's kernel time goes, from `ncu --csv --metrics gpu__time_duration.sum hq train ... --cuda-graph
off` (scripts/gpu-check.sh --step-kernels; docs/performance.md cites its sums).

The launches of a file, in their order, are cut into whole steps at the launches of the step
kernel (default the embedding's backward, embed_bwd_part_k, which runs once a training step and
never in an evaluation, whose forwards end the run): from one of them to the next is one step's
optimizer, next forward and backward, so a run of S steps gives S - 1 whole steps, and the first
step's forward and backward and everything after the last step's backward (its optimizer, the
final evaluation) are left out. Per file: the kernels a step
launches and their microseconds, then each kernel (its name up to the first '(' or '<', without
'void ' and anonymous namespaces) with its calls, microseconds a step and a call, largest first.
Lines of the file that are not ncu's CSV (the program's own output, ==PROF== lines) are ignored.
Exits non-zero, naming the file, when it holds no counters, a time in a unit it does not know or
fewer than two step kernels.

--launches CSV prints the microseconds of every launch in the file, in order, on one line
(scripts/gpu-check.sh --launch-times: the per-launch times docs/performance.md quotes), and exits
non-zero when it holds none.

--calls REGEX lists, after a file's sums, every launch of its first whole step whose name matches
REGEX, in order: name, grid, microseconds and, when the file also holds ncu's
dram__bytes_read.sum (`--metrics gpu__time_duration.sum,dram__bytes_read.sum`), the megabytes
the launch read from DRAM -- to tell the calls of one kernel at different sizes apart."""
import collections
import csv
import re
import sys


def short_name(name):
    s = re.sub(r"^void ", "", name)
    s = re.sub(r"\(anonymous namespace\)::|<unnamed>::", "", s)
    return re.split(r"[(<]", s, 1)[0].strip()


def micros(value, unit):
    v = float(value.replace(",", ""))
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
             "second": 1e6, "s": 1e6}
    if unit not in scale:
        raise ValueError("unknown time unit %r" % unit)
    return v * scale[unit]


def megabytes(value, unit):
    v = float(value.replace(",", ""))
    scale = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "B": 1e-6, "KB": 1e-3,
             "MB": 1.0, "GB": 1e3}
    if unit not in scale:
        raise ValueError("unknown byte unit %r" % unit)
    return v * scale[unit]


def launches(path):
    """[(short name, microseconds, grid, DRAM megabytes read or None)] in launch order."""
    with open(path, newline="", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    out, grid, dram = collections.OrderedDict(), {}, {}
    for r in csv.DictReader(lines):
        k = int(r["ID"])
        if r.get("Metric Name") == "dram__bytes_read.sum":
            dram[k] = megabytes(r["Metric Value"], r.get("Metric Unit", ""))
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        out[k] = (short_name(r["Kernel Name"]), micros(r["Metric Value"], r.get("Metric Unit", "")))
        grid[k] = r.get("Grid Size", "")
    return [out[k] + (grid[k], dram.get(k)) for k in sorted(out)]


def summary(label, path, step_re, top, calls_re=None):
    try:
        kd = launches(path)
        ks = [(n, us) for n, us, _, _ in kd]
    except (ValueError, KeyError) as e:
        sys.stderr.write("%s: %s: not ncu's gpu__time_duration.sum CSV: %s\n" % (label, path, e))
        return 1
    if not ks:
        sys.stderr.write("%s: %s holds no gpu__time_duration.sum counters\n" % (label, path))
        return 1
    marks = [i for i, (n, _) in enumerate(ks) if step_re.search(n)]
    if len(marks) < 2:
        sys.stderr.write("%s: %d launches of the step kernel /%s/ in %s: two are needed for one "
                         "whole step\n" % (label, len(marks), step_re.pattern, path))
        return 1
    steps = len(marks) - 1
    agg = collections.OrderedDict()
    for n, us in ks[marks[0]:marks[-1]]:
        c, t = agg.get(n, (0, 0.0))
        agg[n] = (c + 1, t + us)
    calls = sum(c for c, _ in agg.values())
    total = sum(t for _, t in agg.values())
    print("%s: %d whole steps, %.1f kernels and %.1f us of kernel time a step" %
          (label, steps, calls / steps, total / steps))
    for n, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
        print("  %-48s %5.1f calls %9.2f us/step %8.2f us/call" % (n, c / steps, t / steps, t / c))
    if calls_re is not None:
        print("%s: the launches of its first whole step matching /%s/:" % (label, calls_re.pattern))
        for n, us, grid, mb in kd[marks[0]:marks[1]]:
            if calls_re.search(n):
                print("  %-40s grid %-14s %8.2f us%s" %
                      (n, grid, us, "" if mb is None else " %8.2f MB read" % mb))
    return 0


def launch_times(path):
    try:
        ts = [us for _, us, _, _ in launches(path)]
    except (ValueError, KeyError) as e:
        sys.stderr.write("%s: not ncu's gpu__time_duration.sum CSV: %s\n" % (path, e))
        return 1
    if not ts:
        sys.stderr.write("%s holds no gpu__time_duration.sum counters\n" % path)
        return 1
    print(" ".join("%.2f" % t for t in ts) + " us")
    return 0


def main(argv):
    if len(argv) == 2 and argv[0] == "--launches":
        return launch_times(argv[1])
    step, top, calls, files = "embed_bwd_part_k", 12, None, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--step-kernel", "--top", "--calls") and i + 1 < len(argv):
            if a == "--top":
                top = int(argv[i + 1])
            elif a == "--calls":
                calls = re.compile(argv[i + 1])
            else:
                step = argv[i + 1]
            i += 2
            continue
        if "=" not in a or a.startswith("-"):
            sys.stderr.write("ncu_steps.py: %r: want LABEL=CSV (or --step-kernel REGEX, --top N, "
                             "--calls REGEX)\n" % a)
            return 2
        files.append(a.split("=", 1))
        i += 1
    if not files:
        sys.stderr.write(__doc__)
        return 2
    rc = 0
    for label, path in files:
        rc |= summary(label, path, re.compile(step), top, calls)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
