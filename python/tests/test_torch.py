"""hq.torch: Linear and convert. Identity formats against a float64 reference; quantized
formats bit for bit against the C library's linear GEMMs called directly (hq.linear_*)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import hq                                  # noqa: E402
import hq.torch as ht                      # noqa: E402
from conftest import RECIPES               # noqa: E402
from torch import nn                       # noqa: E402

RECIPE_IDS = [p.stem for p in RECIPES]


def _f64_reference(x, w, b, dy):
    x64, w64, dy64 = (t.detach().double() for t in (x, w, dy))
    return x64 @ w64.T + b.detach().double(), dy64 @ w64, dy64.T @ x64, dy64.sum(0)


def test_identity_linear_matches_float64():
    torch.manual_seed(0)
    m = ht.Linear(96, 48, name="fc")
    x = torch.randn(2, 32, 96, requires_grad=True)   # leading dims flattened to 64 tokens
    y = m(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    ry, rdx, rdw, rdb = _f64_reference(x.reshape(-1, 96), m.weight, m.bias, dy.reshape(-1, 48))
    assert y.shape == (2, 32, 48) and y.dtype == torch.float32
    torch.testing.assert_close(y.reshape(-1, 48).double(), ry, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.reshape(-1, 96).double(), rdx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.weight.grad.double(), rdw, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(m.bias.grad.double(), rdb, rtol=1e-5, atol=1e-5)


def test_identity_linear_gradcheck_style_no_bias_bf16_input():
    torch.manual_seed(1)
    m = ht.Linear(64, 32, bias=False)
    x = torch.randn(32, 64).bfloat16().requires_grad_()
    y = m(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    ref = x.detach().double() @ m.weight.detach().double().T
    torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2)
    assert x.grad.dtype == torch.bfloat16
    torch.testing.assert_close(m.weight.grad.double(), x.detach().double().sum(0).expand(32, 64),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_quantized_linear_bit_identical_to_c_gemms(recipe):
    torch.manual_seed(2)
    name = "blocks.0.fc"
    r = hq.Recipe(recipe)
    m = ht.Linear(128, 128, recipe=r, name=name)
    x = torch.randn(128, 128, requires_grad=True)
    dy = torch.randn(128, 128)
    ctx = ht.context("cpu")
    ctx.rng_offset = 0                    # the stochastic rounding stream restarts, as below
    y = m(x)
    y.backward(dy)
    # the same three GEMMs through the C library, on a fresh context with the same seed
    with hq.Context(seed=ctx.seed) as c:
        st = hq.State(r, c)
        qx = r.quantizer(("linear", "input", name), st).quantize(c, x.detach())
        qw = r.quantizer(("linear", "weight", name), st).quantize(c, m.weight.detach())
        qdy = r.quantizer(("linear", "grad_output", name), st).quantize(c, dy)
        ry = torch.empty(128, 128)
        hq.linear_fprop(c, qx, qw, ry, bias=m.bias.detach())
        rdx = torch.empty(128, 128)
        hq.linear_dgrad(c, qdy, qw, rdx)
        rdw = torch.empty(128, 128)
        hq.linear_wgrad(c, qx, qdy, rdw)
    assert torch.equal(y.detach(), ry)
    assert torch.equal(x.grad, rdx)
    assert torch.equal(m.weight.grad, rdw)
    assert torch.equal(m.bias.grad, dy.sum(0))


def test_weight_quantized_once_per_optimizer_step():
    r = hq.Recipe.from_string("[format mx]\nplugin = mxfp8\n[role linear:weight:*]\n"
                              "rowwise = mx\ncolumnwise = mx\n")
    torch.manual_seed(3)
    m = ht.Linear(64, 64, recipe=r, name="w")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    m(x).sum().backward()
    qw = m.hq_weight()
    data = next(b for b in qw.buffers() if b.name == "data")
    ptr, before = data.ptr, data.numpy().copy()
    m(x).sum().backward()                       # no step: the same quantized weight
    assert m.hq_weight() is qw and np.array_equal(data.numpy(), before)
    opt.step()                                  # the parameter changes in place...
    m(x)
    assert m.hq_weight() is qw                  # ...and is written back into the same buffers
    after = next(b for b in qw.buffers() if b.name == "data")
    assert after.ptr == ptr and not np.array_equal(after.numpy(), before)
    with hq.Context() as c:                     # with the bytes of a fresh quantize
        fresh = r.quantizer("linear:weight:w").quantize(c, m.weight.detach())
        for a, b in zip(qw.buffers(hq.ROWWISE) + qw.buffers(hq.COLWISE),
                        fresh.buffers(hq.ROWWISE) + fresh.buffers(hq.COLWISE)):
            assert np.array_equal(a.numpy(), b.numpy()), a.name


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(64, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))

    def forward(self, x):
        return x + self.mlp(self.attn(x))


def _model():
    torch.manual_seed(4)
    return nn.Sequential(_Block(), _Block(), nn.Linear(64, 32))


def test_convert_in_place_names_roles_by_module_path():
    text = ("[format mx]\nplugin = mxfp8\n[format f8]\nplugin = fp8_tensor\n"
            "[role linear:weight:*.mlp.*]\nrowwise = mx\ncolumnwise = mx\n"
            "[role linear:weight:2]\nrowwise = f8\ncolumnwise = f8\n")
    model = _model()
    ref = _model()
    params = [id(p) for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ht.convert(model, text)
    assert model.hq_converted == 7
    assert [id(p) for p in model.parameters()] == params       # optimizer still valid
    names = [m.hq_name for m in model.modules() if isinstance(m, ht.Linear)]
    assert names == ["0.attn", "0.mlp.0", "0.mlp.2", "1.attn", "1.mlp.0", "1.mlp.2", "2"]
    x = torch.randn(32, 64)
    # an identity-format layer computes what nn.Linear does (up to FP32 summation order)
    torch.testing.assert_close(model[0].attn(x), ref[0].attn(x))
    model(x).sum().backward()
    opt.step()
    fmt = {m.hq_name: m.hq_weight().format(hq.ROWWISE) for m in model.modules()
           if isinstance(m, ht.Linear)}
    assert fmt == {"0.attn": "identity", "0.mlp.0": "mx", "0.mlp.2": "mx", "1.attn": "identity",
                   "1.mlp.0": "mx", "1.mlp.2": "mx", "2": "f8"}


def test_torch_compile_graph_break_does_not_fail():
    model = ht.convert(_model(), None)
    x = torch.randn(32, 64)
    eager = model(x)
    compiled = torch.compile(model, backend="aot_eager")
    y = compiled(x)
    torch.testing.assert_close(y, eager)
    y.sum().backward()
    assert model[2].weight.grad is not None


def test_bad_input_names_argument():
    m = ht.Linear(64, 32, name="fc")
    with pytest.raises(hq.InvalidArgument, match=r"input: dtype torch.float64"):
        m(torch.zeros(4, 64, dtype=torch.float64))
    with pytest.raises(hq.InvalidArgument, match=r"input: dtype torch.int64"):
        m(torch.zeros(4, 64, dtype=torch.int64))
    with pytest.raises(hq.InvalidArgument, match=r"input: shape \[4, 63\]; expected \[..., 64\]"):
        m(torch.zeros(4, 63))
    with pytest.raises(hq.InvalidArgument, match="input: on meta"):
        m(torch.zeros(4, 64, device="meta"))
    with pytest.raises(hq.InvalidArgument, match="recipe: expected"):
        ht.Linear(4, 4, recipe=42)
    with pytest.raises(hq.ParseError, match="e9m9"):
        ht.Linear(4, 4, recipe="[format a]\nplugin = mxfp8\ndtype = e9m9\n")


def test_non_contiguous_input_is_copied_but_raw_api_refuses():
    m = ht.Linear(64, 32)
    x = torch.randn(64, 128)[:, ::2]
    assert not x.is_contiguous()
    torch.testing.assert_close(m(x), m(x.contiguous()))
    with pytest.raises(hq.InvalidArgument, match=r"x: not contiguous \(strides \(128, 2\)\)"):
        hq.linear_fprop(ht.context(), x, m.weight.detach(), torch.empty(64, 32))


def test_raw_api_takes_tensors_zero_copy():
    x = torch.randn(32, 32)
    v = hq.as_tensor(x, "x")
    assert int(hq._core.ffi.cast("uintptr_t", v.t.data)) == x.data_ptr()
    with pytest.raises(hq.InvalidArgument, match="y: an output must not be a leaf"):
        hq.linear_fprop(ht.context(), x, x, torch.empty(32, 32, requires_grad=True))
    # any other DLPack producer is taken through torch.from_dlpack, still without a copy

    class Producer:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    a = np.ones((32, 32), np.float32)
    v = hq.as_tensor(Producer(a), "a")
    assert int(hq._core.ffi.cast("uintptr_t", v.t.data)) == a.ctypes.data


@pytest.mark.cuda
def test_cuda_linear_bit_identical_on_current_stream():
    r = hq.Recipe(RECIPES[0])
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        m = ht.Linear(256, 256, recipe=r, name="fc", device="cuda")
        x = torch.randn(256, 256, device="cuda", requires_grad=True)
        ctx = ht.context("cuda")
        assert ctx.stream == s.cuda_stream
        ctx.rng_offset = 0
        y = m(x)
        with hq.Context("cuda:0", s, seed=ctx.seed) as c:
            st = hq.State(r, c)
            qx = r.quantizer("linear:input:fc", st).quantize(c, x.detach())
            qw = r.quantizer("linear:weight:fc", st).quantize(c, m.weight.detach())
            ry = torch.empty(256, 256, device="cuda")
            hq.linear_fprop(c, qx, qw, ry, bias=m.bias.detach())
        assert torch.equal(y.detach(), ry)
    with pytest.raises(hq.InvalidArgument, match="input: on cpu"):
        m(torch.zeros(4, 256))


def test_buffer_as_torch_tensor_aliases_hq_memory():
    # the MXFP8 block of test_core: scale 2^0, so the E4M3 codes are the values themselves
    row = torch.zeros(32)
    row[:5] = torch.tensor([256.0, 1.0, -2.0, 0.5, 0.0])
    r = hq.Recipe.from_string("[format mx]\nplugin = mxfp8\n[role *:*:*]\nrowwise = mx\n")
    qt = r.quantizer("linear:input:a").quantize(ht.context(), row.expand(32, 32).contiguous(),
                                                hq.ROWWISE)
    data, scale = qt.buffers(hq.ROWWISE)
    t = data.torch()
    assert t.dtype == torch.float8_e4m3fn and t.data_ptr() == data.ptr
    assert torch.equal(t.float(), row.expand(32, 32))
    s = scale.torch()
    assert s.dtype == torch.float8_e8m0fnu and s.shape == scale.shape
    # one scale 2^0 per row's single block; the rest is the layout's padding (zero bytes)
    assert torch.equal(s.float()[:32, 0], torch.ones(32))
    assert int((s.view(torch.uint8) != 0).sum()) == 32


def test_gpt_example_runs(tmp_path):
    import os
    import subprocess
    import sys
    from conftest import CONF, TOP
    words = "/usr/share/dict/words"
    if not os.path.exists(words):
        pytest.skip("no %s (Debian package wamerican)" % words)
    out = subprocess.run([sys.executable, str(TOP / "python" / "examples" / "gpt.py"),
                          "--steps", "3", "--log-every", "3", "--eval-tokens", "1024",
                          "--threads", "1", "--recipe", str(CONF / "recipe.ini")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert ["recipe", "train", "loss", "eval", "loss", "gap", "vs", "base", "time",
            "tokens/s"] in rows
    base = next(r for r in rows if r[:1] == ["fp32"])
    hqrun = next(r for r in rows if r[:1] == ["mxfp8-forward-nvfp4-backward"])
    assert "(baseline)" in base and float(hqrun[2]) < 3.3   # eval loss below a uniform guess
