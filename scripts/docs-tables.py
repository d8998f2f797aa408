#!/usr/bin/env python3
"""docs-tables.py -- the one source of the numbers docs/training.md (and the README) print.

Every table of measured `hq train` results in the docs sits between marker comments

    <!-- docs-tables:NAME begin -->  ...  <!-- docs-tables:NAME end -->

and is written by this script from deterministic runs (the same build gives the same losses on
every run; only times vary). Usage, from a configured build directory or with HQ_BIN set:

    scripts/docs-tables.py                 # regenerate every CPU block (about 20 min on 2 cores)
    scripts/docs-tables.py --only check    # one block
    scripts/docs-tables.py --check         # fail when the small block's losses no longer match
    scripts/docs-tables.py --check --all   # the same for every CPU block's losses (slow)
    scripts/docs-tables.py --figures       # each block's figures --check compares (no runs)

--check compares the losses only (times depend on the machine and its load), within 0.0002. Every
run uses OpenBLAS's AVX2 kernels (blas_env), so the losses are the same on any x86-64 CPU with
AVX2 and FMA; --check skips (exit 77) on other CPUs. tests/test_docs_tables.sh runs `--check` in make check.
docs/distributed.md's tables (blocks dist40, dist_grad, dist_resume, dist300) train across
ranks under Open MPI's mpirun on the CPU (a few minutes; not part of --check unless --all).
The GPU table (docs/training.md 5b, block gpu) is measured on a device: scripts/gpu-check.sh
--on-device --train brings back train.json and train_wide.json, and
    DOCS_TABLES_GPU=DIR scripts/docs-tables.py --only gpu
writes the table from them (without DOCS_TABLES_GPU the block is left as it is).
"""
import atexit
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["docs/training.md", "README.md", "docs/distributed.md"]
RECIPES = ["conf/recipe.ini"] + sorted(
    "conf/examples/" + f for f in os.listdir(os.path.join(TOP, "conf/examples")) if f.endswith(".ini"))
# The small configuration make check verifies: every shipped recipe, a narrow model, 200 steps.
SMALL = ["--steps", "200", "--batch", "128", "--hidden", "64", "--layers", "1", "--eval-every", "0"]
TOL = 0.0002


def hq_bin():
    b = os.environ.get("HQ_BIN")
    if b:
        return b
    for d in ("build/cpu", "build/release", "."):
        p = os.path.join(TOP, d, "tools/hq")
        if os.access(p, os.X_OK):
            return p
    sys.exit("docs-tables: no hq binary: build it (build/cpu) or set HQ_BIN")


def blas_env():
    """OpenBLAS picks its sgemm kernel by CPU model, and kernels sum in different orders: a
    quantized recipe's loss then moves in the third decimal between two x86 machines (0.0015 for
    nvfp4.ini, a Zen 3 against the machine that wrote the tables). Every table is made with the
    AVX2 kernels (OPENBLAS_CORETYPE=Haswell), which every x86-64 CPU with AVX2 and FMA runs, so
    the figures reproduce on any such machine; None where that cannot hold."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    except (OSError, StopIteration):
        return None
    if "avx2" not in flags or "fma" not in flags:
        return None
    return {"OPENBLAS_CORETYPE": "Haswell"}


def train(args, ranks=0, err=None):
    """hq train ARGS --json: the document (under `mpirun -np RANKS` when RANKS > 1, else one
    process; its stderr appended to the list err when one is given)."""
    env = dict(os.environ)
    env.setdefault("HQ_CONF_DIR", os.path.join(TOP, "conf"))
    env.update(blas_env() or {})
    cmd = [hq_bin(), "train", "--json"] + args
    if ranks > 1:
        # the flags of tests/mpirun_env.sh: more ranks than cores, TCP between them, root allowed
        cmd = ["mpirun", "--oversubscribe", "--mca", "btl", "self,tcp"] + \
            (["--allow-run-as-root"] if os.geteuid() == 0 else []) + ["-np", str(ranks)] + cmd
    print("docs-tables: " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, cwd=TOP, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit("docs-tables: hq %s failed:\n%s" % (" ".join(cmd[1:]), p.stderr[-2000:]))
    if err is not None:
        err.append(p.stderr)
    d = json.loads(p.stdout)
    # CPU time (user + system, every thread): the machine's load changes it far less than the
    # wall-clock times
    d["cpu_seconds"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return d


def machine():
    """The CPU, its cores and the load while measuring: the frame of every time printed."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return "%s, %d cores, load average %.1f" % (model, os.cpu_count() or 0, load)


def name_of(r):
    if r["path"] is None:
        return r["name"] + " (built in)"
    return os.path.relpath(r["path"], os.path.join(TOP, "conf"))


def rate(x):
    return "%.1fk" % (x / 1e3) if x < 1e6 else "%.2fM" % (x / 1e6)


def gap(x):
    return "" if x is None else ("%+.4f" % x).replace("-", "\u2212")


def block_check():
    d = train(sum((["--recipe", os.path.join(TOP, r)] for r in RECIPES), []) + SMALL)
    rows = ["| recipe | train loss | eval loss | gap vs fp32 |", "|---|---|---|---|"]
    for r in d["recipes"]:
        rows.append("| %s | %.4f | %.4f | %s |" % (name_of(r), r["train_loss"], r["eval_loss"],
                                                   "(baseline)" if r["baseline"] else gap(r["gap"])))
    return ("`hq train %s` with every shipped recipe (seed 1, the system word list):\n\n"
            % " ".join(SMALL)) + "\n".join(rows) + "\n"


def timed_rows(d, first):
    """A row per run: losses, the gap, time and throughput."""
    rows = ["| %s | train loss | eval loss | gap vs fp32 | time | tokens/s |" % first,
            "|---|---|---|---|---|---|"]
    for r in d["recipes"]:
        rows.append("| %s | %.4f | %.4f | %s | %.1f s | %s |" % (
            name_of(r), r["train_loss"], r["eval_loss"], "(baseline)" if r["baseline"] else gap(r["gap"]),
            r["total_seconds"], rate(r["tokens_per_second"])))
    return rows


_default_doc = {}


def default_run():
    if "d" not in _default_doc:
        _default_doc["d"] = train([])
        _default_doc["m"] = machine()
    return _default_doc["d"], _default_doc["m"]


def block_default():
    d, m = default_run()
    rows = timed_rows(d, "run")
    total = sum(r["total_seconds"] for r in d["recipes"])
    return ("`hq train` with the defaults: %.0f s in all (%.1f s of CPU time) on %s. The loss falls from %.2f at step 0 "
            "(ln 27 = 3.30 is a uniform guess) to %.2f (train) and %.2f (held out).\n\n"
            % (total, d["cpu_seconds"], m, d["recipes"][0]["step0_loss"], d["recipes"][0]["train_loss"],
               d["recipes"][0]["eval_loss"])) + "\n".join(rows) + "\n"


_seeds_doc = {}


def seeds_run():
    if "d" not in _seeds_doc:
        args = sum((["--recipe", os.path.join(TOP, r)] for r in RECIPES), [])
        plot = os.environ.get("DOCS_TABLES_PLOT")
        if plot:
            args += ["--plot", plot, "--eval-every", "50"]
        _seeds_doc["d"] = train(args + ["--seeds", "3"])
        _seeds_doc["m"] = machine()
    return _seeds_doc["d"], _seeds_doc["m"]


def block_recipes(own=False):
    if own:   # without the seeds block: one seed, a third of the time
        d = train(sum((["--recipe", os.path.join(TOP, r)] for r in RECIPES), []))
        m = machine()
    else:
        d, m = seeds_run()
    rows = timed_rows(d, "recipe")
    return ("Every shipped recipe, default settings, seed 1, against the built-in FP32 baseline "
            "(one `hq train` with every recipe%s; %.0f s of CPU time in all; times on %s):\n\n"
            % ("" if own else " and `--seeds 3`: its first seed", d["cpu_seconds"], m)
            ) + "\n".join(rows) + "\n"


def block_seeds():
    d, _ = seeds_run()
    rows = ["| recipe | seed 1 | seed 2 | seed 3 | mean eval loss (sd) | mean gap (se) |", "|---|---|---|---|---|---|"]
    for r in d["recipes"]:
        ps, st = r["per_seed"], r["stats"]
        cells = []
        for s in ps:
            cells.append("%.4f" % s["eval_loss"] + ("" if r["baseline"] else " (%s)" % gap(s["gap"])))
        if r["baseline"]:
            g = "(baseline)"
        else:
            g = "%s (%.4f)%s" % (gap(st["gap_mean"]), st["gap_se"], " *" if st["gap_exceeds_noise"] else "")
        rows.append("| %s | %s | %.4f (%.4f) | %s |" % (name_of(r), " | ".join(cells), st["eval_loss_mean"],
                                                       st["eval_loss_sd"], g))
    return ("`hq train --seeds 3` with every shipped recipe (seeds 1, 2, 3: each its own split, data "
            "order and initial weights; eval loss, the gap to FP32 of the same seed in parentheses). "
            "The mean gap's standard error (se) is over the three paired differences; `*` marks a "
            "gap larger than 2 se, a difference the seed noise does not explain:\n\n") + "\n".join(rows) + "\n"


def block_readme():
    d, m = default_run()
    fp = [r for r in d["recipes"] if r["baseline"]][0]
    rec = d["recipes"][0]
    return ("Measured on %s: it took %.0f s (%.1f s of CPU time); the held-out loss falls from %.2f (ln 27 = 3.30 is a uniform "
            "guess) to %.4f in FP32 and %.4f with the default recipe (%s nats).\n"
            % (m, sum(r["total_seconds"] for r in d["recipes"]), d["cpu_seconds"], rec["step0_loss"],
               fp["eval_loss"], rec["eval_loss"], gap(rec["gap"])))


# docs/distributed.md: `hq train` across ranks on the CPU (Open MPI), the corpus of
# tests/train_corpus.sh, the runs tests/test_train_dist.sh checks
DIST_RECIPES = ["examples/mxfp8.ini", "examples/fp8_current.ini", "examples/fp8_delayed.ini",
                "examples/fp8_current_hybrid.ini", "examples/hybrid_fp8_identity.ini",
                "examples/nvfp4.ini", "recipe.ini"]
DIST_SMALL = ["--steps", "40", "--batch", "128", "--hidden", "128", "--layers", "1",
              "--eval-every", "20", "--log-every", "10"]
_corpus = {}


def corpus():
    """tests/train_corpus.sh's 3000 generated words, in a file that lives as long as the run."""
    if "f" not in _corpus:
        t = tempfile.NamedTemporaryFile(prefix="hq_docs_corpus.", suffix=".txt", delete=False)
        t.close()
        subprocess.run(["sh", "-c", '. "$1"; train_corpus "$2"', "sh",
                        os.path.join(TOP, "tests/train_corpus.sh"), t.name], check=True)
        _corpus["f"] = t.name
        atexit.register(os.unlink, t.name)
    return _corpus["f"]


def recipe_args(names):
    return sum((["--recipe", os.path.join(TOP, "conf", r)] for r in names), [])


def by_name(d):
    """The runs of document d by recipe path under conf/ ("fp32" for the built-in baseline)."""
    return {("fp32" if r["baseline"] else name_of(r)): r for r in d["recipes"]}


def evals(d):
    return {n: r["eval_loss"] for n, r in by_name(d).items()}


def label(n):
    return "fp32 (the baseline)" if n == "fp32" else "`conf/%s`" % n


_dist40 = {}


def dist40_runs():
    if not _dist40:
        base = ["--data", corpus()] + DIST_SMALL + recipe_args(DIST_RECIPES)
        for np in (1, 2, 4):
            _dist40[np] = evals(train(base, ranks=np))
    return _dist40


def block_dist40():
    runs = dist40_runs()
    rows = ["| recipe | 1 rank | 2 ranks | 4 ranks |", "|---|---:|---:|---:|"]
    for n in ["fp32"] + DIST_RECIPES:
        rows.append("| %s | %s |" % (label(n), " | ".join("%.8f" % runs[np][n] for np in (1, 2, 4))))
    return "\n".join(rows) + "\n"


def block_dist_grad():
    names = ["examples/fp8_current.ini", "examples/fp8_delayed.ini", "examples/mxfp8.ini"]
    base = ["--data", corpus()] + DIST_SMALL + recipe_args(names)
    fp = {np: evals(train(base, ranks=np)) for np in (2, 4)}
    bf = {np: evals(train(base + ["--grad-dtype", "bf16"], ranks=np)) for np in (2, 4)}
    rows = ["| recipe | 2 ranks FP32 / BF16 | 4 ranks FP32 / BF16 |", "|---|---|---|"]
    for n in ["fp32"] + names:
        rows.append("| %s | %s |" % (label(n), " | ".join(
            "%.8f / %.8f" % (fp[np][n], bf[np][n]) for np in (2, 4))))
    return "\n".join(rows) + "\n"


def block_dist_resume():
    d = tempfile.mkdtemp(prefix="hq_docs_resume.")
    ck = ["--data", corpus(), "--steps", "40", "--batch", "128", "--hidden", "128", "--layers", "1",
          "--log-every", "10", "--baseline", "none"] + recipe_args(["examples/fp8_delayed.ini"])
    for np in (1, 2, 4):
        train(ck + ["--checkpoint", os.path.join(d, "k%d-{step}.st" % np), "--checkpoint-every", "20"],
              ranks=np)
    one = train(ck)["recipes"][0]["eval_loss"]
    rows = ["| saved with -> resumed with | held-out loss | difference |", "|---|---:|---:|"]
    for a, b in ((4, 2), (4, 1), (1, 4), (2, 4)):
        got = train(ck + ["--resume", os.path.join(d, "k%d-20.st" % a)],
                    ranks=b)["recipes"][0]["eval_loss"]
        rows.append("| %d -> %d | %.8f | %.2g |" % (a, b, got, abs(got - one)))
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    return ("Held-out loss against one uninterrupted process (%.8f):\n\n" % one) + "\n".join(rows) + "\n"


def block_dist300():
    names = ["examples/mxfp8.ini", "examples/fp8_current.ini", "recipe.ini"]
    base = ["--data", corpus(), "--hidden", "256", "--layers", "2", "--batch", "256", "--steps", "300",
            "--eval-every", "0"] + recipe_args(names)
    runs, wire = {}, []
    m0 = machine()
    for np in (1, 2, 4):
        err = []
        d = train(base, ranks=np, err=err)
        runs[np] = by_name(d)
        if np == 2:
            wire = err[0].splitlines()
    m1 = machine()
    rows = ["| recipe | held-out loss, 1 / 2 / 4 ranks | tokens/s, 1 / 2 / 4 ranks |", "|---|---|---|"]
    for n in ["fp32"] + names:
        rows.append("| %s | %s | %s |" % (label(n), " / ".join("%.8f" % runs[np][n]["eval_loss"] for np in (1, 2, 4)),
                                          " / ".join(rate(runs[np][n]["tokens_per_second"]) for np in (1, 2, 4))))
    # the wire line of each run of 2 ranks: bytes per step and rank
    bytes_rows = ["| recipe | quantized weights gathered | vs a BF16 all-gather | FP32 gradients reduce-scattered |",
                  "|---|---:|---:|---:|"]
    pat = re.compile(r"^hq train: (.*): 2 ranks: per step and rank, quantized weights gathered (\d+) bytes "
                     r"\(a BF16 all-gather: (\d+), ([\d.]+)x\), FP32 weight gradients reduce-scattered (\d+) bytes")
    key_of = {r["name"]: n for n, r in runs[2].items()}   # the wire line names the recipe
    for line in wire:
        mm = pat.match(line)
        if mm and mm.group(1) in key_of:
            bytes_rows.append("| %s | %s | %sx | %s |" % (label(key_of[mm.group(1)]), "{:,}".format(int(mm.group(2))),
                                                        mm.group(4), "{:,}".format(int(mm.group(5)))))
    return ("Machine: %s at the start, %s at the end.\n\n" % (m0, m1.rsplit(" ", 1)[1])
            + "\n".join(rows) + "\n\nBytes per step and rank, as the 2-rank runs printed them:\n\n"
            + "\n".join(bytes_rows) + "\n")


def block_gpu():
    """docs/training.md's GPU table from the two documents `scripts/gpu-check.sh --on-device
    --train` brings back (DOCS_TABLES_GPU: the folder holding train.json and train_wide.json):
    measured on a device, so regenerated only when they are given."""
    d = os.environ.get("DOCS_TABLES_GPU")
    if not d:
        return None
    docs = [json.load(open(os.path.join(d, f))) for f in ("train.json", "train_wide.json")]
    dev = docs[0]["config"]["device"]
    cells = {}
    for k, doc in enumerate(docs):
        bf16 = [r for r in doc["recipes"] if r["path"] and r["path"].endswith("high_precision.ini")]
        base = bf16[0]["tokens_per_second"] if bf16 else None
        for r in doc["recipes"]:
            # the device's paths, relative to its tree: the part after conf/, as name_of gives here
            p = "/" + (r["path"] or "")
            n = "fp32 (built in)" if r["baseline"] else (
                p.split("/conf/", 1)[1] if "/conf/" in p else name_of(r))
            ratio = " (%.2fx)" % (r["tokens_per_second"] / base) if base else ""
            cells.setdefault(n, ["", "", "", "", "", ""])[3 * k:3 * k + 3] = [
                "%.4f" % r["eval_loss"] + ("" if r["baseline"] else " (%s)" % gap(r["gap"])),
                rate(r["tokens_per_second"]) + ratio,
                "%.1f" % (r["peak_device_bytes"] / 2 ** 20) if r.get("peak_device_bytes") else ""]
    rows = ["| recipe | default: eval loss (gap) | tokens/s (x BF16) | peak MiB | wide: eval loss (gap) "
            "| tokens/s (x BF16) | peak MiB |", "|---|---|---|---|---|---|---|"]
    for n, c in cells.items():
        rows.append("| %s | %s |" % (n, " | ".join(c)))
    c0, c1 = docs[0]["config"], docs[1]["config"]
    # the machine, where the documents name it (hq train --json's machine; older ones do not)
    m = docs[0].get("machine") or {}
    on = " on an %s (host %s, %s CPUs)" % (m["gpu"], m.get("host_cpu") or "unnamed",
                                          m.get("host_cpus")) if m.get("gpu") else ""
    return ("`hq train --device %s`" % dev + on
            + " (`scripts/gpu-check.sh --on-device --train`, one call; seed 1, graph %s): "
            "the default model (%d steps of %d, H = %d, %d hidden layers) and the wide one (`--preset wide`: "
            "%d steps of %d, H = %d, %d layers, lr %g); gaps to the FP32 baseline of the same run, "
            "tokens/s over the training steps and their ratio to the BF16 recipe (`high_precision.ini`), "
            "peak device memory of the run:\n\n"
            % (c0["cuda_graph"], c0["steps"], c0["batch"], c0["hidden"], c0["layers"], c1["steps"],
               c1["batch"], c1["hidden"], c1["layers"], c1["lr"])) + "\n".join(rows) + "\n"


BLOCKS = {"check": block_check, "default": block_default, "recipes": block_recipes,
          "seeds": block_seeds, "readme": block_readme, "dist40": block_dist40,
          "dist_grad": block_dist_grad, "dist_resume": block_dist_resume, "dist300": block_dist300,
          "gpu": block_gpu}
FAST = {"check"}
MARK = re.compile(r"(<!-- docs-tables:(\w+) begin -->\n)(.*?)(<!-- docs-tables:\2 end -->)", re.S)
# the losses and gaps: 4 places (8 in docs/distributed.md); times and ratios have fewer
NUM = re.compile(r"(?<![\w.])[-+\u2212]?\d+\.\d{4,}(?![\d])")


def losses(text):
    """The 4-decimal numbers of a block (losses and gaps; times have one decimal)."""
    return [float(x.replace("\u2212", "-")) for x in NUM.findall(text)]


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        return 0
    # an argument the script does not know must not start the 20-minute regeneration of
    # every block
    known = {"--check", "--all", "--only", "--figures"}
    for i, a in enumerate(argv):
        if a not in known and not a.startswith("--only=") and not (i and argv[i - 1] == "--only"):
            sys.exit("docs-tables: unknown argument '%s' (see --help)" % a)
        if a == "--only" and i + 1 == len(argv):
            sys.exit("docs-tables: --only needs a block name")
    for n in [a.split("=", 1)[1] for a in argv if a.startswith("--only=")] + \
             [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--only"]:
        if n not in BLOCKS:
            sys.exit("docs-tables: no block '%s' (blocks: %s)" % (n, ", ".join(sorted(BLOCKS))))
    if "--figures" in argv:   # a block --check would compare nothing in is an error
        bad = 0
        for f in FILES:
            path = os.path.join(TOP, f)
            for m in MARK.finditer(open(path, encoding="utf-8").read() if os.path.exists(path)
                                   else ""):
                n = len(losses(m.group(3)))
                bad |= n == 0
                print("docs-tables: %s, block '%s': %d figures" % (f, m.group(2), n))
        return bad
    check = "--check" in argv
    if check and blas_env() is None:
        print("SKIP: the documented losses are made with OpenBLAS's AVX2 kernels, which this "
              "CPU (%s) cannot run" % platform.machine())
        return 77
    names = [a.split("=", 1)[1] for a in argv if a.startswith("--only=")]
    names += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--only"]
    if not names:
        names = list(BLOCKS) if (not check or "--all" in argv) else sorted(FAST)
    bad = 0
    for f in FILES:
        path = os.path.join(TOP, f)
        if not os.path.exists(path):
            continue
        wanted = [m.group(2) for m in MARK.finditer(open(path, encoding="utf-8").read())
                  if m.group(2) in names]
        new = {n: (block_recipes(own=True) if n == "recipes" and "seeds" not in names
                   else BLOCKS[n]()) for n in wanted}   # the runs first: the file may change meanwhile
        new = {n: t for n, t in new.items() if t is not None}   # not measurable here: left as is
        text = open(path, encoding="utf-8").read()
        out, pos = [], 0
        for m in MARK.finditer(text):
            out.append(text[pos:m.start(3)])
            body = m.group(3)
            if m.group(2) in new:
                if check:
                    a, b = losses(body), losses(new[m.group(2)])
                    if not a:   # a check that compares nothing cannot fail
                        bad = 1
                        print("docs-tables: %s, block '%s': no loss figure to compare (4 or more "
                              "decimals)" % (f, m.group(2)), file=sys.stderr)
                    elif len(a) != len(b) or any(abs(x - y) > TOL for x, y in zip(a, b)):
                        bad = 1
                        print("docs-tables: %s, block '%s': the documented figures no longer match "
                              "a run of this build:\n--- documented\n%s--- now\n%s"
                              % (f, m.group(2), body, new[m.group(2)]), file=sys.stderr)
                    else:
                        print("docs-tables: %s, block '%s': %d figures match" % (f, m.group(2), len(a)),
                              file=sys.stderr)
                body = new[m.group(2)]
            out.append(body)
            pos = m.start(4)
        out.append(text[pos:])
        if not check:
            with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), delete=False,
                                             encoding="utf-8") as t:
                t.write("".join(out))
            os.chmod(t.name, 0o644)
            os.replace(t.name, path)
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
