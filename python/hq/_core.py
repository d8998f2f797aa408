"""The hq objects over libhqcore / libhqtrain (hq._native, cffi API mode)."""
import os
import weakref

from ._native import ffi, lib

HOST = lib.HQ_DEVICE_HOST
ROWWISE = lib.HQ_ROWWISE
COLWISE = lib.HQ_COLWISE
BOTH = lib.HQ_BOTH


# --- errors ----------------------------------------------------------------------------------

class Error(Exception):
    """A failure of libhqcore: `status` is the hq_status code, the message hq_last_error()."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class InvalidArgument(Error, ValueError):
    """HQ_EINVAL / HQ_ESHAPE, or an argument refused before it reached the library. `argument`
    names it when known."""

    def __init__(self, message, status=None, argument=None):
        super().__init__(message, status)
        self.argument = argument


class ParseError(Error, ValueError):
    """HQ_EPARSE: a recipe with errors (`errors` lists every "file:line: message")."""

    def __init__(self, message, status=None, errors=()):
        super().__init__(message, status)
        self.errors = list(errors)


class NotSupported(Error):
    """HQ_ENOTSUP."""


class NotFound(Error, LookupError):
    """HQ_ENOENT."""


class StateError(Error):
    """HQ_ESTATE, or an object used after close()."""


_ERRORS = {lib.HQ_EINVAL: InvalidArgument, lib.HQ_ESHAPE: InvalidArgument,
           lib.HQ_EPARSE: ParseError, lib.HQ_ENOTSUP: NotSupported, lib.HQ_ENOENT: NotFound,
           lib.HQ_ESTATE: StateError, lib.HQ_ENOMEM: MemoryError}


def _text(p):
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else None


def last_error():
    return _text(lib.hq_last_error())


def _check(status, what, *args):
    """Raise for a failed status; `what % args` names the call (formatted only on failure)."""
    if status == lib.HQ_OK:
        return
    if args:
        what = what % args
    msg = last_error() or _text(lib.hq_strerror(status))
    cls = _ERRORS.get(status, Error)
    if cls is MemoryError:
        raise MemoryError("%s: %s" % (what, msg))
    raise cls("%s: %s" % (what, msg), status)


def _arg_error(argument, message):
    return InvalidArgument("%s: %s" % (argument, message), argument=argument)


def _bytes(s):
    return s.encode("utf-8") if isinstance(s, str) else s


# --- dtypes and tensors ----------------------------------------------------------------------

_HP = {lib.HQ_F32: "float32", lib.HQ_F16: "float16", lib.HQ_BF16: "bfloat16"}
_HP_BY_NAME = {v: k for k, v in _HP.items()}
# numpy typestr of each stored dtype (FP8 / FP4 / E8M0 codes travel as bytes)
_TYPESTR = {lib.HQ_F32: "<f4", lib.HQ_F16: "<f2", lib.HQ_BF16: "<u2", lib.HQ_U8: "|u1",
            lib.HQ_E4M3: "|u1", lib.HQ_E5M2: "|u1", lib.HQ_E8M0: "|u1", lib.HQ_E2M1X2: "|u1",
            lib.HQ_I32: "<i4", lib.HQ_I8: "|i1"}


def dtype_name(dt):
    return _text(lib.hq_dtype_name(dt))


def _torch():
    import sys
    return sys.modules.get("torch")


def _device_str(dev):
    return "the host" if dev == HOST else "cuda:%d" % dev


class _View:
    """A caller's tensor seen as an hq_tensor (no copy): `t` is the struct, `obj` keeps the
    memory alive for the call."""
    __slots__ = ("t", "obj", "shape")


_SIZEOF_TENSOR = ffi.sizeof("hq_tensor")
_TORCH_HP = {}   # torch dtype -> hq dtype, filled when torch is first seen


def _torch_fast(obj, device, dtypes, writable):
    """as_tensor's common case -- a contiguous CUDA or CPU torch tensor of an accepted dtype and
    device -- with no more work than the struct needs; None when any check needs the full path
    (which then raises with the argument's name)."""
    if not _TORCH_HP:
        t = _torch()
        _TORCH_HP.update({t.float32: lib.HQ_F32, t.float16: lib.HQ_F16,
                          t.bfloat16: lib.HQ_BF16})
    dt = _TORCH_HP.get(obj.dtype)
    if dt is None or (dtypes is not None and dt not in dtypes) or \
            (writable and obj.requires_grad and obj.is_leaf) or \
            not obj.is_contiguous() or obj.dim() == 0 or obj.numel() == 0:
        return None
    d = obj.device
    dev = d.index if d.type == "cuda" else (HOST if d.type == "cpu" else None)
    if dev is None or (device is not None and dev != device):
        return None
    v = _View()
    v.obj = obj
    v.shape = obj.shape
    t = ffi.new("hq_tensor *")
    t.struct_size = _SIZEOF_TENSOR
    t.dtype = dt
    t.data = ffi.cast("void *", obj.data_ptr())
    t.device = dev
    t.cols = obj.shape[-1]
    t.rows = obj.numel() // t.cols
    v.t = t
    return v


def as_tensor(obj, argument, device=None, dtypes=None, writable=False):
    """An hq_tensor over the memory of a NumPy array, a torch tensor or a DLPack producer:
    contiguous, row-major, [prod(leading dims), last dim]. `device` (an hq device ordinal) is
    checked when given."""
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        v = _torch_fast(obj, device, dtypes, writable)
        if v is not None:
            return v
        name = str(obj.dtype).replace("torch.", "")
        dev = HOST if obj.device.type == "cpu" else (
            obj.device.index if obj.device.type == "cuda" else None)
        if dev is None:
            raise _arg_error(argument, "a tensor on %s; hq takes host and CUDA tensors"
                             % obj.device)
        contiguous = obj.is_contiguous()
        shape = tuple(obj.shape)
        ptr = obj.data_ptr()
        if writable and obj.requires_grad and obj.is_leaf:
            raise _arg_error(argument, "an output must not be a leaf that requires grad")
    elif hasattr(obj, "__array_interface__") or type(obj).__module__ == "numpy":
        import numpy as np
        arr = np.asarray(obj) if not isinstance(obj, np.ndarray) else obj
        name = arr.dtype.name
        dev = HOST
        contiguous = arr.flags.c_contiguous
        shape = arr.shape
        if writable and not arr.flags.writeable:
            raise _arg_error(argument, "the array is read-only")
        ptr = arr.ctypes.data
        obj = arr
    elif hasattr(obj, "__dlpack__"):
        if torch is not None:
            return as_tensor(torch.from_dlpack(obj), argument, device, dtypes, writable)
        import numpy as np
        return as_tensor(np.from_dlpack(obj), argument, device, dtypes, writable)
    else:
        raise InvalidArgument("%s: expected a NumPy array, a torch tensor or a DLPack "
                              "producer, got %s" % (argument, type(obj).__name__),
                              argument=argument)
    dt = _HP_BY_NAME.get(name)
    allowed = dtypes or (lib.HQ_F32, lib.HQ_F16, lib.HQ_BF16)
    if dt is None or dt not in allowed:
        raise _arg_error(argument, "dtype %s; expected %s"
                         % (name, " or ".join(_HP[d] for d in allowed)))
    if len(shape) < 1 or any(s <= 0 for s in shape):
        raise _arg_error(argument, "shape %s; expected at least one dimension, none empty"
                         % (list(shape),))
    if not contiguous:
        raise _arg_error(argument, "not contiguous (strides %s); pass .contiguous() or a "
                         "C-ordered copy" % (_strides(obj),))
    if device is not None and dev != device:
        raise _arg_error(argument, "on %s, but the context is on %s"
                         % (_device_str(dev), _device_str(device)))
    v = _View()
    v.obj = obj
    v.shape = tuple(shape)
    cols = shape[-1]
    rows = 1
    for s in shape[:-1]:
        rows *= s
    t = ffi.new("hq_tensor *")
    t.struct_size = _SIZEOF_TENSOR
    t.dtype = dt
    t.data = ffi.cast("void *", ptr)
    t.device = dev
    t.rows = rows
    t.cols = cols
    v.t = t
    return v


def _strides(obj):
    try:
        return tuple(obj.stride())
    except (AttributeError, TypeError):
        return tuple(getattr(obj, "strides", ()))


# --- the library -----------------------------------------------------------------------------

def version():
    return _text(lib.hq_version())


def device_count():
    return lib.hq_device_count()


def info():
    """What `hq info` shows, as a dict: version, CUDA build, devices, the plugin search path,
    the loaded format modules (with options) and the GEMM providers."""
    out = {"version": version(), "built_with_cuda": bool(lib.hq_built_with_cuda()),
           "plugin_dir": _text(lib.hq_plugins_default_dir()), "devices": [], "formats": [],
           "rejected": [], "gemm_providers": []}
    name = ffi.new("char[]", 256)
    arch = ffi.new("int *")
    for d in range(lib.hq_device_count()):
        _check(lib.hq_device_info(d, name, 256, arch), "hq_device_info")
        out["devices"].append({"index": d, "name": _text(name), "arch": arch[0]})
    with Plugins() as ps:
        out["plugin_dirs"] = [_text(lib.hq_plugins_dir(ps._p, i))
                              for i in range(lib.hq_plugins_dir_count(ps._p))]
        for i in range(lib.hq_plugins_count(ps._p)):
            p = lib.hq_plugins_get(ps._p, i)
            opts = []
            o = lib.hq_plugin_options(p)
            k = 0
            while o != ffi.NULL and o[k].name != ffi.NULL:
                opts.append({"name": _text(o[k].name), "type": _text(lib.hq_opt_type_name(
                    o[k].type)), "default": _text(getattr(o[k], "def"))})
                k += 1
            out["formats"].append({"name": _text(lib.hq_plugin_name(p)),
                                   "version": _text(lib.hq_plugin_version(p)),
                                   "description": _text(lib.hq_plugin_description(p)),
                                   "file": _text(lib.hq_plugin_file(p)),
                                   "cpu": bool(lib.hq_plugin_caps(p) & lib.HQ_CAP_CPU),
                                   "cuda": bool(lib.hq_plugin_caps(p) & lib.HQ_CAP_CUDA),
                                   "options": opts})
        for i in range(lib.hq_plugins_rejected_count(ps._p)):
            out["rejected"].append({"file": _text(lib.hq_plugins_rejected_file(ps._p, i)),
                                    "reason": _text(lib.hq_plugins_rejected_reason(ps._p, i))})
        gi = ffi.new("hq_gemm_provider_info *")
        for i in range(lib.hq_plugins_gemm_count(ps._p)):
            gi.struct_size = ffi.sizeof("hq_gemm_provider_info")
            _check(lib.hq_plugins_gemm_info(ps._p, i, gi), "hq_plugins_gemm_info")
            out["gemm_providers"].append({"name": _text(gi.name), "priority": gi.priority,
                                          "file": _text(gi.file)})
    return out


class _Owned:
    """A C object freed by close(), by `with`, or when garbage-collected (ffi.gc); using it
    after close() raises StateError, never reaches the library."""
    _kind = "object"
    _p = None

    def _own(self, p, free):
        self._p = ffi.gc(p, free)

    @property
    def ptr(self):
        if self._p is None:
            raise StateError("%s: used after close()" % self._kind)
        return self._p

    @property
    def closed(self):
        return self._p is None

    def close(self):
        p, self._p = self._p, None
        if p is not None:
            ffi.release(p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Plugins(_Owned):
    """The format modules found on the search path (hq_plugins_open)."""
    _kind = "plugin set"

    def __init__(self, dirs=(), no_env=False, no_default=False):
        keep = [ffi.new("char[]", _bytes(os.fspath(d))) for d in dirs]
        arr = ffi.new("const char *[]", keep) if keep else ffi.NULL
        flags = (lib.HQ_PLUGINS_NO_ENV if no_env else 0) | (
            lib.HQ_PLUGINS_NO_DEFAULT if no_default else 0)
        out = ffi.new("hq_plugins **")
        _check(lib.hq_plugins_open(arr, len(keep), flags, out), "hq_plugins_open")
        self._own(out[0], lib.hq_plugins_close)

    def names(self):
        return [_text(lib.hq_plugin_name(lib.hq_plugins_get(self.ptr, i)))
                for i in range(lib.hq_plugins_count(self.ptr))]


def _stream_handle(stream):
    if stream is None or stream == 0:
        return ffi.NULL
    if isinstance(stream, int):
        return ffi.cast("void *", stream)
    handle = getattr(stream, "cuda_stream", None)   # torch.cuda.Stream
    if handle is None:
        handle = getattr(stream, "ptr", None)       # cupy
    if not isinstance(handle, int):
        raise InvalidArgument("stream: expected a cudaStream_t as an int or an object with "
                              ".cuda_stream, got %s" % type(stream).__name__, argument="stream")
    return ffi.cast("void *", handle)


def _device_index(device):
    if device is None or device == "cpu" or device == HOST:
        return HOST
    if isinstance(device, int):
        if device < 0:
            raise InvalidArgument("device: %d; expected a CUDA ordinal or 'cpu'" % device,
                                  argument="device")
        return device
    s = str(device)
    if s == "cuda":
        return 0
    if s.startswith("cuda:") and s[5:].isdigit():
        return int(s[5:])
    raise InvalidArgument("device: %r; expected None/'cpu', an int or 'cuda[:N]'" % (device,),
                          argument="device")


class Context(_Owned):
    """Where work runs: the host (device=None or 'cpu') or a CUDA device (an ordinal or
    'cuda:N') and a stream (a cudaStream_t as an int, or a torch.cuda.Stream; None: the default
    stream). hq keeps the context's C side alive until its last quantized tensor is freed, so
    closing it early is safe."""
    _kind = "context"

    def __init__(self, device=None, stream=None, seed=0):
        d = ffi.new("hq_ctx_desc *")
        d.struct_size = ffi.sizeof("hq_ctx_desc")
        d.device = _device_index(device)
        d.stream = _stream_handle(stream)
        d.seed = seed
        out = ffi.new("hq_ctx **")
        _check(lib.hq_ctx_create(d, out), "hq_ctx_create")
        self._own(out[0], lib.hq_ctx_destroy)
        self.device = d.device

    def sync(self):
        _check(lib.hq_ctx_sync(self.ptr), "hq_ctx_sync")

    @property
    def stream(self):
        return int(ffi.cast("uintptr_t", lib.hq_ctx_stream(self.ptr)))

    @property
    def capturing(self):
        """Whether the context's stream is being captured into a CUDA graph now, by any thread:
        sync() or reading a result back would break the capture instead of running."""
        out = ffi.new("int *")
        _check(lib.hq_ctx_capturing(self.ptr, out), "hq_ctx_capturing")
        return bool(out[0])

    @property
    def seed(self):
        return lib.hq_ctx_seed(self.ptr)

    @property
    def rng_offset(self):
        return lib.hq_ctx_rng_offset(self.ptr)

    @rng_offset.setter
    def rng_offset(self, step):
        _check(lib.hq_ctx_set_rng_offset(self.ptr, step), "hq_ctx_set_rng_offset")

    def __repr__(self):
        return "hq.Context(%s%s)" % (_device_str(self.device), ", closed" if self.closed else "")


class Recipe(_Owned):
    """A parsed recipe: Recipe(path) or Recipe.from_string(text). A recipe with errors raises
    ParseError listing every error (parse_only=True keeps it and lists them in .errors)."""
    _kind = "recipe"

    def __init__(self, path=None, *, text=None, name="<string>", unmatched=None,
                 plugins=None, parse_only=False):
        o = ffi.new("hq_recipe_opts *")
        o.struct_size = ffi.sizeof("hq_recipe_opts")
        if plugins is not None:
            o.plugins = plugins.ptr
            self._plugins = plugins
        if unmatched is not None:
            o.unmatched = {"identity": lib.HQ_UNMATCHED_IDENTITY, "warn": lib.HQ_UNMATCHED_WARN,
                           "error": lib.HQ_UNMATCHED_ERROR}[unmatched]
        out = ffi.new("hq_recipe **")
        if text is not None:
            what = "recipe %s" % name
            st = lib.hq_recipe_parse_string(_bytes(text), _bytes(name), o, out)
        else:
            if path is None:
                raise InvalidArgument("path: a recipe file, or text=... for a recipe string",
                                      argument="path")
            what = "recipe %s" % os.fspath(path)
            st = lib.hq_recipe_parse(_bytes(os.fspath(path)), o, out)
        _check(st, what)
        self._own(out[0], lib.hq_recipe_free)
        errs = self.errors
        if errs and not parse_only:
            self.close()
            raise ParseError("%s: %d error%s: %s" % (what, len(errs), "s" * (len(errs) > 1),
                                                      "; ".join(errs)), lib.HQ_EPARSE, errs)

    @classmethod
    def from_string(cls, text, name="<string>", **kw):
        return cls(text=text, name=name, **kw)

    @property
    def errors(self):
        return [_text(lib.hq_recipe_error(self.ptr, i))
                for i in range(lib.hq_recipe_error_count(self.ptr))]

    @property
    def name(self):
        return _text(lib.hq_recipe_name(self.ptr))

    @property
    def path(self):
        return _text(lib.hq_recipe_path(self.ptr))

    def roles(self):
        out = []
        ri = ffi.new("hq_role_info *")
        for i in range(lib.hq_recipe_role_count(self.ptr)):
            ri.struct_size = ffi.sizeof("hq_role_info")
            _check(lib.hq_recipe_role_info(self.ptr, i, ri), "hq_recipe_role_info")
            out.append({"pattern": _text(ri.pattern), "rowwise": _text(ri.rowwise),
                        "columnwise": _text(ri.columnwise), "line": ri.line})
        return out

    def quantizer(self, role, state=None):
        return Quantizer(self, role, state)

    def __repr__(self):
        return "hq.Recipe(%r)" % (None if self.closed else (self.name or self.path))


def _role(role):
    """('linear', 'weight', 'fc1') or 'linear:weight:fc1' -> (hq_role struct, keepalive)."""
    if isinstance(role, str):
        parts = role.split(":", 2)
        if len(parts) != 3:
            raise InvalidArgument("role: %r; expected 'module_type:tensor_type:name'" % role,
                                  argument="role")
    else:
        parts = list(role)
        if len(parts) != 3:
            raise InvalidArgument("role: expected three strings", argument="role")
    keep = [ffi.new("char[]", _bytes(p)) for p in parts]
    r = ffi.new("hq_role *")
    r.struct_size = ffi.sizeof("hq_role")
    r.module_type, r.tensor_type, r.name = keep
    return r, keep


class Quantizer(_Owned):
    """What a role of a recipe resolves to: one format per direction."""
    _kind = "quantizer"

    def __init__(self, recipe, role, state=None):
        r, keep = _role(role)
        out = ffi.new("hq_quantizer **")
        st = state.ptr if state is not None else ffi.NULL
        _check(lib.hq_quantizer_create_ex(recipe.ptr, r, st, out),
               "quantizer for role %s" % ":".join(ffi.string(k).decode() for k in keep))
        self._own(out[0], lib.hq_quantizer_free)
        self.role = ":".join(ffi.string(k).decode() for k in keep)
        self._state = state

    @property
    def usage(self):
        return lib.hq_quantizer_usage(self.ptr)

    @usage.setter
    def usage(self, dirs):
        _check(lib.hq_quantizer_set_usage(self.ptr, dirs), "hq_quantizer_set_usage")

    def format(self, direction=ROWWISE):
        return _text(lib.hq_quantizer_format(self.ptr, direction))

    def plugin(self, direction=ROWWISE):
        return _text(lib.hq_quantizer_plugin(self.ptr, direction))

    def quantize(self, ctx, src, dirs=0):
        return QTensor._quantize(self, ctx, src, dirs)

    def empty(self, ctx, rows, cols, nominal="float32"):
        out = ffi.new("hq_qtensor **")
        _check(lib.hq_make_empty(self.ptr, ctx.ptr, rows, cols, _HP_BY_NAME[nominal], out),
               "hq_make_empty (%s)" % self.role)
        return QTensor(out[0], ctx)

    def __repr__(self):
        return "hq.Quantizer(%r)" % self.role


def quantize(quantizer, ctx, src, dirs=0):
    return QTensor._quantize(quantizer, ctx, src, dirs)


class Buffer:
    """One buffer of a quantized tensor's storage, aliasing hq's memory: NumPy reads it through
    __array_interface__ (host), CuPy / Numba / torch through __cuda_array_interface__ (device);
    .numpy() and .torch() make such views. It keeps its qtensor alive, but the memory is only
    valid until the qtensor is updated in a way that moves it (save, drop, free)."""

    def __init__(self, qt, dirn, b):
        self._qt = qt
        self._keep = qt.ptr    # the C qtensor lives while a view of its memory does
        qt._views.add(self)
        self.direction = "rowwise" if dirn == ROWWISE else "columnwise"
        self.name = _text(b.name)
        self.dtype = dtype_name(b.dtype)
        self._dt = b.dtype
        self.shape = tuple(b.shape[i] for i in range(b.ndim))
        self.nbytes = b.bytes
        self.ptr = int(ffi.cast("uintptr_t", b.ptr))
        self.device = qt.device
        self.shared = bool(b.flags & lib.HQ_BUF_SHARED)

    def _iface(self):
        shape = self.shape
        if self._dt == lib.HQ_E2M1X2:
            # two FP4 codes per byte along the last dimension
            shape = shape[:-1] + ((shape[-1] + 1) // 2,)
        return {"shape": shape, "typestr": _TYPESTR[self._dt], "data": (self.ptr, False),
                "version": 3, "strides": None}

    @property
    def __array_interface__(self):
        if self.device != HOST:
            raise AttributeError("a device buffer has __cuda_array_interface__")
        return self._iface()

    @property
    def __cuda_array_interface__(self):
        if self.device == HOST:
            raise AttributeError("a host buffer has __array_interface__")
        d = self._iface()
        d["stream"] = None  # ordered by the caller on the qtensor's context's stream
        return d

    def numpy(self):
        import numpy as np
        a = np.asarray(self)
        if self._dt == lib.HQ_BF16:
            try:
                import ml_dtypes
                a = a.view(ml_dtypes.bfloat16)
            except ImportError:
                pass
        return a

    def torch(self):
        import torch
        if self.device == HOST:
            import numpy as np
            t = torch.from_numpy(np.asarray(self))
        else:
            t = torch.as_tensor(self, device="cuda:%d" % self.device)
        view = {lib.HQ_BF16: torch.bfloat16, lib.HQ_E4M3: torch.float8_e4m3fn,
                lib.HQ_E5M2: torch.float8_e5m2,
                lib.HQ_E8M0: getattr(torch, "float8_e8m0fnu", None)}.get(self._dt)
        return t.view(view) if view is not None else t

    def __repr__(self):
        return "hq.Buffer(%s %s %s %s)" % (self.direction, self.name, self.dtype, self.shape)


class QTensor(_Owned):
    """A quantized tensor (up to two storages: rowwise, columnwise)."""
    _kind = "quantized tensor"

    def __init__(self, p, ctx):
        self._own(p, lib.hq_qtensor_free)
        self.device = lib.hq_qtensor_device(p)
        self.ctx = ctx
        self._views = weakref.WeakSet()

    def close(self):
        """Free the quantized tensor; while a Buffer view of its memory (or an array made from
        one) is alive, the C side is freed when the last of them goes instead."""
        if self._p is not None and len(self._views):
            self._p = None
            return
        _Owned.close(self)

    @classmethod
    def _quantize(cls, q, ctx, src, dirs=0):
        v = as_tensor(src, "src", ctx.device)
        out = ffi.new("hq_qtensor **")
        if dirs:
            a = ffi.new("hq_quantize_args *")
            a.struct_size = ffi.sizeof("hq_quantize_args")
            a.dirs = dirs
            st = lib.hq_quantize_ex(q.ptr, ctx.ptr, v.t, a, out)
        else:
            st = lib.hq_quantize(q.ptr, ctx.ptr, v.t, out)
        _check(st, "quantize (%s)", q.role)
        return cls(out[0], ctx)

    def update(self, src, ctx=None):
        ctx = ctx or self.ctx
        v = as_tensor(src, "src", ctx.device)
        _check(lib.hq_qtensor_update(self.ptr, ctx.ptr, v.t), "update (%s)", self.role)

    def dequantize(self, direction=ROWWISE, out=None, ctx=None, dtype="float32"):
        """Direction `direction` in high precision: into `out` (an array / tensor on the
        qtensor's device) or, on the host, into a new NumPy array of `dtype`."""
        ctx = ctx or self.ctx
        if out is None:
            if self.device != HOST:
                torch = _torch()
                if torch is None:
                    raise InvalidArgument("out: needed for a device qtensor without torch",
                                          argument="out")
                out = torch.empty(self.shape, dtype=getattr(torch, dtype),
                                  device="cuda:%d" % self.device)
            else:
                import numpy as np
                if dtype == "bfloat16":
                    import ml_dtypes
                    dtype = ml_dtypes.bfloat16
                out = np.empty(self.shape, dtype=dtype)
        v = as_tensor(out, "out", ctx.device, writable=True)
        if (v.t.rows, v.t.cols) != self.shape:
            raise _arg_error("out", "shape %s holds [%d, %d]; the qtensor is %s"
                             % (list(v.shape), v.t.rows, v.t.cols, list(self.shape)))
        _check(lib.hq_dequantize(self.ptr, ctx.ptr, direction, v.t),
               "dequantize (%s)" % self.role)
        return out

    @property
    def shape(self):
        return (lib.hq_qtensor_rows(self.ptr), lib.hq_qtensor_cols(self.ptr))

    @property
    def dirs(self):
        return lib.hq_qtensor_dirs(self.ptr)

    @property
    def usage(self):
        return lib.hq_qtensor_usage(self.ptr)

    @usage.setter
    def usage(self, dirs):
        _check(lib.hq_qtensor_set_usage(self.ptr, dirs), "hq_qtensor_set_usage")

    def drop(self, dirs):
        _check(lib.hq_qtensor_drop(self.ptr, dirs), "hq_qtensor_drop")

    @property
    def role(self):
        return _text(lib.hq_qtensor_role(self.ptr)) if self._p is not None else "closed"

    def format(self, direction=ROWWISE):
        return _text(lib.hq_qtensor_format(self.ptr, direction))

    def nbytes(self, direction=ROWWISE):
        return lib.hq_qtensor_bytes(self.ptr, direction)

    def buffers(self, direction=ROWWISE):
        """The buffers of a present direction, as Buffer views of hq's memory."""
        s = lib.hq_qtensor_storage(self.ptr, direction)
        if s == ffi.NULL:
            raise StateError("buffers: direction %s is not present (%s)"
                             % (_text(lib.hq_dir_name(direction)), self.role))
        return [Buffer(self, direction, lib.hq_storage_buf(ffi.cast("hq_storage *", s), i))
                for i in range(s.nbuf)]

    def __repr__(self):
        if self.closed:
            return "hq.QTensor(closed)"
        return "hq.QTensor(%s, %s, rowwise=%s, columnwise=%s)" % (
            self.role, list(self.shape), self.format(ROWWISE), self.format(COLWISE))


def _operand(x, argument, ctx):
    """hq_operand of a QTensor or a high-precision tensor; returns (operand, keepalive)."""
    if isinstance(x, QTensor):
        if x.device != ctx.device:
            raise _arg_error(argument, "a qtensor on %s, but the context is on %s"
                             % (_device_str(x.device), _device_str(ctx.device)))
        return lib.hq_operand_q(x.ptr), x
    v = as_tensor(x, argument, ctx.device)
    return lib.hq_operand_hp(v.t), v


class GemmInfo(dict):
    """What ran: path, provider, m, n, k, formats, reason."""


def _info_new():
    i = ffi.new("hq_gemm_info *")
    i.struct_size = ffi.sizeof("hq_gemm_info")
    return i


def _info_dict(i):
    return GemmInfo(path=_text(lib.hq_gemm_path_name(i.path)), provider=_text(i.provider),
                    m=i.m, n=i.n, k=i.k, format_a=_text(i.format_a),
                    format_b=_text(i.format_b), reason=_text(i.reason))


def _out(x, argument, ctx, shape):
    v = as_tensor(x, argument, ctx.device, (lib.HQ_F32, lib.HQ_BF16), writable=True)
    if (v.t.rows, v.t.cols) != tuple(shape):
        raise _arg_error(argument, "shape %s; expected [%d, %d]" % (list(v.shape), *shape))
    return v


def gemm(ctx, a, transa, b, transb, d, alpha=1.0, beta=0.0, bias=None, flags=0, what=None):
    """hq_gemm (column-major convention of hq/hq.h): D = alpha op(A) op(B) + beta D. Returns
    what ran (a GemmInfo: path, provider, m, n, k, formats, reason)."""
    oa, ka = _operand(a, "a", ctx)
    ob, kb = _operand(b, "b", ctx)
    vd = as_tensor(d, "d", ctx.device, (lib.HQ_F32, lib.HQ_BF16), writable=True)
    args = ffi.new("hq_gemm_args *")
    args.struct_size = ffi.sizeof("hq_gemm_args")
    args.flags = flags
    vb = None
    if bias is not None:
        vb = as_tensor(bias, "bias", ctx.device, (lib.HQ_F32, lib.HQ_BF16))
        args.bias = vb.t.data
        args.bias_dtype = vb.t.dtype
    keep = ffi.new("char[]", _bytes(what)) if what else ffi.NULL
    args.what = keep
    info = _info_new()
    _check(lib.hq_gemm(ctx.ptr, oa, int(transa), ob, int(transb), vd.t, alpha, beta, args,
                       info), "gemm")
    return _info_dict(info)


def _rows_cols(x):
    if isinstance(x, QTensor):
        return x.shape
    shape = tuple(x.shape)
    r = 1
    for s in shape[:-1]:
        r *= s
    return (r, shape[-1])


def linear_fprop(ctx, x, w, y, bias=None, info=False):
    """y[tokens, out] = x w^T (+ bias): hq_linear_fprop. info=True returns what ran (a
    GemmInfo)."""
    ox, kx = _operand(x, "x", ctx)
    ow, kw = _operand(w, "w", ctx)
    vy = _out(y, "y", ctx, (_rows_cols(x)[0], _rows_cols(w)[0]))
    bptr, bdt, vb = ffi.NULL, lib.HQ_F32, None
    if bias is not None:
        vb = as_tensor(bias, "bias", ctx.device, (lib.HQ_F32, lib.HQ_BF16))
        if vb.t.rows * vb.t.cols != _rows_cols(w)[0]:
            raise _arg_error("bias", "%d values; expected %d" % (vb.t.rows * vb.t.cols,
                                                               _rows_cols(w)[0]))
        bptr, bdt = vb.t.data, vb.t.dtype
    i = _info_new() if info else ffi.NULL
    _check(lib.hq_linear_fprop(ctx.ptr, ox, ow, bptr, bdt, vy.t, i), "linear fprop")
    return _info_dict(i) if info else None


def linear_dgrad(ctx, dy, w, dx, info=False):
    """dx[tokens, in] = dy w: hq_linear_dgrad."""
    ody, k1 = _operand(dy, "dy", ctx)
    ow, k2 = _operand(w, "w", ctx)
    vx = _out(dx, "dx", ctx, (_rows_cols(dy)[0], _rows_cols(w)[1]))
    i = _info_new() if info else ffi.NULL
    _check(lib.hq_linear_dgrad(ctx.ptr, ody, ow, vx.t, i), "linear dgrad")
    return _info_dict(i) if info else None


def linear_wgrad(ctx, x, dy, dw, accumulate=False, info=False):
    """dw[out, in] = dy^T x (+ dw): hq_linear_wgrad."""
    ox, k1 = _operand(x, "x", ctx)
    ody, k2 = _operand(dy, "dy", ctx)
    vw = _out(dw, "dw", ctx, (_rows_cols(dy)[1], _rows_cols(x)[1]))
    i = _info_new() if info else ffi.NULL
    _check(lib.hq_linear_wgrad(ctx.ptr, ox, ody, vw.t, int(accumulate), i), "linear wgrad")
    return _info_dict(i) if info else None


class State(_Owned):
    """The scaling state (delayed scaling) of a recipe's quantizers on a context's device."""
    _kind = "scaling state"

    def __init__(self, recipe, ctx):
        out = ffi.new("hq_state **")
        _check(lib.hq_state_create(recipe.ptr if recipe is not None else ffi.NULL, ctx.ptr, out),
               "hq_state_create")
        self._own(out[0], lib.hq_state_free)
        self.ctx = ctx

    def update(self, ctx=None):
        _check(lib.hq_state_update(self.ptr, (ctx or self.ctx).ptr), "hq_state_update")

    def amaxes(self):
        """(pointer as int, count) of the amaxes a trainer all-reduces with MAX."""
        p = ffi.new("float **")
        n = ffi.new("size_t *")
        _check(lib.hq_state_amaxes(self.ptr, p, n), "hq_state_amaxes")
        return int(ffi.cast("uintptr_t", p[0])), n[0]


def adam_step(ctx, grad, master, m, v, qweight=None, *, lr, step, beta1=0.9, beta2=0.999,
              eps=1e-8, weight_decay=0.0):
    """hq_adam_step (libhqtrain): AdamW on the FP32 master (updated in place with m and v) from
    grad, then the quantized weight written back from the new master."""
    vg = as_tensor(grad, "grad", ctx.device)
    shape = (vg.t.rows, vg.t.cols)
    ptrs = []
    for name, a in (("master", master), ("m", m), ("v", v)):
        va = as_tensor(a, name, ctx.device, (lib.HQ_F32,), writable=True)
        if (va.t.rows, va.t.cols) != shape:
            raise _arg_error(name, "shape %s; the gradient is %s" % (list(va.shape), list(shape)))
        ptrs.append(va)
    ad = ffi.new("hq_adam *")
    ad.struct_size = ffi.sizeof("hq_adam")
    ad.lr, ad.beta1, ad.beta2, ad.eps, ad.weight_decay = lr, beta1, beta2, eps, weight_decay
    ad.step = step
    qw = qweight.ptr if qweight is not None else ffi.NULL
    _check(lib.hq_adam_step(ctx.ptr, ad, vg.t, ffi.cast("float *", ptrs[0].t.data),
                            ffi.cast("float *", ptrs[1].t.data),
                            ffi.cast("float *", ptrs[2].t.data), qw), "adam step")


class CheckpointWriter(_Owned):
    """A safetensors checkpoint being written (hq_ckpt_writer): close() writes the file, a
    `with` block that raises aborts it."""
    _kind = "checkpoint writer"

    def __init__(self, path):
        out = ffi.new("hq_ckpt_writer **")
        self.path = os.fspath(path)
        _check(lib.hq_ckpt_writer_open(_bytes(self.path), out), "checkpoint %s" % self.path)
        self._own(out[0], lib.hq_ckpt_writer_abort)

    def add_qtensor(self, name, qt, ctx=None):
        _check(lib.hq_ckpt_add_qtensor(self.ptr, (ctx or qt.ctx).ptr, _bytes(name), qt.ptr),
               "checkpoint %s: %s" % (self.path, name))

    def add_tensor(self, name, tensor, ctx):
        v = as_tensor(tensor, "tensor", None)
        _check(lib.hq_ckpt_add_tensor(self.ptr, ctx.ptr, _bytes(name), v.t),
               "checkpoint %s: %s" % (self.path, name))

    def add_meta(self, key, value):
        _check(lib.hq_ckpt_add_meta(self.ptr, _bytes(key), _bytes(value)),
               "checkpoint %s: %s" % (self.path, key))

    def close(self):
        p = self._p
        if p is None:
            return
        self._p = None
        # hq_ckpt_writer_close frees the writer also on failure: no abort afterwards
        ffi.gc(p, None)
        _check(lib.hq_ckpt_writer_close(p), "checkpoint %s" % self.path)

    def abort(self):
        _Owned.close(self)

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:
            self.abort()
        else:
            self.close()


class Checkpoint(_Owned):
    """An opened checkpoint (hq_ckpt). verify=False opens a file without checksums (another
    tool's safetensors file: HQ_CKPT_NO_VERIFY), which hq_ckpt_open refuses."""
    _kind = "checkpoint"

    def __init__(self, path, verify=True):
        out = ffi.new("hq_ckpt **")
        opts = ffi.new("hq_ckpt_open_opts *")
        opts.struct_size = ffi.sizeof("hq_ckpt_open_opts")
        opts.flags = 0 if verify else lib.HQ_CKPT_NO_VERIFY
        self.path = os.fspath(path)
        _check(lib.hq_ckpt_open_ex(_bytes(self.path), opts, out), "checkpoint %s" % self.path)
        self._own(out[0], lib.hq_ckpt_close)

    def meta(self, key):
        return _text(lib.hq_ckpt_meta(self.ptr, _bytes(key)))

    def load_qtensor(self, name, qt, ctx=None):
        _check(lib.hq_ckpt_load_qtensor(self.ptr, (ctx or qt.ctx).ptr, _bytes(name), qt.ptr),
               "checkpoint %s: %s" % (self.path, name))

    def load_tensor(self, name, tensor, ctx):
        v = as_tensor(tensor, "tensor", None, writable=True)
        _check(lib.hq_ckpt_load_tensor(self.ptr, ctx.ptr, _bytes(name), v.t),
               "checkpoint %s: %s" % (self.path, name))

    def verify(self):
        """Read every entry against its checksum (hq_ckpt_verify): the bytes read; raises naming
        the first corrupt entry."""
        n = ffi.new("uint64_t *")
        _check(lib.hq_ckpt_verify(self.ptr, n), "checkpoint %s" % self.path)
        return int(n[0])

    def entries(self):
        """{entry name: (safetensors dtype, shape)} in the header's order (hq_ckpt_entry): a
        plain tensor's name, or "<name>/<buffer>" for a quantized tensor's buffers."""
        out = {}
        info = ffi.new("hq_ckpt_entry_info *")
        i = 0
        while True:
            name = lib.hq_ckpt_entry_name(self.ptr, i)
            if name == ffi.NULL:
                return out
            info.struct_size = ffi.sizeof("hq_ckpt_entry_info")
            _check(lib.hq_ckpt_entry(self.ptr, name, info), "checkpoint %s" % self.path)
            shape = tuple(info.shape[k] for k in range(info.ndim))
            out[_text(name)] = (_text(info.st_dtype), shape)
            i += 1


def default_recipe():
    """The path of the installed default recipe (what `hq train` uses without --recipe)."""
    return os.path.join(_text(lib.hq_py_recipedir), "recipe.ini")
