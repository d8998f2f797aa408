#!/usr/bin/env python3
"""bench_peers.py -- what a user writes WITHOUT hq: the quantizations of hq's formats in plain
PyTorch, timed in eager mode and under torch.compile, beside a device-to-device copy measured in
the same run (the memory-bound ceiling), so that `hq bench --device cuda` can be compared with
them (scripts/gpu-check.sh --peers runs both in one call).

Peers (8192x8192 BF16 on cuda by default, both directions each):
  fp8_tensor  current scaling: amax of the tensor, scale = 448 / amax, cast to E4M3 rowwise and
              a transposed copy (columnwise)
  mxfp8       1x32 blocks, E8M0 scale = 2^ceil(log2(block_amax / 448)), E4M3 values; rowwise
              blocks along K, columnwise blocks down M (data not transposed)
  nvfp4       global amax -> global scale 448*6/amax; 1x16 blocks with E4M3 block scales, E2M1
              values (round to nearest even) packed two per byte; rowwise, and the transposed
              tensor for columnwise
  fp8_block   1x128 blocks, FP32 scales 448/block_amax, E4M3 values; rowwise, and the
              transposed tensor for columnwise
  mxfp4       torchao's MX cast (torchao.prototype.mx_formats.mx_tensor.to_mx, E2M1, FLOOR
              scales: the numerics hq's mxfp4 reproduces bit for bit); rowwise, and the
              transposed tensor for columnwise (hq keeps it untransposed: the same bytes)
  mxfp6       the same with FP6 E2M3 (unpacked: torchao stores one code a byte, 1.33x hq's
              bytes; the byte count below is torchao's)

Written here in plain PyTorch for this benchmark (a fair "user without hq" peer, not bit-exact
with any library), but for mxfp4 / mxfp6, which call torchao (skipped when it is not installed). Times: medians of --iters CUDA-event-timed samples after warm-up, a sample
being --batch calls back to back (default 10) divided by the batch, as `hq bench` times hq.
"% of copy" counts (b) the minimal bytes: input read once plus every output written once; "(a)"
also counts the second read of the input that a per-tensor amax costs (fp8_tensor, nvfp4), as
`hq bench` does.

usage: python3 scripts/bench_peers.py [--shape 8192x8192] [--iters 50] [--batch 10]
                                      [--json FILE]
                                      [--peers fp8_tensor,mxfp8,nvfp4,fp8_block,mxfp4,mxfp6]
                                      [--no-compile] [--hq-json FILE] [--check]
--hq-json FILE: the output of `hq bench --device cuda --json` from the same run; adds hq's
times beside the peers and its speed-up over torch.compile.
"""
import argparse
import json
import statistics
import sys
import time

E4M3_MAX = 448.0
E2M1_MAX = 6.0


# --- the peers: plain PyTorch ---------------------------------------------------------------

def fp8_tensor(x):
    """Per-tensor current scaling: rowwise E4M3 and its transposed copy."""
    amax = x.abs().amax().float()
    scale = torch.where(amax > 0, E4M3_MAX / amax, torch.ones_like(amax))
    q = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    qt = q.t().contiguous()
    return q, qt, 1.0 / scale


def _e8m0_scale(block_amax):
    """E8M0 biased exponent of 2^ceil(log2(amax / 448)) (clamped to [1, 254]) and 2^-exponent."""
    r = block_amax / E4M3_MAX
    bits = r.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    exp = exp + ((bits & 0x7FFFFF) != 0).to(torch.int32)  # round the power of two up
    exp = torch.where(block_amax > 0, exp, torch.full_like(exp, 127)).clamp(1, 254)
    inv = torch.exp2((127 - exp).float())
    return exp.to(torch.uint8), inv


def mxfp8(x):
    """MXFP8: rowwise 1x32 blocks along K, columnwise 32x1 blocks down M."""
    m, k = x.shape
    xf = x.float()
    rb = xf.view(m, k // 32, 32)
    rs, rinv = _e8m0_scale(rb.abs().amax(-1, keepdim=True))
    rq = (rb * rinv).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(m, k)
    cb = xf.view(m // 32, 32, k)
    cs, cinv = _e8m0_scale(cb.abs().amax(1, keepdim=True))
    cq = (cb * cinv).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(m, k)
    return rq, rs.view(m, k // 32), cq, cs.view(m // 32, k)


def _e2m1_pack(v):
    """Round to E2M1 (0, .5, 1, 1.5, 2, 3, 4, 6; nearest, ties to even) and pack 2 per byte."""
    a = v.abs()
    code = ((a > 0.25).to(torch.uint8) + (a >= 0.75).to(torch.uint8) + (a > 1.25).to(torch.uint8)
            + (a >= 1.75).to(torch.uint8) + (a > 2.5).to(torch.uint8)
            + (a >= 3.5).to(torch.uint8) + (a > 5.0).to(torch.uint8))
    code = code | ((v < 0).to(torch.uint8) << 3)
    return code[..., 0::2] | (code[..., 1::2] << 4)


def _nvfp4_dir(x2, global_scale):
    rows, cols = x2.shape
    b = x2.contiguous().float().view(rows, cols // 16, 16)
    bamax = b.abs().amax(-1, keepdim=True)
    s = (bamax / E2M1_MAX * global_scale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    sf = s.float()
    mult = torch.where(sf > 0, global_scale / sf, torch.zeros_like(sf))
    v = (b * mult).clamp(-E2M1_MAX, E2M1_MAX)
    return _e2m1_pack(v).view(rows, cols // 2), s.view(rows, cols // 16)


def nvfp4(x):
    """NVFP4: global amax, 1x16 blocks rowwise and on the transposed tensor."""
    amax = x.abs().amax().float()
    gs = torch.where(amax > 0, E4M3_MAX * E2M1_MAX / amax, torch.ones_like(amax))
    rq, rs = _nvfp4_dir(x, gs)
    cq, cs = _nvfp4_dir(x.t(), gs)
    return rq, rs, cq, cs, amax


def _block_dir(x2):
    rows, cols = x2.shape
    b = x2.contiguous().float().view(rows, cols // 128, 128)
    bamax = b.abs().amax(-1, keepdim=True)
    scale = torch.where(bamax > 0, E4M3_MAX / bamax, torch.ones_like(bamax))
    q = (b * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(rows, cols)
    return q, (1.0 / scale).view(rows, cols // 128)


def fp8_block(x):
    """FP8 block 1x128, FP32 scales: rowwise and on the transposed tensor."""
    rq, rs = _block_dir(x)
    cq, cs = _block_dir(x.t())
    return rq, rs, cq, cs


def _to_mx(x2, elem):
    from torchao.prototype.mx_formats.mx_tensor import to_mx
    s, q = to_mx(x2.contiguous(), elem, 32)
    return q, s


def mxfp4(x):
    """MXFP4 through torchao: rowwise, and the transposed tensor for columnwise."""
    rq, rs = _to_mx(x, torch.float4_e2m1fn_x2)
    cq, cs = _to_mx(x.t(), torch.float4_e2m1fn_x2)
    return rq, rs, cq, cs


def mxfp6(x):
    """MXFP6 (E2M3) through torchao: rowwise, and the transposed tensor for columnwise."""
    from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3
    rq, rs = _to_mx(x, DTYPE_FP6_E2M3)
    cq, cs = _to_mx(x.t(), DTYPE_FP6_E2M3)
    return rq, rs, cq, cs


def _torchao_ok():
    try:
        import torchao.prototype.mx_formats.mx_tensor  # noqa: F401
        return True
    except ImportError:
        return False


# --- dequantization, for --check (the peers compute the real thing) -------------------------

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e2m1_unpack(p):
    table = torch.tensor(E2M1_VALUES + [-v for v in E2M1_VALUES], device=p.device)
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).flatten(-2).long()
    return table[codes]


def dequantize(name, outs, m, k):
    """[(direction, dequantized [m, k] float tensor)] of a peer's outputs."""
    if name == "fp8_tensor":
        q, qt, sinv = outs
        return [("rowwise", q.float() * sinv), ("columnwise", qt.float().t() * sinv)]
    if name == "mxfp8":
        rq, rs, cq, cs = outs
        r = rq.float().view(m, k // 32, 32) * torch.exp2(rs.float() - 127).view(m, k // 32, 1)
        c = cq.float().view(m // 32, 32, k) * torch.exp2(cs.float() - 127).view(m // 32, 1, k)
        return [("rowwise", r.view(m, k)), ("columnwise", c.view(m, k))]
    if name == "nvfp4":
        rq, rs, cq, cs, amax = outs
        gs = E4M3_MAX * E2M1_MAX / amax

        def one(q, s, rows, cols):
            v = _e2m1_unpack(q).view(rows, cols // 16, 16)
            return (v * (s.float() / gs).view(rows, cols // 16, 1)).view(rows, cols)
        return [("rowwise", one(rq, rs, m, k)), ("columnwise", one(cq, cs, k, m).t())]
    if name == "fp8_block":
        rq, rs, cq, cs = outs

        def one(q, s, rows, cols):
            return (q.float().view(rows, cols // 128, 128) * s.view(rows, cols // 128, 1)).view(
                rows, cols)
        return [("rowwise", one(rq, rs, m, k)), ("columnwise", one(cq, cs, k, m).t())]
    if name in ("mxfp4", "mxfp6"):
        from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3
        from torchao.prototype.mx_formats.mx_tensor import to_dtype
        elem = torch.float4_e2m1fn_x2 if name == "mxfp4" else DTYPE_FP6_E2M3
        rq, rs, cq, cs = outs
        r = to_dtype(rq, rs, elem, 32, torch.float32)
        c = to_dtype(cq, cs, elem, 32, torch.float32)
        return [("rowwise", r.view(m, k)), ("columnwise", c.view(k, m).t())]
    return []


# (function, its hq bench configuration, input reads of (a): 2 when a per-tensor amax is computed)
PEERS = {
    "fp8_tensor": (fp8_tensor, "fp8_tensor", 2),
    "mxfp8": (mxfp8, "mxfp8", 1),
    "nvfp4": (nvfp4, "nvfp4", 2),
    "fp8_block": (fp8_block, "fp8_block block=1d", 1),
    "mxfp4": (mxfp4, "mxfp4", 1),
    "mxfp6": (mxfp6, "mxfp6", 1),
}


# --- timing -----------------------------------------------------------------------------------

def median_ms(fn, iters, warmup=5, batch=1):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    v = []
    for _ in range(iters):
        e0.record()
        for _ in range(batch):
            fn()
        e1.record()
        e1.synchronize()
        v.append(e0.elapsed_time(e1) / batch)
    return statistics.median(v)


def copy_bandwidth(iters):
    n = 1 << 30
    a = torch.ones(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a), max(iters // 2, 10), warmup=3)
    del a, b
    torch.cuda.empty_cache()
    return 2.0 * n / (ms * 1e-3), ms


def out_bytes(outs):
    return sum(t.numel() * t.element_size() for t in outs)


def hq_results(path):
    """{(format, dirs): result} from `hq bench --json`."""
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        print(f"bench_peers: --hq-json {path}: {e}", file=sys.stderr)
        return None, {}
    return d, {(r.get("format"), r.get("dirs")): r for r in d.get("results", []) if "median_ms" in r}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8192x8192")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--batch", type=int, default=10,
                    help="calls back to back per timed sample (1: each call alone)")
    ap.add_argument("--json", help="write the results as JSON to this file")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--no-compile", action="store_true", help="eager mode only")
    ap.add_argument("--hq-json", help="hq bench --device cuda --json output of the same run")
    ap.add_argument("--check", action="store_true",
                    help="dequantize each peer's output and print its relative RMS error")
    args = ap.parse_args()
    m, k = (int(s) for s in args.shape.lower().split("x"))
    if m % 128 or k % 128:
        ap.error("--shape: both sides must be multiples of 128")
    names = [p for p in args.peers.split(",") if p]
    for p in names:
        if p not in PEERS:
            ap.error(f"--peers: unknown peer '{p}' (known: {', '.join(PEERS)})")
    if not torch.cuda.is_available():
        print("bench_peers: no CUDA device", file=sys.stderr)
        return 77

    dev = torch.cuda.get_device_name()
    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    in_bytes = x.numel() * x.element_size()
    bw, copy_ms = copy_bandwidth(args.iters)
    res = {"device": dev, "torch": torch.__version__, "shape": [m, k], "dtype": "bf16",
           "iters": args.iters, "batch": args.batch, "copy_bandwidth_gbs": bw * 1e-9,
           "input_bytes": in_bytes,
           "peers": []}
    hq_doc, hq = hq_results(args.hq_json) if args.hq_json else (None, {})
    if hq_doc and hq_doc.get("copy_bandwidth_gbs"):
        res["hq_copy_bandwidth_gbs"] = hq_doc["copy_bandwidth_gbs"]

    def dump():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
                f.write("\n")

    print(f"bench_peers: {dev}, torch {torch.__version__}, input {m}x{k} bf16 "
          f"({in_bytes / 2**20:.1f} MiB), median of {args.iters} samples of {args.batch} "
          f"call(s) back to back")
    print(f"device-to-device copy (1 GiB, read+write): {bw * 1e-9:.0f} GB/s = the 100% mark")
    print("% of copy counts (b) the minimal bytes (input once + outputs); (a) adds the amax read")
    hdr = f"{'peer':<12} {'mode':<8} {'ms':>9} {'(b) MiB':>8} {'GB/s':>7} {'%copy':>6} {'%copy(a)':>8}"
    if hq:
        hdr += f" | {'hq ms':>8} {'hq %copy':>8} {'hq speed-up':>11}"
    print(hdr)
    dump()
    for name in names:
        fn, hq_fmt, reads_a = PEERS[name]
        if name in ("mxfp4", "mxfp6") and not _torchao_ok():
            print(f"{name:<12} skipped: torchao is not installed")
            continue
        outs = fn(x)
        ob = out_bytes(outs)
        if args.check:
            xf = x.float()
            errs = {d: ((v - xf).norm() / xf.norm()).item() for d, v in dequantize(name, outs, m, k)}
            print(f"{name:<12} check: relative RMS error " +
                  ", ".join(f"{d} {100 * e:.2f}%" for d, e in errs.items()))
            res.setdefault("check", {})[name] = errs
        bytes_b, bytes_a = in_bytes + ob, reads_a * in_bytes + ob
        modes = [("eager", fn)]
        if not args.no_compile:
            modes.append(("compile", torch.compile(fn, dynamic=False)))
        h = hq.get((hq_fmt, "both"))
        for mode, f in modes:
            entry = {"peer": name, "mode": mode, "hq_format": hq_fmt, "bytes_out": ob,
                     "bytes_b": bytes_b, "bytes_a": bytes_a}
            try:
                t0 = time.time()
                f(x)  # compiles under torch.compile
                torch.cuda.synchronize()
                entry["first_call_s"] = time.time() - t0
                ms = median_ms(lambda: f(x), args.iters, batch=args.batch)
            except Exception as e:  # a peer that fails is reported, the others still run
                entry["error"] = f"{type(e).__name__}: {e}"
                res["peers"].append(entry)
                print(f"{name:<12} {mode:<8} failed: {entry['error'][:200]}")
                dump()
                continue
            gbs = bytes_b / (ms * 1e-3)
            entry.update(median_ms=ms, gb_per_s=gbs * 1e-9, percent_of_copy=100 * gbs / bw,
                         percent_of_copy_a=100 * bytes_a / (ms * 1e-3) / bw)
            line = (f"{name:<12} {mode:<8} {ms:9.4f} {bytes_b / 2**20:8.1f} {gbs * 1e-9:7.1f} "
                    f"{entry['percent_of_copy']:5.1f}% {entry['percent_of_copy_a']:7.1f}%")
            if h:
                entry["hq_median_ms"] = h["median_ms"]
                entry["hq_percent_of_copy"] = h.get("percent_of_copy")
                entry["hq_speedup"] = ms / h["median_ms"]
                ga = h.get("caller_amax")
                if ga:
                    entry["hq_caller_amax_ms"] = ga["median_ms"]
                    entry["hq_caller_amax_speedup"] = ms / ga["median_ms"]
                line += (f" | {h['median_ms']:8.4f} {h.get('percent_of_copy') or 0:7.1f}% "
                         f"{entry['hq_speedup']:10.2f}x")
                if ga:
                    line += f" (given amax {entry['hq_caller_amax_speedup']:.2f}x)"
            elif hq:
                line += f" | {'(hq: ' + hq_fmt + ' not timed)':>30}"
            print(line, flush=True)
            res["peers"].append(entry)
            dump()
        del outs
        torch.cuda.empty_cache()
    dump()
    return 0


if __name__ == "__main__":
    try:
        import torch
    except ImportError:
        print("bench_peers: PyTorch is not installed", file=sys.stderr)
        sys.exit(77)
    sys.exit(main())
