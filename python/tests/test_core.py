"""The bindings (hq): contexts, recipes, quantizers, buffers, GEMMs, AdamW, checkpoints,
errors. Expectations are computed by hand or by NumPy in float64, never by hq itself."""
import gc
import json
import struct

import numpy as np
import pytest

import hq
from conftest import CONF

try:
    import ml_dtypes          # NumPy's bfloat16; only the bf16 tests need it
except ImportError:
    ml_dtypes = None
needs_bf16 = pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes (NumPy bfloat16) missing")

MX = "[format mx]\nplugin = mxfp8\ndtype = e4m3\n[role linear:*:*]\nrowwise = mx\ncolumnwise = mx\n"


@pytest.fixture
def ctx():
    with hq.Context() as c:
        yield c


def test_info_lists_formats_and_providers():
    i = hq.info()
    assert i["version"] == hq.version() == hq.__version__
    names = {f["name"] for f in i["formats"]}
    assert {"identity", "fp8_tensor", "mxfp8", "nvfp4", "fp8_block"} <= names
    assert [g["name"] for g in i["gemm_providers"]][-1] == "emulated"
    assert len(i["devices"]) == hq.device_count()


def test_recipe_file_and_string():
    r = hq.Recipe(CONF / "recipe.ini")
    assert r.name == "mxfp8-forward-nvfp4-backward"
    assert r.path.endswith("recipe.ini")
    q = r.quantizer("linear:weight:fc1")
    assert (q.format(hq.ROWWISE), q.format(hq.COLWISE)) == ("mx", "nv_w")
    assert (q.plugin(hq.ROWWISE), q.plugin(hq.COLWISE)) == ("mxfp8", "nvfp4")
    # the more specific lm_head section wins for its input
    q2 = r.quantizer(("linear", "input", "lm_head"))
    assert q2.plugin(hq.ROWWISE) == "identity"
    s = hq.Recipe.from_string(MX, "mx-string")
    assert [x["pattern"] for x in s.roles()] == ["linear:*:*"]


def test_recipe_errors_are_listed():
    text = "[format a]\nplugin = mxfp8\ndtype = e9m9\n[role nope]\nrowwise = a\n"
    with pytest.raises(hq.ParseError) as e:
        hq.Recipe.from_string(text, "bad.ini")
    assert e.value.status == 5
    assert len(e.value.errors) == 2
    assert e.value.errors[0].startswith("bad.ini:3:") and "e9m9" in e.value.errors[0]
    assert e.value.errors[1].startswith("bad.ini:4:")
    kept = hq.Recipe.from_string(text, "bad.ini", parse_only=True)
    assert kept.errors == e.value.errors


def test_missing_recipe_file():
    with pytest.raises(hq.Error) as e:
        hq.Recipe("/nonexistent/recipe.ini")
    assert "/nonexistent/recipe.ini" in str(e.value)


def test_unmatched_error_names_role():
    r = hq.Recipe.from_string(MX, "mx", unmatched="error")
    with pytest.raises(hq.NotFound) as e:
        r.quantizer("dpa:query:x")
    assert "dpa:query:x" in str(e.value)


def _mx_row():
    # one 32-element block with amax 256 = 2^8: E8M0 scale 2^(8 - 8) = 1 (code 127), every
    # value exact in E4M3: 256 -> 0x78, 1 -> 0x38, -2 -> 0xC0, 0.5 -> 0x30, 0 -> 0x00
    row = np.zeros(32, np.float32)
    row[:5] = [256.0, 1.0, -2.0, 0.5, 0.0]
    return row, [0x78, 0x38, 0xC0, 0x30, 0x00], 127


def test_mxfp8_buffers_hand_computed(ctx):
    row, codes, scale = _mx_row()
    x = np.tile(row, (32, 1))
    qt = hq.Recipe.from_string(MX).quantizer("linear:input:a").quantize(ctx, x, hq.ROWWISE)
    assert qt.dirs == hq.ROWWISE and qt.shape == (32, 32)
    bufs = {b.name: b for b in qt.buffers(hq.ROWWISE)}
    data = bufs["data"].numpy()
    assert data.shape == (32, 32) and data.dtype == np.uint8
    assert list(data[0, :5]) == codes and not data[0, 5:].any()
    assert bufs["scale_inv"].numpy()[0, 0] == scale
    np.testing.assert_array_equal(qt.dequantize(), x)
    with pytest.raises(hq.StateError, match="columnwise"):
        qt.buffers(hq.COLWISE)


def test_buffers_alias_hq_memory(ctx):
    row, _, _ = _mx_row()
    qt = hq.Recipe.from_string(MX).quantizer("linear:input:a").quantize(ctx, np.tile(row, (32, 1)))
    data = next(b for b in qt.buffers() if b.name == "data")
    view = np.asarray(data)
    assert view.ctypes.data == data.ptr
    view[0, 1] = 0x40          # E4M3 2.0 written into hq's buffer...
    assert qt.dequantize()[0, 1] == 2.0   # ...is what hq reads back


@needs_bf16
def test_quantize_reads_caller_memory_in_place(ctx):
    x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 64
    v = hq.as_tensor(x, "x")
    assert int(hq._core.ffi.cast("uintptr_t", v.t.data)) == x.ctypes.data
    assert (v.t.rows, v.t.cols) == (64, 32)
    y = np.ones((2, 4, 8), ml_dtypes.bfloat16)
    v = hq.as_tensor(y, "y")
    assert (v.t.rows, v.t.cols, v.t.dtype) == (8, 8, hq._core.lib.HQ_BF16)


@needs_bf16
def test_identity_update_and_dequantize_bf16(ctx):
    q = hq.Recipe.from_string("[recipe]\nname = hp\n").quantizer("linear:weight:w")
    x = np.linspace(-3, 3, 16 * 64, dtype=np.float32).reshape(16, 64)
    qt = q.quantize(ctx, x)
    np.testing.assert_array_equal(qt.dequantize(hq.COLWISE), x)
    qt.update(x * 2)
    np.testing.assert_array_equal(qt.dequantize(hq.ROWWISE), x * 2)
    out = qt.dequantize(dtype="bfloat16")
    np.testing.assert_array_equal(out, (x * 2).astype(ml_dtypes.bfloat16))


def test_linear_gemms_identity_match_float64(ctx):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    w = rng.standard_normal((32, 96)).astype(np.float32)
    dy = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    y = np.empty((64, 32), np.float32)
    info = hq.linear_fprop(ctx, x, w, y, bias=b, info=True)
    assert (info["m"], info["n"], info["k"]) == (32, 64, 96)
    x64, w64, dy64 = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    np.testing.assert_allclose(y, x64 @ w64.T + b, rtol=1e-5, atol=1e-5)
    dx = np.empty((64, 96), np.float32)
    hq.linear_dgrad(ctx, dy, w, dx)
    np.testing.assert_allclose(dx, dy64 @ w64, rtol=1e-5, atol=1e-5)
    dw = np.ones((32, 96), np.float32)
    hq.linear_wgrad(ctx, x, dy, dw, accumulate=True)
    np.testing.assert_allclose(dw, dy64.T @ x64 + 1, rtol=1e-5, atol=1e-4)


def test_gemm_column_major_convention(ctx):
    # D[n, m] row-major = B' A'^T with transa: A' = A ([m, k]); transb = 0: B' = B ([n, k])
    a = np.array([[1, 2], [3, 4], [5, 6]], np.float32)    # [m=3, k=2]
    b = np.array([[1, 0], [0, 1]], np.float32)            # [n=2, k=2]
    d = np.zeros((2, 3), np.float32)
    hq.gemm(ctx, a, True, b, False, d)
    np.testing.assert_array_equal(d, [[1, 3, 5], [2, 4, 6]])
    hq.gemm(ctx, a, True, b, False, d, alpha=2.0, beta=1.0)
    np.testing.assert_array_equal(d, [[3, 9, 15], [6, 12, 18]])


def test_quantized_gemm_equals_product_of_dequantized(ctx):
    rng = np.random.default_rng(2)
    r = hq.Recipe.from_string(MX)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    qx = r.quantizer("linear:input:l").quantize(ctx, x)
    qw = r.quantizer("linear:weight:l").quantize(ctx, w)
    y = np.empty((64, 32), np.float32)
    hq.linear_fprop(ctx, qx, qw, y)
    ref = qx.dequantize().astype(np.float64) @ qw.dequantize().astype(np.float64).T
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)


def test_adam_step_hand_computed(ctx):
    w = np.array([[1.0, -2.0]], np.float32)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    g = np.array([[0.5, 0.25]], np.float32)
    q = hq.Recipe.from_string("[recipe]\nname = hp\n").quantizer("linear:weight:w")
    qw = q.quantize(ctx, w)
    hq.adam_step(ctx, g, w, m, v, qw, lr=0.1, step=1, beta1=0.5, beta2=0.75, eps=1e-8)
    # betas whose 1 - b is exact: m = g/2 = [.25, .125], v = g^2/4 = [.0625, .015625];
    # c1 = 2, c2 = 4: m c1 = g, sqrt(v c2) = |g| (+1e-8 rounds away in FP32), so w -= 0.1 * 1
    np.testing.assert_array_equal(m, [[0.25, 0.125]])
    np.testing.assert_array_equal(v, [[0.0625, 0.015625]])
    lr = np.float32(0.1)
    np.testing.assert_array_equal(w, [[np.float32(1) - lr, np.float32(-2) - lr]])
    np.testing.assert_array_equal(qw.dequantize(), w)  # the quantized copy written back


def test_checkpoint_roundtrip(ctx, tmp_path):
    r = hq.Recipe.from_string(MX)
    q = r.quantizer("linear:weight:fc")
    x = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
    qt = q.quantize(ctx, x)
    master = x.copy()
    path = tmp_path / "ck.safetensors"
    with hq.CheckpointWriter(path) as wr:
        wr.add_qtensor("fc.weight", qt)
        wr.add_tensor("fc.master", master, ctx)
        wr.add_meta("step", "7")
    back = q.empty(ctx, 64, 64)
    loaded = np.zeros_like(master)
    with hq.Checkpoint(path) as ck:
        assert ck.meta("step") == "7"
        # MXFP8 (formats.md: e4m3 data, e8m0 scales padded to [roundup(M, 128),
        # roundup(K/32, 4)] and, columnwise, [roundup(M/32, 4), roundup(K, 128)])
        assert ck.entries() == {"fc.weight/data": ("F8_E4M3", (64, 64)),
                                "fc.weight/scale_inv": ("U8", (128, 4)),
                                "fc.weight/columnwise_data": ("F8_E4M3", (64, 64)),
                                "fc.weight/columnwise_scale_inv": ("U8", (4, 128)),
                                "fc.master": ("F32", (64, 64))}
        assert ck.verify() == 64 * 64 + 128 * 4 + 64 * 64 + 4 * 128 + 64 * 64 * 4
        ck.load_qtensor("fc.weight", back)
        ck.load_tensor("fc.master", loaded, ctx)
        with pytest.raises(hq.NotFound):
            ck.load_tensor("nope", loaded, ctx)
    for a, b in zip(qt.buffers(hq.ROWWISE) + qt.buffers(hq.COLWISE),
                    back.buffers(hq.ROWWISE) + back.buffers(hq.COLWISE)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(loaded, master)


def test_checkpoint_foreign(ctx, tmp_path):
    # a safetensors file another tool wrote: no checksums, a 3-D F16 stack
    stack = (np.arange(2 * 3 * 4, dtype=np.float32) - 7.5).astype(np.float16).reshape(2, 3, 4)
    h = json.dumps({"stack": {"dtype": "F16", "shape": [2, 3, 4], "data_offsets": [0, 48]}})
    h += " " * (-len(h) % 8)
    path = tmp_path / "foreign.safetensors"
    path.write_bytes(struct.pack("<Q", len(h)) + h.encode() + stack.tobytes())
    with pytest.raises(hq.Error, match="has no checksums"):
        hq.Checkpoint(path)
    with hq.Checkpoint(path, verify=False) as ck:
        assert ck.entries() == {"stack": ("F16", (2, 3, 4))}
        with pytest.raises(hq.NotSupported, match="HQ_CKPT_NO_VERIFY"):
            ck.verify()
        flat = np.zeros((6, 4), np.float16)  # [2, 3, 4] loads as [2 * 3, 4]
        ck.load_tensor("stack", flat, ctx)
    np.testing.assert_array_equal(flat, stack.reshape(6, 4))


def test_delayed_scaling_state(ctx):
    r = hq.Recipe(CONF / "examples" / "fp8_delayed.ini")
    st = hq.State(r, ctx)
    q = r.quantizer("linear:input:fc1", state=st)
    x = np.full((16, 16), 2.0, np.float32)
    q.quantize(ctx, x)
    ptr, n = st.amaxes()
    assert n == 1 and ptr != 0
    st.update()
    unbound = r.quantizer("linear:input:fc2")
    with pytest.raises(hq.StateError, match="linear:input:fc2"):
        unbound.quantize(ctx, x)


# --- bad input -------------------------------------------------------------------------------

def test_bad_dtype_names_argument(ctx):
    q = hq.Recipe.from_string(MX).quantizer("linear:input:a")
    with pytest.raises(hq.InvalidArgument) as e:
        q.quantize(ctx, np.zeros((32, 32), np.float64))
    assert e.value.argument == "src" and "float64" in str(e.value)


def test_non_contiguous_names_argument(ctx):
    x = np.zeros((64, 32), np.float32)
    with pytest.raises(hq.InvalidArgument, match="x: not contiguous"):
        hq.linear_fprop(ctx, x[:, ::2], np.zeros((8, 16), np.float32),
                        np.zeros((64, 8), np.float32))
    with pytest.raises(hq.InvalidArgument, match="w: not contiguous"):
        hq.linear_fprop(ctx, np.zeros((64, 16), np.float32),
                        np.zeros((16, 8), np.float32).T, np.zeros((64, 8), np.float32))


def test_bad_shape_names_argument(ctx):
    x = np.zeros((64, 32), np.float32)
    w = np.zeros((8, 32), np.float32)
    with pytest.raises(hq.InvalidArgument, match=r"y: shape \[64, 9\]; expected \[64, 8\]"):
        hq.linear_fprop(ctx, x, w, np.zeros((64, 9), np.float32))
    with pytest.raises(hq.InvalidArgument, match="bias: 7 values; expected 8"):
        hq.linear_fprop(ctx, x, w, np.zeros((64, 8), np.float32), bias=np.zeros(7, np.float32))
    # a contraction mismatch is the library's own check (HQ_ESHAPE), with its message
    with pytest.raises(hq.InvalidArgument) as e:
        hq.linear_fprop(ctx, np.zeros((64, 16), np.float32), w, np.zeros((64, 8), np.float32))
    assert e.value.status == 4


def test_bad_output_dtype_and_readonly(ctx):
    x = np.zeros((4, 4), np.float32)
    with pytest.raises(hq.InvalidArgument, match="y: dtype float16; expected float32 or bfloat16"):
        hq.linear_fprop(ctx, x, x, np.zeros((4, 4), np.float16))
    ro = np.zeros((4, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(hq.InvalidArgument, match="y: the array is read-only"):
        hq.linear_fprop(ctx, x, x, ro)


def test_not_an_array():
    with pytest.raises(hq.InvalidArgument, match="src: expected a NumPy array"):
        hq.as_tensor([1.0, 2.0], "src")


def test_bad_device_and_stream():
    with pytest.raises(hq.InvalidArgument, match="device"):
        hq.Context(device="tpu:0")
    with pytest.raises(hq.InvalidArgument, match="stream"):
        hq.Context(stream="default")


def test_freed_objects_raise_never_crash():
    ctx = hq.Context()
    r = hq.Recipe.from_string(MX)
    q = r.quantizer("linear:input:a")
    qt = q.quantize(ctx, np.ones((32, 32), np.float32))
    ctx.close()
    ctx.close()                        # twice is harmless
    with pytest.raises(hq.StateError, match="context: used after close"):
        q.quantize(ctx, np.ones((32, 32), np.float32))
    with pytest.raises(hq.StateError, match="context"):
        qt.dequantize()                # its context is closed
    r.close()
    with pytest.raises(hq.StateError, match="recipe: used after close"):
        r.quantizer("linear:input:b")
    # hq keeps the C context alive for the quantized tensor: a fresh context still reads it
    with hq.Context() as c2:
        np.testing.assert_array_equal(qt.dequantize(ctx=c2), np.ones((32, 32), np.float32))
    qt.close()
    with pytest.raises(hq.StateError, match="quantized tensor: used after close"):
        qt.shape
    q.close()
    gc.collect()


def test_garbage_collection_frees():
    import weakref
    ctx = hq.Context()
    qt = hq.Recipe.from_string(MX).quantizer("linear:input:a").quantize(
        ctx, np.ones((32, 32), np.float32))
    ref = weakref.ref(qt)
    del qt
    gc.collect()
    assert ref() is None


def test_host_context_never_capturing(ctx):
    assert ctx.capturing is False


@pytest.mark.cuda
def test_cuda_context_capturing():
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    x = torch.ones(16, device="cuda")
    with hq.Context("cuda:0", s) as c:
        assert c.capturing is False
        g = torch.cuda.CUDAGraph()
        seen = []
        with torch.cuda.graph(g, stream=s):
            y = x * 2
            seen.append(c.capturing)
        assert seen == [True]
        assert c.capturing is False
        g.replay()
        torch.cuda.synchronize()
        assert float(y.sum()) == 32.0


@pytest.mark.cuda
def test_cuda_context_and_quantize():
    torch = pytest.importorskip("torch")
    x = torch.randn(64, 64, device="cuda")
    with hq.Context("cuda:0", torch.cuda.current_stream()) as c:
        qt = hq.Recipe.from_string(MX).quantizer("linear:input:a").quantize(c, x)
        data = next(b for b in qt.buffers() if b.name == "data")
        assert data.torch().device.type == "cuda" and data.torch().data_ptr() == data.ptr
        with pytest.raises(hq.InvalidArgument, match="src: on the host, but the context is on cuda:0"):
            qt.update(x.cpu())


def test_buffer_view_outlives_closed_qtensor(ctx):
    row, codes, _ = _mx_row()
    qt = hq.Recipe.from_string(MX).quantizer("linear:input:a").quantize(
        ctx, np.tile(row, (32, 1)), hq.ROWWISE)
    view = qt.buffers()[0].numpy()
    qt.close()                       # the array still reads valid memory, never freed under it
    with pytest.raises(hq.StateError):
        qt.buffers()
    gc.collect()
    assert list(view[0, :5]) == codes
