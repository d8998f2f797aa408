#!/usr/bin/env python3
"""ncu_mem.py MEM_CSV -- what each kernel moved, from `ncu --csv --metrics` (gpu-check.sh --mem).

One line per kernel (its launches summed up as the range over them): the launches counted, the
time, the DRAM bytes read and written, the 32-byte L2 sectors the SMs read and wrote, and the
DRAM rate (bytes read + written over the time). Exits non-zero when the file holds no counters
(the profile failed: its output is printed instead)."""
import collections
import csv
import re
import sys

NEED = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
        "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum")


def main(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if len(r) > 10]
    if not rows or "Metric Name" not in rows[0]:
        sys.stderr.write("%s: no ncu counters; its last lines:\n" % path)
        with open(path, errors="replace") as f:
            sys.stderr.writelines(f.readlines()[-10:])
        return 1
    h = rows[0]
    ki, mi, vi, ii = (h.index(k) for k in ("Kernel Name", "Metric Name", "Metric Value", "ID"))
    launches = collections.OrderedDict()
    for r in rows[1:]:
        launches.setdefault(r[ii], [r[ki], {}])[1][r[mi]] = float(r[vi].replace(",", ""))
    kernels = collections.OrderedDict()
    for name, m in launches.values():
        missing = [k for k in NEED if k not in m]
        if missing:
            sys.stderr.write("%s: a launch of %s lacks %s\n" % (path, name, ", ".join(missing)))
            return 1
        t = m["gpu__time_duration.sum"] * 1e-9
        rd, wr = m["dram__bytes_read.sum"], m["dram__bytes_write.sum"]
        name = re.sub(r"^void\s+", "", name).replace("<unnamed>::", "").split("(")[0]
        kernels.setdefault(name, []).append(
            (t * 1e6, rd / 1e6, wr / 1e6, m["lts__t_sectors_srcunit_tex_op_read.sum"] / 1e6,
             m["lts__t_sectors_srcunit_tex_op_write.sum"] / 1e6, (rd + wr) / t / 1e12))

    def span(v, fmt):
        lo, hi = fmt % min(v), fmt % max(v)
        return lo if lo == hi else lo + "-" + hi

    form = "%-44s %3s %13s %13s %13s %13s %13s %11s"
    print(form % ("kernel", "n", "time us", "DRAM rd MB", "DRAM wr MB", "L2 rd Msect",
                  "L2 wr Msect", "DRAM TB/s"))
    for name, xs in kernels.items():
        c = list(zip(*xs))
        print(form % (name[:44], len(xs), span(c[0], "%.1f"), span(c[1], "%.1f"),
                      span(c[2], "%.1f"), span(c[3], "%.2f"), span(c[4], "%.2f"),
                      span(c[5], "%.2f")))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
