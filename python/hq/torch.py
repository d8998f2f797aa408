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


def _device_key(device):
    if device.type == "cpu":
        return (C.HOST, 0)
    if device.type != "cuda":
        raise C.InvalidArgument("input: a tensor on %s; hq.torch takes CPU and CUDA tensors"
                                % device, argument="input")
    idx = device.index if device.index is not None else torch.cuda.current_device()
    return (idx, torch.cuda.current_stream(idx).cuda_stream)


def context(device="cpu"):
    """The hq context of a torch device on PyTorch's current stream there (one per device and
    stream, kept for the process)."""
    key = _device_key(torch.device(device))
    ctx = _contexts.get(key)
    if ctx is None or ctx.closed:
        ctx = _contexts[key] = C.Context(key[0], key[1] or None)
    return ctx


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


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, weight, bias, mod, need_dw):
        # need_dw comes from the caller: grad mode is off inside Function.forward
        key = _device_key(x.device)
        hctx = context(x.device)
        qx = mod._quantizer(hctx, key, "input").quantize(
            hctx, x, C.BOTH if need_dw else C.ROWWISE)
        qw = mod._weight_qtensor(hctx, key)
        out_dtype = x.dtype if x.dtype != torch.float16 else torch.float32
        y = torch.empty(x.shape[0], mod.out_features, dtype=out_dtype, device=x.device)
        C.linear_fprop(hctx, qx, qw, y, bias=bias)
        fctx.hq = (hctx, key, qx, qw, mod, x.dtype)
        fctx.has_bias = bias is not None
        return y if out_dtype == x.dtype else y.to(x.dtype)

    @staticmethod
    def backward(fctx, dy):
        hctx, key, qx, qw, mod, x_dtype = fctx.hq
        need_dx, need_dw, need_db = fctx.needs_input_grad[0], fctx.needs_input_grad[1], \
            fctx.needs_input_grad[2]
        dy = dy.contiguous()
        if dy.dtype == torch.float16:
            dy = dy.float()
        dirs = (C.ROWWISE if need_dx else 0) | (C.COLWISE if need_dw else 0)
        dx = dw = db = None
        if dirs:
            qdy = mod._quantizer(hctx, key, "grad_output").quantize(hctx, dy, dirs)
            if need_dx:
                dx = torch.empty(dy.shape[0], mod.in_features, dtype=dy.dtype, device=dy.device)
                C.linear_dgrad(hctx, qdy, qw, dx)
                dx = dx.to(x_dtype)
            if need_dw:
                wt = mod.weight.dtype if mod.weight.dtype != torch.float16 else torch.float32
                dw = torch.empty(mod.out_features, mod.in_features, dtype=wt, device=dy.device)
                C.linear_wgrad(hctx, qx, qdy, dw)
                dw = dw.to(mod.weight.dtype)
        if need_db and fctx.has_bias:
            db = dy.sum(0, dtype=torch.float32).to(mod.bias.dtype)
        fctx.hq = None
        return dx, dw, db, None, None


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
        self._hq_q = {}
        self._hq_wq = {}

    def _quantizer(self, hctx, key, tensor_type):
        k = (key, tensor_type)
        q = self._hq_q.get(k)
        if q is None:
            role = ("linear", tensor_type, self.hq_name)
            q = self._hq_q[k] = C.Quantizer(self.hq_recipe, role,
                                            _state(self.hq_recipe, hctx, key))
        return q

    def _weight_qtensor(self, hctx, key):
        w = self.weight
        version = (w._version, w.data_ptr(), w.dtype)
        ent = self._hq_wq.get(key)
        if ent is not None and ent[0] == version:
            return ent[1]
        if not w.is_contiguous():
            raise C.InvalidArgument("weight: not contiguous (strides %s)" % (w.stride(),),
                                    argument="weight")
        if ent is not None and ent[1].shape == tuple(w.shape) and ent[2] == w.dtype:
            ent[1].update(w.detach(), hctx)   # the optimizer's write-back: same buffers
            qw = ent[1]
        else:
            qw = self._quantizer(hctx, key, "weight").quantize(hctx, w.detach())
        self._hq_wq[key] = (version, qw, w.dtype)
        return qw

    def hq_weight(self, device=None):
        """The weight's quantized tensor (hq.QTensor) as the next forward will use it."""
        dev = torch.device(device) if device is not None else self.weight.device
        return self._weight_qtensor(context(dev), _device_key(dev))

    def forward(self, input):
        if not isinstance(input, torch.Tensor):
            raise C.InvalidArgument("input: expected a torch.Tensor, got %s"
                                    % type(input).__name__, argument="input")
        if input.dtype not in _OK_DTYPES:
            raise C.InvalidArgument("input: dtype %s; expected float32, bfloat16 or float16"
                                    % input.dtype, argument="input")
        if input.device != self.weight.device:
            raise C.InvalidArgument("input: on %s, the weight of %s on %s"
                                    % (input.device, self.hq_name or "the layer",
                                       self.weight.device), argument="input")
        if input.dim() < 1 or input.shape[-1] != self.in_features:
            raise C.InvalidArgument("input: shape %s; expected [..., %d]"
                                    % (list(input.shape), self.in_features), argument="input")
        lead = input.shape[:-1]
        # a non-contiguous input is copied (nn.Linear accepts any strides)
        x = input.reshape(-1, self.in_features).contiguous()
        need_dw = self.weight.requires_grad and torch.is_grad_enabled()
        # under torch.compile the GEMMs are a graph break (Dynamo cannot trace into C calls);
        # eager calls skip the disable wrapper's own cost
        apply = _apply_disabled if torch.compiler.is_compiling() else _LinearFn.apply
        y = apply(x, self.weight, self.bias, self, need_dw)
        return y.view(*lead, self.out_features)

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
