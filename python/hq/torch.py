"""PyTorch modules over hq: hq.torch.Linear and hq.torch.convert.

Every GEMM of a Linear (fprop, dgrad, wgrad) runs in libhqcore (hq_linear_fprop / _dgrad /
_wgrad) on operands quantized with the recipe's quantizers for the roles
linear:{input,weight,grad_output}:<module path>. Tensors are passed by pointer (no copy), on
the host or on the CUDA device of the input, on PyTorch's current stream.
"""
import atexit
import os

import torch
from torch import nn

from . import _core as C

__all__ = ["Linear", "convert", "context", "as_recipe", "update_scaling"]

_IDENTITY_TEXT = "[recipe]\nname = high-precision\nunmatched = identity\n"
_contexts = {}
_states = {}        # (id(recipe), device key) -> (recipe, hq.State)
_identity = None


# the raw cudaStream_t of the current stream in one call; torch.cuda.current_stream() builds a
# Stream object first, a cost paid twice per step (forward and hq.torch.context)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_HOST_KEY = (C.HOST, 0)
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling


def _device_key(device):
    if device.type == "cpu":
        return _HOST_KEY
    return _cuda_key(device)


def _tensor_key(t):
    """_device_key(t.device) without making the device object (the per-call path)."""
    if t.is_cpu:
        return _HOST_KEY
    if t.is_cuda:
        idx = t.get_device()
        return (idx, _raw_stream(idx)) if _raw_stream is not None else _cuda_key(t.device)
    return _cuda_key(t.device)   # raises, naming the device


def _cuda_key(device):
    if device.type != "cuda":
        raise C.InvalidArgument("input: a tensor on %s; hq.torch takes CPU and CUDA tensors"
                                % device, argument="input")
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream is not None:
        return (idx, _raw_stream(idx))
    return (idx, torch.cuda.current_stream(idx).cuda_stream)


def _context(key):
    ctx = _contexts.get(key)
    if ctx is None or ctx.closed:
        ctx = _contexts[key] = C.Context(key[0], key[1] or None)
    return ctx


def context(device="cpu"):
    """The hq context of a torch device on PyTorch's current stream there (one per device and
    stream, kept for the process)."""
    return _context(_device_key(torch.device(device)))


@atexit.register
def _leave_contexts():
    # Modules still alive at exit hold quantized tensors of these contexts; destroying the
    # contexts first would only make hq warn that they outlive them. The process ends anyway.
    for ctx in _contexts.values():
        if not ctx.closed:
            C.ffi.gc(ctx._p, None)


def as_recipe(recipe):
    """A Recipe from an hq.Recipe, a path, or recipe text (a string holding a '[' section);
    None: every role in high precision (identity)."""
    global _identity
    if recipe is None:
        if _identity is None or _identity.closed:
            _identity = C.Recipe.from_string(_IDENTITY_TEXT, "high-precision")
        return _identity
    if isinstance(recipe, C.Recipe):
        return recipe
    if isinstance(recipe, (str, os.PathLike)):
        s = os.fspath(recipe)
        if "[" in s and "\n" in s:
            return C.Recipe.from_string(s, "<string>")
        return C.Recipe(s)
    raise C.InvalidArgument("recipe: expected an hq.Recipe, a path or recipe text, got %s"
                            % type(recipe).__name__, argument="recipe")


def _state(recipe, ctx, key):
    k = (id(recipe), key)
    ent = _states.get(k)
    if ent is None or ent[1].closed:
        ent = _states[k] = (recipe, C.State(recipe, ctx))
    return ent[1]


def update_scaling():
    """hq_state_update of every scaling state hq.torch made (delayed scaling): call it once per
    optimizer step, after the backward pass (a no-op for recipes without delayed scaling)."""
    for recipe, st in list(_states.values()):
        if not st.closed:
            st.update()


_OK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_HQ_DTYPE = {torch.float32: C.lib.HQ_F32, torch.bfloat16: C.lib.HQ_BF16,
             torch.float16: C.lib.HQ_F16}
_F32, _BF16 = C.lib.HQ_F32, C.lib.HQ_BF16
_ffi, _lib = C.ffi, C.lib
_NULL = C.ffi.NULL
# qtensors kept for reuse per layer, device and stream: at most this many shapes (a model fed
# varying token counts keeps the latest few) and this many qtensors of one shape (one per
# forward whose backward has not run yet, e.g. gradient accumulation over micro-batches)
_POOL_SHAPES = 4
_POOL_DEPTH = 8
_INPUT, _GRAD = 0, 1


class _Slot:
    """What one Linear keeps per device and stream: the hq context, the quantizers of its roles,
    the weight's quantized copy with the parameter version it was made from, and the operands'
    qtensors of finished steps, updated in place by the next step of the same shape (no
    allocation, no Python object made per step)."""
    __slots__ = ("ctx", "dev", "key", "recipe", "name", "n_in", "n_out", "q", "wq", "wver",
                 "pool")

    def __init__(self, mod, key):
        self.ctx = _context(key)
        self.dev = self.ctx.device
        self.key = key
        # what the steps need of the module, not the module itself: a slot in the module's own
        # dict must not make a reference cycle, or the kept qtensors would wait for the cyclic
        # garbage collector when the module goes
        self.recipe = mod.hq_recipe
        self.name = mod.hq_name
        self.n_in = mod.in_features
        self.n_out = mod.out_features
        self.q = [None, None, None]       # input, grad_output, weight (made when first needed)
        self.wq = None
        self.wver = None
        self.pool = {}

    def quantizer(self, i):
        q = self.q[i]
        if q is None:
            role = ("linear", ("input", "grad_output", "weight")[i], self.name)
            q = self.q[i] = C.Quantizer(self.recipe, role, _state(self.recipe, self.ctx, self.key))
        return q

    def closed(self):
        raise C.StateError("hq.torch.Linear %s: its context was closed during the step"
                               % (self.name or "(unnamed)"))

    def weight(self, w):
        """The weight's quantized copy, refreshed in place when the parameter has changed (the
        optimizer's step bumps its version)."""
        version = (w._version, w.data_ptr(), w.dtype)
        if self.wver == version and self.wq._p is not None:
            return self.wq
        if not w.is_contiguous():
            raise C.InvalidArgument("weight: not contiguous (strides %s)" % (w.stride(),),
                                    argument="weight")
        qw = self.wq
        if qw is not None and not qw.closed and qw.shape == tuple(w.shape) and \
                self.wver[2] == w.dtype:
            qw.update(w.detach(), self.ctx)   # the optimizer's write-back: same buffers
        else:
            qw = self.wq = self.quantizer(2).quantize(self.ctx, w.detach())
        self.wver = version
        return qw

    def take(self, k):
        lst = self.pool.get(k)
        if lst:
            try:
                return lst.pop()
            except IndexError:   # emptied since the check by another thread (autograd's)
                pass
        return None

    def give(self, k, qt, aliased):
        """A qtensor whose step is over: kept for the next step of its shape, unless it borrows
        its source (it cannot be updated) or the pool is full (then freed now)."""
        if aliased:
            _ffi.release(qt)
            return
        lst = self.pool.get(k)
        if lst is None:
            if len(self.pool) >= _POOL_SHAPES:
                for old in self.pool.pop(next(iter(self.pool)), ()):
                    _ffi.release(old)
            lst = self.pool[k] = []
        if len(lst) < _POOL_DEPTH:
            lst.append(qt)
        else:
            _ffi.release(qt)


def _failed(st, slot, i):
    step = _ffi.string(_lib.hqpy_failed_step()).decode()
    if step == "quantize":
        step = "quantize (%s)" % slot.quantizer(i).role
    C._check(st, "%s of %s" % (step, slot.name or "hq.torch.Linear"))


def _bias(bias, dev):
    if bias is None:
        return 0, _F32
    dt = _HQ_DTYPE.get(bias.dtype)
    if (dt == _F32 or dt == _BF16) and bias.is_contiguous() and \
            (bias.is_cpu if dev == C.HOST else bias.is_cuda and bias.get_device() == dev):
        return bias.data_ptr(), dt
    # the general checks, which refuse what the line above did not take, naming why
    v = C.as_tensor(bias, "bias", dev, (_F32, _BF16))
    return int(_ffi.cast("uintptr_t", v.t.data)), v.t.dtype


def _io_take(slot, k):
    """The C call's in/out record, holding the slot's kept qtensor for key k if it has one."""
    io = _ffi.new("hqpy_io *")
    qt = slot.take(k)
    if qt is not None:
        io.qt = qt
    return io, qt


def _io_result(io, qt):
    """The qtensor after the call (the kept one, or the one the call made, owned here from now
    on) and whether it borrows the caller's tensor."""
    if qt is None and io.qt != _NULL:
        return _ffi.gc(io.qt, _lib.hq_qtensor_free), bool(io.aliased)
    return qt, False


def _ctx_ptr(slot):
    cp = slot.ctx._p
    if cp is None:
        slot.closed()
    return cp


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, weight, bias, mod, need_dw, track):
        # need_dw and track (a backward may follow) come from the caller: grad mode is off here
        slot = mod._hq_slot(_tensor_key(x))
        qw = slot.weight(weight)
        rows, cols = x.shape
        xdt = _HQ_DTYPE[x.dtype]
        dirs = C.BOTH if need_dw else C.ROWWISE
        k = (_INPUT, xdt, dirs, rows, cols)
        io, qx = _io_take(slot, k)
        out_dtype = x.dtype if x.dtype != torch.float16 else torch.float32
        y = torch.empty(rows, mod.out_features, dtype=out_dtype, device=x.device)
        bptr, bdt = _bias(bias, slot.dev)
        q = slot.q[0] or slot.quantizer(0)
        st = _lib.hqpy_linear_fwd(_ctx_ptr(slot), q._p, io, dirs, x.data_ptr(),
                                  xdt, slot.dev, rows, cols, qw._p, bptr, bdt,
                                  y.data_ptr(), _HQ_DTYPE[out_dtype],
                                  mod.out_features)
        qx, aliased = _io_result(io, qx)
        if st:
            _failed(st, slot, 0)
        if need_dw and track:
            # wgrad reads qx; a borrowed one is x itself, kept with its version to refuse an
            # in-place write before the backward (as autograd does for nn.Linear's saved input)
            xs = (x, x._version) if aliased else None
            fctx.hq = (slot, qw, qx, k, xs, x.dtype, weight.dtype,
                       bias.dtype if bias is not None else None)
        else:
            slot.give(k, qx, aliased)
            fctx.hq = (slot, qw, None, None, None, x.dtype, weight.dtype,
                       bias.dtype if bias is not None else None)
        return y if out_dtype == x.dtype else y.to(x.dtype)

    @staticmethod
    def backward(fctx, dy):
        slot, qw, qx, kx, xs, x_dtype, w_dtype, b_dtype = fctx.hq
        fctx.hq = None
        n_in, n_out = slot.n_in, slot.n_out
        need_dx, need_dw, need_db = fctx.needs_input_grad[:3]
        if xs is not None and xs[0]._version != xs[1]:
            raise RuntimeError("hq.torch.Linear %s: its input was modified by an inplace "
                               "operation after the forward (version %d, now %d); the weight "
                               "gradient needs it unchanged" % (slot.name or "(unnamed)",
                                                                xs[1], xs[0]._version))
        if not dy.is_contiguous():
            dy = dy.contiguous()
        if dy.dtype == torch.float16:
            dy = dy.float()
        dirs = (C.ROWWISE if need_dx else 0) | (C.COLWISE if need_dw else 0)
        dx = dw = db = None
        if need_dw and qx is None:
            raise C.StateError("hq.torch.Linear %s: a weight gradient was asked for, but the "
                               "forward ran without one" % (slot.name or "(unnamed)"))
        if dirs:
            rows = dy.shape[0]
            dydt = _HQ_DTYPE[dy.dtype]
            k = (_GRAD, dydt, dirs, rows, n_out)
            io, qdy = _io_take(slot, k)
            dxp = dwp = 0
            if need_dx:
                dx = torch.empty(rows, n_in, dtype=dy.dtype, device=dy.device)
                dxp = dx.data_ptr()
            if need_dw:
                wt = w_dtype if w_dtype != torch.float16 else torch.float32
                dw = torch.empty(n_out, n_in, dtype=wt, device=dy.device)
                dwp = dw.data_ptr()
            q = slot.q[1] or slot.quantizer(1)
            st = _lib.hqpy_linear_bwd(_ctx_ptr(slot), q._p, io, dirs,
                                      dy.data_ptr(), dydt, slot.dev, rows,
                                      n_out, qw._p, qx if qx is not None else _NULL, n_in,
                                      dxp, dydt, dwp,
                                      _HQ_DTYPE[dw.dtype] if dw is not None else _F32)
            qdy, aliased = _io_result(io, qdy)
            if st:
                _failed(st, slot, 1)
            slot.give(k, qdy, aliased)
            if dx is not None and dx.dtype != x_dtype:
                dx = dx.to(x_dtype)
            if dw is not None and dw.dtype != w_dtype:
                dw = dw.to(w_dtype)
        if qx is not None:
            slot.give(kx, qx, xs is not None)
        if need_db and b_dtype is not None:
            db = dy.sum(0, dtype=torch.float32)
            if db.dtype != b_dtype:
                db = db.to(b_dtype)
        return dx, dw, db, None, None, None


@torch.compiler.disable
def _apply_disabled(*args):
    return _LinearFn.apply(*args)


class Linear(nn.Linear):
    """nn.Linear whose three GEMMs run in hq with the roles linear:input:<name>,
    linear:weight:<name> and linear:grad_output:<name> of `recipe` (an hq.Recipe, a path or
    recipe text; None: high precision). The weight is quantized once per optimizer step (its
    quantized copy is refreshed in place, hq_qtensor_update, when the parameter has changed).
    torch.compile treats the module as a graph break (its forward is
    torch.compiler.disable'd)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *,
                 recipe=None, name=""):
        super().__init__(in_features, out_features, bias, device, dtype)
        self._hq_setup(recipe, name)

    def _hq_setup(self, recipe, name):
        self.hq_recipe = as_recipe(recipe)
        self.hq_name = name
        self._hq_slots = {}

    def _hq_slot(self, key):
        slot = self._hq_slots.get(key)
        if slot is None or slot.ctx._p is None:
            # first use on this device and stream, or its context was closed: everything made
            # on that context (quantizers' state binding, weight copy, kept qtensors) is left
            slot = self._hq_slots[key] = _Slot(self, key)
        return slot

    def hq_weight(self, device=None):
        """The weight's quantized tensor (hq.QTensor) as the next forward will use it."""
        dev = torch.device(device) if device is not None else self.weight.device
        return self._hq_slot(_device_key(dev)).weight(self.weight)

    def forward(self, input):
        if not isinstance(input, torch.Tensor):
            raise C.InvalidArgument("input: expected a torch.Tensor, got %s"
                                    % type(input).__name__, argument="input")
        if input.dtype not in _OK_DTYPES:
            raise C.InvalidArgument("input: dtype %s; expected float32, bfloat16 or float16"
                                    % input.dtype, argument="input")
        w = self.weight
        if input.device != w.device:
            raise C.InvalidArgument("input: on %s, the weight of %s on %s"
                                    % (input.device, self.hq_name or "the layer",
                                       w.device), argument="input")
        shape = input.shape
        if not shape or shape[-1] != self.in_features:
            raise C.InvalidArgument("input: shape %s; expected [..., %d]"
                                    % (list(shape), self.in_features), argument="input")
        # a non-contiguous input is copied (nn.Linear accepts any strides)
        x = input if len(shape) == 2 else input.reshape(-1, self.in_features)
        if not x.is_contiguous():
            x = x.contiguous()
        b = self.bias
        grad = _grad_enabled()
        need_dw = grad and w.requires_grad
        track = grad and (need_dw or input.requires_grad or (b is not None and b.requires_grad))
        # under torch.compile the GEMMs are a graph break (Dynamo cannot trace into C calls);
        # eager calls skip the disable wrapper's own cost
        apply = _apply_disabled if _is_compiling() else _LinearFn.apply
        y = apply(x, w, b, self, need_dw, track)
        if len(shape) == 2:
            return y
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self):
        return "%s, name=%r, recipe=%r" % (super().extra_repr(), self.hq_name,
                                           self.hq_recipe.name or self.hq_recipe.path)


def convert(model, recipe=None):
    """Make every nn.Linear of `model` (exactly that class) an hq.torch.Linear in place: the
    same module objects and parameters (an optimizer made before keeps working), each named by
    its path in the model, so a recipe's role globs address layers by their PyTorch names
    ([role linear:weight:transformer.h.*.mlp.*]). Returns the model."""
    r = as_recipe(recipe)
    n = 0
    for name, mod in model.named_modules():
        if type(mod) is nn.Linear:
            mod.__class__ = Linear
            mod._hq_setup(r, name)
            n += 1
        elif isinstance(mod, Linear):
            mod._hq_setup(r, name)
            n += 1
    model.hq_converted = n
    return model
