"""What hq.torch.Linear keeps between steps (its context, quantizers, the weight's quantized copy,
the operands' qtensors updated in place) never changes a result: several steps of a layer, with
shapes, dtypes, weights and contexts changing between them, bit for bit against the C library's
linear GEMMs on operands quantized afresh (hq.linear_*)."""
import gc

import pytest

torch = pytest.importorskip("torch")
import hq                                  # noqa: E402
import hq.torch as ht                      # noqa: E402
from conftest import RECIPES               # noqa: E402
from torch import nn                       # noqa: E402

RECIPE_IDS = [p.stem for p in RECIPES]
IDENTITY_F32 = ("[recipe]\nname = f32\n[format f]\nplugin = identity\ndtype = f32\n"
                "[role *:*:*]\nrowwise = f\ncolumnwise = f\n")
MX = "[format mx]\nplugin = mxfp8\n[role *:*:*]\nrowwise = mx\ncolumnwise = mx\n"


def _slot(m):
    return m._hq_slots[ht._HOST_KEY]


def _pooled(m, kind):
    """The qtensors kept for reuse: kind 0 the inputs', 1 the output gradients'."""
    return [qt for k, lst in _slot(m).pool.items() if k[0] == kind for qt in lst]


class _Reference:
    """The same layer's steps through the C library: a fresh context with the module's seed,
    fresh quantizers, and every operand quantized anew (never updated)."""

    def __init__(self, recipe, name, seed, device="cpu", stream=None):
        self.device = device
        self.c = hq.Context(None if device == "cpu" else device, stream, seed=seed)
        st = hq.State(recipe, self.c)
        self.q = {t: recipe.quantizer(("linear", t, name), st)
                  for t in ("weight", "input", "grad_output")}
        self.qw = None

    def weight(self, w):
        self.qw = self.q["weight"].quantize(self.c, w.detach())

    def step(self, x, dy, bias, dw_dtype=torch.float32):
        qx = self.q["input"].quantize(self.c, x.detach().reshape(-1, x.shape[-1]))
        qdy = self.q["grad_output"].quantize(self.c, dy.reshape(-1, dy.shape[-1]))
        rows, n_in, n_out = qx.shape[0], qx.shape[1], qdy.shape[1]
        f32 = x.dtype if x.dtype == torch.bfloat16 else torch.float32
        y = torch.empty(rows, n_out, dtype=f32, device=self.device)
        hq.linear_fprop(self.c, qx, self.qw, y, bias=bias)
        dx = torch.empty(rows, n_in, dtype=f32, device=self.device)
        hq.linear_dgrad(self.c, qdy, self.qw, dx)
        dw = torch.empty(n_out, n_in, dtype=dw_dtype, device=self.device)
        hq.linear_wgrad(self.c, qx, qdy, dw)
        return y, dx, dw


def _step(m, x, dy):
    x = x.detach().requires_grad_()
    m.weight.grad = None
    y = m(x)
    y.backward(dy)
    return y.detach(), x.grad, m.weight.grad


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_steps_with_reused_qtensors_bit_identical(recipe):
    """Four steps: the same shape twice (the second updates the first's qtensors in place),
    then fewer tokens, then the first shape again (kept across the other shape's step)."""
    name = "cache.steps." + recipe.stem
    r = hq.Recipe(recipe)
    torch.manual_seed(5)
    m = ht.Linear(128, 64, recipe=r, name=name)
    ctx = ht.context("cpu")
    ctx.rng_offset = 0
    ref = _Reference(r, name, ctx.seed)
    ref.weight(m.weight)
    kept = None
    for i, tokens in enumerate((64, 64, 32, 64)):
        x = torch.randn(tokens, 128)
        dy = torch.randn(tokens, 64)
        y, dx, dw = _step(m, x, dy)
        ry, rdx, rdw = ref.step(x, dy, m.bias.detach())
        assert torch.equal(y, ry), (i, tokens)
        assert torch.equal(dx, rdx), (i, tokens)
        assert torch.equal(dw, rdw), (i, tokens)
        pooled = _pooled(m, 0)
        if i == 0:
            kept = pooled
        elif i == 1:
            # the second step of a shape made nothing new: the same qtensors, updated
            assert len(pooled) == len(kept) and all(a is b for a, b in zip(pooled, kept))


def test_identity_of_the_source_dtype_borrows_and_keeps_nothing():
    m = ht.Linear(64, 32, recipe=IDENTITY_F32, name="cache.alias")
    for _ in range(2):
        _step(m, torch.randn(16, 64), torch.randn(16, 32))
    assert _pooled(m, 0) == [] and _pooled(m, 1) == []     # borrowed, freed after use
    # a bf16 input converts (a copy), and that copy is kept for the next step
    _step(m, torch.randn(16, 64).bfloat16(), torch.randn(16, 32).bfloat16())
    assert len(_pooled(m, 0)) == 1


def test_borrowed_input_written_in_place_before_backward_is_refused():
    m = ht.Linear(64, 32, recipe=IDENTITY_F32, name="cache.inplace")
    x = torch.randn(16, 64)
    y = m(x)
    with torch.no_grad():
        x.mul_(2)                     # nn.Linear's saved input would refuse this too
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_dtype_changes_between_steps():
    r = hq.Recipe.from_string(MX)
    name = "cache.dtype"
    torch.manual_seed(6)
    m = ht.Linear(64, 64, recipe=r, name=name)
    ctx = ht.context("cpu")
    ref = _Reference(r, name, ctx.seed)
    ctx.rng_offset = 0
    ref.weight(m.weight)
    for dt in (torch.float32, torch.bfloat16, torch.float32, torch.bfloat16):
        x = torch.randn(32, 64).to(dt)
        dy = torch.randn(32, 64).to(dt)
        y, dx, dw = _step(m, x, dy)
        ry, rdx, rdw = ref.step(x, dy, m.bias.detach())
        assert y.dtype == dt and dx.dtype == dt
        assert torch.equal(y, ry.to(dt)) and torch.equal(dx, rdx.to(dt))
        assert torch.equal(dw, rdw)
    keys = {k[1] for k in _slot(m).pool}
    assert keys == {hq._core.lib.HQ_F32, hq._core.lib.HQ_BF16}   # one kept per dtype


def test_weight_changed_in_place_or_replaced_is_requantized():
    r = hq.Recipe.from_string(MX)
    name = "cache.weight"
    torch.manual_seed(7)
    m = ht.Linear(64, 64, recipe=r, name=name)
    x = torch.randn(32, 64)
    ctx = ht.context("cpu")
    ref = _Reference(r, name, ctx.seed)
    ctx.rng_offset = 0

    def check():
        ref.weight(m.weight)
        dy = torch.randn(32, 64)
        y, dx, dw = _step(m, x, dy)
        ry, rdx, rdw = ref.step(x, dy, m.bias.detach(), m.weight.dtype)
        assert torch.equal(y, ry) and torch.equal(dx, rdx) and torch.equal(dw, rdw)
        assert dw.dtype == m.weight.dtype

    check()
    with torch.no_grad():
        m.weight.mul_(-0.5)                               # in place: the version moves
    check()
    m.weight = nn.Parameter(torch.randn(64, 64))         # another tensor
    check()
    m.bfloat16()                                         # another dtype: a new qtensor
    check()


def test_shapes_kept_are_bounded():
    m = ht.Linear(64, 32, recipe=MX, name="cache.bound")
    for tokens in range(32, 32 * (ht._POOL_SHAPES + 3), 32):
        _step(m, torch.randn(tokens, 64), torch.randn(tokens, 32))
    inputs = [k for k in _slot(m).pool if k[0] == 0]
    assert len(_slot(m).pool) <= ht._POOL_SHAPES
    assert inputs and max(k[3] for k in inputs) == 32 * (ht._POOL_SHAPES + 2)  # the latest


def test_accumulation_over_micro_batches_uses_one_qtensor_each():
    """Two forwards before their backwards: each keeps its own input qtensor."""
    r = hq.Recipe.from_string(MX)
    name = "cache.accum"
    torch.manual_seed(8)
    m = ht.Linear(64, 64, recipe=r, name=name)
    ctx = ht.context("cpu")
    ref = _Reference(r, name, ctx.seed)
    ctx.rng_offset = 0
    ref.weight(m.weight)
    _step(m, torch.randn(32, 64), torch.randn(32, 64))     # one input qtensor kept
    ref.step(torch.randn(32, 64), torch.randn(32, 64), None)  # keeps the rng counts in step
    xs = [torch.randn(32, 64) for _ in range(2)]
    dys = [torch.randn(32, 64) for _ in range(2)]
    m.weight.grad = None
    ys = [m(x) for x in xs]
    assert _pooled(m, 0) == []                               # both in use
    for y, dy in zip(ys, dys):
        y.backward(dy)
    assert len(_pooled(m, 0)) == 2
    rdw = torch.zeros(64, 64)
    for x, dy in zip(xs, dys):
        rdw += ref.step(x, dy, None)[2]
    # the reference quantizes x1, dy1, x2, dy2; the module x1, x2, dy1, dy2: the same counts
    # per role, so the same random streams
    assert torch.equal(m.weight.grad, rdw)


def test_inference_and_frozen_weight_keep_no_input():
    m = ht.Linear(64, 32, recipe=MX, name="cache.frozen")
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(32, 64))
    assert len(_pooled(m, 0)) == 1          # rowwise only, given back after the forward
    assert {k[2] for k in _slot(m).pool} == {hq.ROWWISE}
    _step(m, torch.randn(32, 64), torch.randn(32, 32))   # needs both directions: a new one
    assert {k[2] for k in _slot(m).pool if k[0] == 0} == {hq.ROWWISE, hq.BOTH}
    m.weight.grad = m.bias.grad = None
    m.weight.requires_grad_(False)
    m.bias.requires_grad_(False)
    x = torch.randn(32, 64, requires_grad=True)
    m(x).sum().backward()
    assert x.grad is not None and m.weight.grad is None
    # dgrad only: the output gradient rowwise, the input's qtensor given back in the forward
    assert {k[2] for k in _slot(m).pool if k[0] == 1} == {hq.ROWWISE, hq.BOTH}
    assert len(_pooled(m, 0)) == 2


def test_closed_context_between_steps_gets_a_new_one():
    r = hq.Recipe.from_string(MX)
    m = ht.Linear(64, 32, recipe=r, name="cache.ctx")
    x = torch.randn(32, 64)
    _step(m, x, torch.randn(32, 32))
    old = ht.context("cpu")
    old.close()
    y, dx, dw = _step(m, x, torch.randn(32, 32))
    new = ht.context("cpu")
    assert new is not old and not new.closed and _slot(m).ctx is new
    assert torch.isfinite(y).all() and torch.isfinite(dw).all()


def test_context_closed_between_forward_and_backward_raises():
    m = ht.Linear(64, 32, recipe=MX, name="cache.ctx2")
    y = m(torch.randn(32, 64, requires_grad=True))
    ht.context("cpu").close()
    with pytest.raises(hq.StateError, match="context was closed"):
        y.sum().backward()
    gc.collect()
    _step(m, torch.randn(32, 64), torch.randn(32, 32))    # and the next step works


@pytest.mark.cuda
def test_cuda_steps_reuse_per_stream_bit_identical():
    """On a side stream, then on the default one: a context and kept qtensors per stream, each
    step bit for bit the library's on that stream."""
    r = hq.Recipe(RECIPES[0])
    name = "cache.cuda"
    torch.manual_seed(9)
    m = ht.Linear(256, 256, recipe=r, name=name, device="cuda")
    for s in (torch.cuda.Stream(), torch.cuda.current_stream()):
        with torch.cuda.stream(s):
            ctx = ht.context("cuda")
            assert ctx.stream == s.cuda_stream
            ctx.rng_offset = 0
            ref = _Reference(r, name, ctx.seed, "cuda:0", s)
            ref.weight(m.weight)
            for tokens in (256, 256, 128):
                x = torch.randn(tokens, 256, device="cuda")
                dy = torch.randn(tokens, 256, device="cuda")
                y, dx, dw = _step(m, x, dy)
                ry, rdx, rdw = ref.step(x, dy, m.bias.detach())
                assert torch.equal(y, ry) and torch.equal(dx, rdx) and torch.equal(dw, rdw)
            ref.c.close()
    assert len(m._hq_slots) == 2


def test_module_and_its_qtensors_go_without_the_cycle_collector():
    import weakref
    m = ht.Linear(64, 32, recipe=MX, name="cache.free")
    _step(m, torch.randn(32, 64), torch.randn(32, 32))
    kept = _pooled(m, 0)
    assert kept
    gone = weakref.ref(m)
    del kept
    gc.disable()
    try:
        del m                        # by reference count alone: no cycle through its slots
        assert gone() is None
    finally:
        gc.enable()


def test_weight_copy_closed_by_the_caller_is_made_again():
    m = ht.Linear(64, 32, recipe=MX, name="cache.wclose")
    x = torch.randn(32, 64)
    y = m(x).detach()
    m.hq_weight().close()
    assert torch.equal(m(x).detach(), y)
    assert not m.hq_weight().closed
