#!/usr/bin/env python3
"""Host time of a forward + backward step of hq.torch.Linear against nn.Linear on the CPU, where
small shapes make the GEMMs negligible and what is left is the per-call work of the binding.

    python3 python/bench/host.py                      # N = 16, 256, 1024
    python3 python/bench/host.py --sizes 16 --rounds 30

Each row is thread CPU time per step (time.thread_time_ns: time other processes take from a
shared machine is not counted), the best of --rounds rounds of --steps steps; the rows take
their rounds in turn, so a change of load hits every row alike. One torch thread. Rows:
nn.Linear; the same layer as a Python torch.autograd.Function over torch's own GEMMs (the cost
any Python autograd Function has, the floor for hq.torch's); hq.torch.Linear with recipe=None,
with bf16 identity formats and with the installed recipe.ini (N a multiple of 32).
"""
import argparse
import sys
import time

import torch
from torch import nn

import hq
import hq.torch as ht

HP = ("[recipe]\nname = bf16-identity\n[format hp]\nplugin = identity\ndtype = bf16\n"
      "[role *:*:*]\nrowwise = hp\ncolumnwise = hp\n")


class _TorchFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return torch.addmm(b, x, w.t())

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return dy.mm(w), dy.t().mm(x), dy.sum(0)


class PyFunctionLinear(nn.Linear):
    def forward(self, x):
        return _TorchFn.apply(x, self.weight, self.bias)


def step_of(m, x, dy):
    def step():
        x.grad = None
        m.weight.grad = m.bias.grad = None
        m(x).backward(dy)
    return step


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16,256,1024")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=0,
                   help="steps per round (default: about 0.1 s of nn.Linear's)")
    p.add_argument("--warmup", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, a.dtype)
    print("# hq %s, torch %s, CPU, one thread, %s input: thread CPU time per forward + backward,"
          " best of %d rounds" % (hq.version(), torch.__version__, a.dtype, a.rounds))
    print("%6s  %-28s %12s %8s" % ("N", "module", "us", "vs nn"))
    for n in [int(s) for s in a.sizes.split(",")]:
        torch.manual_seed(0)
        x = torch.randn(n, n, dtype=dtype, requires_grad=True)
        dy = torch.randn(n, n, dtype=dtype)
        rows = [("nn.Linear", nn.Linear(n, n, dtype=dtype)),
                ("Python Function, torch GEMMs", PyFunctionLinear(n, n, dtype=dtype)),
                ("hq recipe=None", ht.Linear(n, n, name="host")),
                ("hq bf16-identity", ht.Linear(n, n, name="host",
                                               recipe=hq.Recipe.from_string(HP, "hp")))]
        if n % 32 == 0:
            rows.append(("hq recipe.ini", ht.Linear(n, n, name="host",
                                                    recipe=hq.Recipe(hq.default_recipe()))))
        steps = [step_of(m, x, dy) for _, m in rows]
        for s in steps:
            for _ in range(a.warmup):
                s()
        count = a.steps
        if not count:
            t = time.thread_time_ns()
            steps[0]()
            count = max(1, int(1e8 / max(1, time.thread_time_ns() - t)))
        best = [float("inf")] * len(rows)
        for _ in range(a.rounds):
            for i, s in enumerate(steps):
                t = time.thread_time_ns()
                for _ in range(count):
                    s()
                best[i] = min(best[i], (time.thread_time_ns() - t) / count / 1e3)
        for (name, _), us in zip(rows, best):
            print("%6d  %-28s %12.1f %7.2fx" % (n, name, us, us / best[0]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
