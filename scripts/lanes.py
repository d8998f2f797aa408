#!/usr/bin/env python3
"""lanes.py [--skip N] [--names A,B,...] [--timeline] TRACE.csv -- where a replayed CUDA graph's
time goes, stream by stream, from scripts/lane_trace.c's CSV (scripts/gpu-check.sh --lanes: hq
train under CUPTI's activity tracing).

The records of each graph (in the order its first node ran; --names labels them, e.g. the recipes
of one hq train process in their order) are cut into replays: a replay ends where one of its
nodes runs again. The first N replays (--skip, default 2) are left out. Per graph, the streams
its nodes ran on (over every replay kept) and, medians over the replays, the span (first node's
start to last node's end), the nodes' summed time, the busy time (at least one node runs: their
union) and so the idle time and the overlap (summed minus busy), and per stream its nodes, its
busy time (the union of its nodes) and where its last node ends; the longest stretch in which no
node runs (the median over the replays of each one's longest) and the nodes it most often lies
between -- a wait the nodes' own times do not show.
--timeline also lists the replay of median span node by node (start and duration in us from its
first node, stream, name). Records outside graphs (eager launches) are left out. Exits non-zero,
naming the file, when it holds no graph replay."""
import collections
import csv
import re
import statistics
import sys


def short_name(name):
    """An Itanium-mangled name's last nested identifier (`_ZN..17small_gemm_kernelI..E..` ->
    small_gemm_kernel); any other name up to its first '(' or '<'."""
    m = re.match(r"_ZN?K?", name)
    if not m or not name[m.end():m.end() + 1].isdigit():
        return re.split(r"[(<]", re.sub(r"^void ", "", name), 1)[0].strip()
    at, last, nested = m.end(), name, name.startswith("_ZN")
    while at < len(name) and name[at].isdigit():
        n = re.match(r"\d+", name[at:]).group(0)
        at += len(n)
        last = name[at:at + int(n)]
        at += int(n)
        if not nested:
            break
    return last


def union(intervals):
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def replays(recs):
    """The graph's records, by start, cut where a node runs again."""
    out, cur, seen = [], [], set()
    for r in sorted(recs, key=lambda r: r["start"]):
        if r["node"] in seen:
            out.append(cur)
            cur, seen = [], set()
        cur.append(r)
        seen.add(r["node"])
    if cur:
        out.append(cur)
    return out


def longest_gap(rep):
    """The longest stretch of rep in which no node runs, with the node whose end began it and the
    node whose start ended it: (0, None, None) when none."""
    best, end, last = (0, None, None), None, None
    for r in sorted(rep, key=lambda r: r["start"]):
        if end is not None and r["start"] > end and r["start"] - end > best[0]:
            best = (r["start"] - end, last, r)
        if end is None or r["end"] > end:
            end, last = r["end"], r
    return best


def stats(rep):
    t0 = min(r["start"] for r in rep)
    span = max(r["end"] for r in rep) - t0
    spans = [(r["start"], r["end"]) for r in rep]
    summed = sum(e - s for s, e in spans)
    busy = union(spans)
    streams = {}
    for st in sorted({r["stream"] for r in rep}):
        mine = [(r["start"], r["end"]) for r in rep if r["stream"] == st]
        streams[st] = (len(mine), union(mine), max(e for _, e in mine) - t0)
    return {"span": span, "summed": summed, "busy": busy, "streams": streams, "t0": t0,
            "gap": longest_gap(rep)}


def us(ns):
    return ns / 1000.0


def report(label, reps, timeline):
    st = [stats(r) for r in reps]
    med = lambda key: statistics.median(s[key] for s in st)
    span, summed, busy = med("span"), med("summed"), med("busy")
    streams = len({r["stream"] for rep in reps for r in rep})
    print("%s: %d replays, %d nodes a replay on %d streams (medians)"
          % (label, len(reps), len(reps[0]), streams))
    print("  span %.1f us, nodes %.1f us summed, %.1f us busy: idle %.1f us, overlap %.1f us"
          % (us(span), us(summed), us(busy), us(span - busy), us(summed - busy)))
    gaps = [s["gap"] for s in st if s["gap"][1] is not None]
    if gaps:
        pair = collections.Counter((short_name(g[1]["name"]), short_name(g[2]["name"]))
                                   for g in gaps).most_common(1)[0][0]
        print("  longest idle stretch %.1f us, after %s and before %s"
              % (us(statistics.median(s["gap"][0] for s in st)), pair[0], pair[1]))
    else:
        print("  longest idle stretch: none")
    for sid in sorted(st[0]["streams"]):
        rows = [s["streams"][sid] for s in st if sid in s["streams"]]
        print("  stream %-6s %3d nodes, busy %7.1f us, its last node ends at %7.1f us"
              % (sid, rows[0][0], us(statistics.median(r[1] for r in rows)),
                 us(statistics.median(r[2] for r in rows))))
    if timeline:
        order = sorted(range(len(st)), key=lambda i: st[i]["span"])
        rep, t0 = reps[order[len(order) // 2]], st[order[len(order) // 2]]["t0"]
        print("  the replay of median span, node by node (start, duration, stream):")
        for r in sorted(rep, key=lambda r: r["start"]):
            print("    %8.2f %7.2f  %-6s %s" % (us(r["start"] - t0), us(r["end"] - r["start"]),
                                               r["stream"], short_name(r["name"])))


def main(argv):
    skip, names, timeline, path = 2, [], False, None
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--skip" and args:
            skip = int(args.pop(0))
        elif a == "--names" and args:
            names = args.pop(0).split(",")
        elif a == "--timeline":
            timeline = True
        elif path is None and not a.startswith("--"):
            path = a
        else:
            sys.exit("lanes.py: unknown argument %r (see the top of the script)" % a)
    if path is None:
        sys.exit("lanes.py: give the trace (lane_trace.c's CSV)")
    graphs = collections.OrderedDict()
    dropped = 0
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("kind") == "dropped":
                dropped += int(row["name"].split()[0])
            if row.get("kind") not in ("kernel", "memcpy", "memset") or row["graph"] in ("", "0"):
                continue
            graphs.setdefault(row["graph"], []).append(
                {"start": int(row["start_ns"]), "end": int(row["end_ns"]), "stream": row["stream"],
                 "node": row["node"], "name": row["name"]})
    if dropped:
        print("lanes.py: CUPTI dropped %d records: the replays may be incomplete" % dropped,
              file=sys.stderr)
    shown = 0
    for k, (gid, recs) in enumerate(graphs.items()):
        reps = replays(recs)[skip:]
        if not reps:
            continue
        report(names[k] if k < len(names) else "graph %s" % gid, reps, timeline)
        shown += 1
    if not shown:
        sys.exit("lanes.py: %s holds no graph replay past the first %d" % (path, skip))


if __name__ == "__main__":
    main(sys.argv[1:])
