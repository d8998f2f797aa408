#!/usr/bin/env python3
"""A small GPT (nanoGPT's model) trained on the system word list, once in FP32 and once per
hq recipe, every nn.Linear swapped for hq.torch.Linear by hq.torch.convert; prints the loss
table as `hq train` does.

    python3 python/examples/gpt.py                      # FP32 + every installed recipe, CPU
    python3 python/examples/gpt.py --recipe A.ini --recipe B.ini --steps 500
    python3 python/examples/gpt.py --device cuda --n-layer 6 --n-embd 384 --steps 2000

Data: the words of /usr/share/dict/words (Debian package wamerican) made only of a-z, shuffled
with the seed and split 90 / 10 into training and held-out words, as `hq train` does; each
split becomes one stream of characters with '.' between words, and the model predicts the next
character from up to --block previous ones. Vocabulary: '.' and a-z (27 tokens; lm_head has 128
rows, the padding never trained towards, so every GEMM dimension is a multiple of 128).
"""
import argparse
import glob
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

try:
    import hq
    import hq.torch as ht
except ImportError as e:  # pragma: no cover
    sys.exit("gpt.py: %s (install the package: scripts/install.sh)" % e)

VOCAB = 27
VOCAB_PAD = 128


def load_words(path, seed):
    with open(path, encoding="utf-8", errors="replace") as f:
        words = [w for w in f.read().split() if w.isascii() and w.isalpha() and w.islower()]
    random.Random(seed).shuffle(words)
    n = len(words) * 9 // 10
    enc = lambda ws: torch.tensor([0] + [t for w in ws for t in [ord(c) - 96 for c in w] + [0]],
                                  dtype=torch.long)
    return enc(words[:n]), enc(words[n:]), len(words)


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_embd, n_head, block):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, n_embd), wpe=nn.Embedding(block, n_embd),
            h=nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer)),
            ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, VOCAB_PAD, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for blk in self.transformer.h:
            x = blk(x)
        logits = self.lm_head(self.transformer.ln_f(x))[..., :VOCAB]
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def batch(data, gen, b, t, device):
    ix = torch.randint(len(data) - t - 1, (b,), generator=gen)
    x = torch.stack([data[i:i + t] for i in ix])
    y = torch.stack([data[i + 1:i + t + 1] for i in ix])
    return x.to(device), y.to(device)


@torch.no_grad()
def evaluate(model, data, a):
    model.eval()
    n = min((len(data) - 1) // a.block, a.eval_tokens // a.block)
    total, count = 0.0, 0
    xs = data[:n * a.block].view(n, a.block)
    ys = data[1:n * a.block + 1].view(n, a.block)
    for i in range(0, n - a.batch + 1, a.batch):
        total += model(xs[i:i + a.batch].to(a.device), ys[i:i + a.batch].to(a.device)).item()
        count += 1
    model.train()
    return total / count, count * a.batch * a.block


def run(name, recipe, train, held, a):
    torch.manual_seed(a.seed)
    model = GPT(a.n_layer, a.n_embd, a.n_head, a.block).to(a.device)
    if recipe is not None:
        ht.convert(model, recipe)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)
    warm = max(1, a.steps // 20)
    losses = []
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        # linear warmup over 5 % of the steps, cosine decay to lr / 10 (as hq train)
        f = step / warm if step <= warm else 0.1 + 0.45 * (1 + math.cos(
            math.pi * (step - warm) / max(1, a.steps - warm)))
        for g in opt.param_groups:
            g["lr"] = a.lr * f
        x, y = batch(train, gen, a.batch, a.block, a.device)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if recipe is not None:
            ht.update_scaling()          # delayed scaling's amax history (no-op otherwise)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            raise SystemExit("gpt.py: %s: the train loss is %s at step %d" % (name, losses[-1], step))
        if a.verbose and (step % a.log_every == 0 or step == a.steps):
            print("  %-28s step %5d  loss %.4f" % (name, step, losses[-1]), flush=True)
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    ev, n_eval = evaluate(model, held, a)
    tail = losses[-a.log_every:]
    return dict(name=name, train=sum(tail) / len(tail), eval=ev, secs=secs,
                rate=a.steps * a.batch * a.block / secs, n_eval=n_eval,
                params=sum(p.numel() for p in model.parameters()))


def fmt_rate(r):
    return "%.1fM" % (r / 1e6) if r >= 1e6 else "%.1fk" % (r / 1e3) if r >= 1e3 else "%.0f" % r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", action="append", help="a recipe (repeatable; default: the "
                   "installed recipe.ini and every installed example recipe)")
    p.add_argument("--no-baseline", action="store_true", help="skip the FP32 run")
    p.add_argument("--data", default="/usr/share/dict/words")
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-tokens", type=int, default=16384,
                   help="held-out tokens evaluated after the last step")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.batch * a.block % 128 or a.n_embd % 128:
        p.error("--batch x --block and --n-embd must be multiples of 128 (the formats' blocks)")
    if not os.path.exists(a.data):
        sys.exit("gpt.py: %s: no such file -- the system word list; install the Debian "
                 "package wamerican, or pass --data FILE" % a.data)
    recipes = a.recipe or [hq.default_recipe()] + sorted(
        glob.glob(os.path.join(os.path.dirname(hq.default_recipe()), "examples", "*.ini")))
    train, held, nwords = load_words(a.data, a.seed)
    print("gpt.py: %d words (%d / %d characters train / held out), %d layers, d %d, %d heads, "
          "block %d, batch %d, %d steps, %s, hq %s" % (nwords, len(train), len(held), a.n_layer,
                                                      a.n_embd, a.n_head, a.block, a.batch,
                                                      a.steps, a.device, hq.version()), flush=True)
    runs = []
    if not a.no_baseline:
        runs.append(run("fp32 (torch nn.Linear)", None, train, held, a))
    for path in recipes:
        r = hq.Recipe(path)
        runs.append(run(r.name or os.path.basename(path), r, train, held, a))
        print("  done: %-28s %.1fs" % (runs[-1]["name"], runs[-1]["secs"]), flush=True)
    print("model: %d parameters" % runs[0]["params"])
    base = runs[0]["eval"]
    print("\n%-30s %10s %10s %12s %8s %10s" % ("recipe", "train loss", "eval loss",
                                              "gap vs base", "time", "tokens/s"))
    for i, r in enumerate(runs):
        gap = "(baseline)" if i == 0 else "%+.4f" % (r["eval"] - base)
        print("%-30s %10.4f %10.4f %12s %8s %10s" % (r["name"], r["train"], r["eval"], gap,
                                                      "%.1fs" % r["secs"], fmt_rate(r["rate"])))
    print("\ntrain loss: mean of the last %d steps; eval loss: the held-out stream (%d tokens) "
          "after the last step; gap: eval loss minus the baseline's (%s); ln(27) = 3.2958 is a "
          "uniform guess" % (a.log_every, runs[0]["n_eval"], runs[0]["name"]))


if __name__ == "__main__":
    main()
