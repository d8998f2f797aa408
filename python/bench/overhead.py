#!/usr/bin/env python3
"""Forward + backward time of hq.torch.Linear against nn.Linear (and Transformer Engine's
te.Linear where it imports) on square problems N x N x N (tokens = in = out = N), medians.

    python3 python/bench/overhead.py                         # GPU: 256 .. 8192, bf16 input
    python3 python/bench/overhead.py --device cpu --sizes 256,512 --iters 10 --loop 5

Each row times one module's forward + backward (y = m(x); y.backward(dy)) with the input and
the output gradient made beforehand, --warmup untimed iterations first, then --iters timed
ones in samples of --loop steps run back to back between two CUDA events (on the CPU:
perf_counter), as a training loop runs them. Columns: the median time per step over the
samples, and the ratio to nn.Linear's median at the same N; then the host time of a step
(thread CPU time per step over --iters steps run back to back, synchronized once after them:
the Python and C work of a step, which is what bounds a step where the GPU waits for it; where
the GPU is the bound instead, it includes the wait for a full launch queue) and its ratio to
nn.Linear's. hq runs twice: with the high-precision recipe (bf16 identity: the binding's own
cost over the same kind of GEMM) and with each --recipe (default: the installed recipe.ini,
MXFP8 forward / NVFP4 backward).
"""
import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

import hq
import hq.torch as ht

HP = ("[recipe]\nname = bf16-identity\n[format hp]\nplugin = identity\ndtype = bf16\n"
      "[role *:*:*]\nrowwise = hp\ncolumnwise = hp\n")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(step, device, warmup, iters, loop):
    for _ in range(warmup):
        step()
    sync(device)
    t = time.thread_time_ns()
    for _ in range(iters):
        step()
    host_us = (time.thread_time_ns() - t) / iters / 1e3
    sync(device)
    out = []
    # a training loop runs steps back to back: a sample is `loop` of them between two events,
    # so a step's time is the larger of its host and GPU times, not its launch latency
    for _ in range(max(1, iters // loop)):
        if device.type == "cuda":
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(loop):
                step()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / loop)
        else:
            t = time.perf_counter()
            for _ in range(loop):
                step()
            out.append((time.perf_counter() - t) * 1e3 / loop)
    return statistics.median(out), host_us


def fwd_bwd(m, x, dy, ctxmgr=None):
    def step():
        x.grad = None
        for p in m.parameters():
            p.grad = None
        if ctxmgr is not None:
            with ctxmgr():
                y = m(x)
        else:
            y = m(x)
        y.backward(dy)
    return step


def te_candidates(n, device, dtype):
    try:
        import transformer_engine.pytorch as te
    except Exception as e:  # noqa: BLE001 - any import failure means "not here"
        return [], "transformer_engine not importable (%s)" % str(e).splitlines()[0]
    out = [("te.Linear bf16", te.Linear(n, n, params_dtype=dtype, device=device), None)]
    try:
        from transformer_engine.common import recipe as te_recipe
        rec = te_recipe.Float8CurrentScaling()
        out.append(("te.Linear fp8 current",
                    te.Linear(n, n, params_dtype=dtype, device=device),
                    lambda: te.fp8_autocast(enabled=True, fp8_recipe=rec)))
    except Exception:  # noqa: BLE001 - older TE: only bf16
        pass
    return out, None


def trace(n, device, dtype, recipes, warmup):
    """One step per module under torch.profiler: where the time of a row above goes (kernels
    launched by hq's C library are seen too, the profiler works at the CUDA driver level)."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    torch.manual_seed(0)
    x = torch.randn(n, n, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(n, n, device=device, dtype=dtype)
    mods = [("nn.Linear", nn.Linear(n, n, device=device, dtype=dtype))]
    mods += [(name, ht.Linear(n, n, device=device, recipe=r, name="bench")) for name, r in recipes]
    for name, m in mods:
        step = fwd_bwd(m, x, dy)
        for _ in range(warmup):
            step()
        sync(device)
        with profile(activities=acts) as prof:
            for _ in range(5):
                step()
            sync(device)
        print("# trace N=%d %s (5 steps)" % (n, name))
        print(prof.key_averages().table(sort_by="self_cuda_time_total" if device.type == "cuda"
                                        else "self_cpu_time_total", row_limit=14))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--sizes", default="256,512,1024,2048,4096,8192")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--recipe", action="append")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=200, help="timed steps per module")
    p.add_argument("--loop", type=int, default=20,
                   help="steps back to back per sample (median over iters/loop samples)")
    p.add_argument("--no-te", action="store_true")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (CPU)")
    p.add_argument("--trace", type=int, metavar="N",
                   help="after the table, each module's GPU kernels and host calls for one "
                        "step at size N (torch.profiler)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    dtype = getattr(torch, a.dtype)
    recipes = [("hq " + os.path.basename(r), hq.Recipe(r)) for r in (a.recipe or
                                                                    [hq.default_recipe()])]
    recipes.insert(0, ("hq bf16-identity", hq.Recipe.from_string(HP, "bf16-identity")))
    print("# hq %s, torch %s, %s%s, %s input, median of %d samples of %d steps (after %d warm-up)"
          % (hq.version(), torch.__version__, device,
             " (%s)" % torch.cuda.get_device_name(device) if device.type == "cuda" else "",
             a.dtype, max(1, a.iters // a.loop), a.loop, a.warmup))
    te_note = None
    print("%6s  %-34s %10s %8s %10s %8s" % ("N", "module", "ms", "vs nn", "host us",
                                             "vs nn"))
    for n in [int(s) for s in a.sizes.split(",")]:
        torch.manual_seed(0)
        x = torch.randn(n, n, device=device, dtype=dtype, requires_grad=True)
        dy = torch.randn(n, n, device=device, dtype=dtype)
        rows = [("nn.Linear", nn.Linear(n, n, device=device, dtype=dtype), None)]
        for name, r in recipes:
            # the weight stays FP32 master (as an optimizer holds it); hq quantizes it once and
            # reuses the copy while the parameter is unchanged (no optimizer step here)
            rows.append((name, ht.Linear(n, n, device=device, recipe=r, name="bench"), None))
        if not a.no_te and device.type == "cuda":
            extra, te_note = te_candidates(n, device, dtype)
            rows += extra
        base = None
        for name, m, cm in rows:
            try:
                ms, host = timeit(fwd_bwd(m, x, dy, cm), device, a.warmup, a.iters, a.loop)
            except Exception as e:  # noqa: BLE001 - report and go on with the next module
                print("%6d  %-34s %s" % (n, name, "failed: %s" % str(e).splitlines()[0]))
                continue
            base = (ms, host) if base is None else base
            print("%6d  %-34s %10.3f %7.2fx %10.1f %7.2fx"
                  % (n, name, ms, ms / base[0], host, host / base[1]), flush=True)
    if te_note:
        print("# " + te_note)
    if a.trace:
        trace(a.trace, device, dtype, recipes, a.warmup)


if __name__ == "__main__":
    sys.exit(main())
