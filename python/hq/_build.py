"""cffi (API mode) builder of hq._native, against the installed hq headers.

The cdef is not written by hand: it is extracted at build time from the installed hq/train.h
(which includes hq/hq.h, hq/plugin.h and hq/gemm_provider.h) and hq/adamw.h, found through
`pkg-config hqcore`. The C preprocessor expands the headers (so the declarations are exactly
what a C embedder compiles against); the declarations that come from hq's own headers are kept,
function bodies of static inline helpers become prototypes (cffi compiles a wrapper for them),
attributes are dropped, and every integer #define of those headers becomes a `#define NAME ...`
whose value the C compiler fills in. A header that changes is picked up by the next build.
"""
import os
import re
import shlex
import subprocess
import tempfile

from cffi import FFI

_HQ_HEADERS = ("hq.h", "plugin.h", "gemm_provider.h", "train.h", "adamw.h")
_SOURCE = "#include <hq/train.h>\n#include <hq/adamw.h>\n"
# hq.torch's per-call helpers (python/hq/_linear.c), compiled into the extension; their
# declarations, the one part of the cdef written here, must match that file
_LINEAR_C = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_linear.c")
_LINEAR_CDEF = """
typedef struct hqpy_io { hq_qtensor *qt; int aliased; } hqpy_io;
static const char *hqpy_failed_step(void);
static int hqpy_linear_fwd(hq_ctx *ctx, hq_quantizer *q, hqpy_io *io, uint32_t dirs,
                           uintptr_t x, hq_dtype xdt, int32_t dev, int64_t tokens, int64_t in,
                           const hq_qtensor *qw, uintptr_t bias, hq_dtype bdt, uintptr_t y,
                           hq_dtype ydt, int64_t out);
static int hqpy_linear_bwd(hq_ctx *ctx, hq_quantizer *q, hqpy_io *io, uint32_t dirs,
                           uintptr_t dy, hq_dtype dydt, int32_t dev, int64_t tokens, int64_t out,
                           const hq_qtensor *qw, const hq_qtensor *qx, int64_t in, uintptr_t dx,
                           hq_dtype dxdt, uintptr_t dw, hq_dtype dwdt);
"""


def _pkg_config(*args):
    pc = os.environ.get("PKG_CONFIG", "pkg-config")
    try:
        out = subprocess.run([pc, *args, "hqcore"], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        msg = getattr(e, "stderr", "") or str(e)
        raise RuntimeError(
            "hq: `pkg-config %s hqcore` failed (%s); install hq first (scripts/install.sh) or "
            "set PKG_CONFIG_PATH to the directory of its hqcore.pc" % (" ".join(args), msg.strip()))
    return shlex.split(out.stdout)


def _preprocess(cflags):
    cc = shlex.split(os.environ.get("CC", "cc"))
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "hq_cdef.c")
        with open(src, "w") as f:
            f.write(_SOURCE)
        out = subprocess.run(cc + ["-E", "-dD", *cflags, src], check=True, capture_output=True,
                             text=True)
    return out.stdout


def _strip_attributes(text):
    # __attribute__((...)) with nested parentheses
    while True:
        i = text.find("__attribute__")
        if i < 0:
            return text
        text = text[:i] + text[_closing(text, text.index("(", i), "(", ")") + 1:]


def _closing(text, i, open_, close):
    """The index of the bracket closing the one at text[i]."""
    depth = 0
    for k in range(i, len(text)):
        if text[k] == open_:
            depth += 1
        elif text[k] == close:
            depth -= 1
            if depth == 0:
                return k
    raise ValueError("unbalanced %s%s in the preprocessed headers" % (open_, close))


def _drop_bodies(text, inline):
    """static inline functions -> prototypes: a top-level {...} right after ')' is a body (the
    function's name is added to `inline`)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == "{":
            prev = "".join(out).rstrip()
            k = _closing(text, i, "{", "}")
            if prev.endswith(")"):
                inline.add(_function_name(prev[prev.rfind(";") + 1:]))
                out.append(";")
                i = k + 1
                continue
            out.append(text[i:k + 1])  # a struct / enum / union body: kept whole
            i = k + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _function_name(decl):
    m = re.search(r"(\w+)\s*\(", decl)
    return m.group(1) if m else None


def _keep_exported(text, inline, exported):
    """Drop the prototypes of functions neither inline nor exported by the libraries: the
    headers also declare the entry points a plugin defines (hq_format_module_v2)."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
        elif c == ";" and depth == 0:
            stmt = text[start:i + 1]
            start = i + 1
            body = stmt.strip()
            if not body.startswith("typedef") and "{" not in body and "(" in body:
                name = _function_name(body)
                if name not in inline and name not in exported:
                    continue
            out.append(stmt)
    out.append(text[start:])
    return "".join(out)


_INT_DEFINE = re.compile(r"^#define\s+([A-Z][A-Z0-9_]*)\s+(.+?)\s*$")
_FN_DEFINE = re.compile(r"^#define\s+([A-Za-z_]\w*)\([^)]*\)\s*(.*?)\s*$")


def extract_cdef(preprocessed, exported):
    """The declarations and integer constants of hq's headers in `cc -E -dD` output; functions
    only where `exported` (the libraries' symbols) has them or they are static inline."""
    decls, defines, keep, not_int = [], [], False, set()
    for line in preprocessed.splitlines():
        m = re.match(r'^# \d+ "([^"]*)"', line)
        if m:
            path = m.group(1).replace("\\", "/")
            keep = any(path.endswith("/hq/" + h) for h in _HQ_HEADERS)
            continue
        if not keep:
            continue
        if line.startswith("#"):
            f = _FN_DEFINE.match(line)
            if f and not _is_int_expr(f.group(2)):
                not_int.add(f.group(1))
            d = _INT_DEFINE.match(line)
            # an integer-looking value that expands a non-integer function-like macro (the
            # struct initialisers HQ_*_INIT = HQ_STRUCT_INIT(type)) is not a constant
            if d and _is_int_expr(d.group(2)) and \
                    not not_int.intersection(re.findall(r"[A-Za-z_]\w*", d.group(2))):
                defines.append(d.group(1))
            continue
        decls.append(line)
    text = _strip_attributes("\n".join(decls))
    text = re.sub(r"\bstatic\s+inline\b|\binline\b", "", text)
    inline = set()
    text = _keep_exported(_drop_bodies(text, inline), inline, exported)
    # the header guard and include-once macros have no value; names kept once, in order
    seen, consts = set(), []
    for name in defines:
        if name not in seen:
            seen.add(name)
            consts.append("#define %s ..." % name)
    return text + "\n" + "\n".join(consts) + "\n"


def _is_int_expr(value):
    if '"' in value or "'" in value or "{" in value or "__" in value:
        return False
    if re.search(r"\d\.\d|\d[eE][-+]?\d|\bf\b", value):
        return False
    if not re.fullmatch(r"[\w\s()|&<>+\-*~,/]+", value):
        return False
    # an integer value, or an expression of numbers, offsetof/sizeof and other HQ_ constants
    idents = re.findall(r"[A-Za-z_]\w*", value)
    ok = {"offsetof", "sizeof", "ull", "u", "ul", "ll", "U", "UL", "ULL", "void", "int64_t",
          "uint64_t", "int32_t", "uint32_t", "size_t", "float", "double"}
    for w in idents:
        if w in ok or w.startswith("HQ_") or w.startswith("hq_") or re.fullmatch(r"\d+\w*", w):
            continue
        return False
    return bool(re.search(r"\d", value)) or any(w.startswith("HQ_") for w in idents)


def _split_flags(flags, prefix):
    return [f[len(prefix):] for f in flags if f.startswith(prefix)]


def _c_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _exported(libdirs, libnames):
    """Names the shared libraries define (nm -D)."""
    names = set()
    for lib in libnames:
        for d in libdirs + ["/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu",
                            "/usr/lib/aarch64-linux-gnu"]:
            path = os.path.join(d, "lib%s.so" % lib)
            if os.path.exists(path):
                break
        else:
            raise RuntimeError("hq: lib%s.so not found in %s" % (lib, libdirs))
        out = subprocess.run([os.environ.get("NM", "nm"), "-D", "--defined-only", path],
                             check=True, capture_output=True, text=True).stdout
        names.update(line.split()[-1] for line in out.splitlines() if line.strip())
    return names


def make_ffi():
    cflags = _pkg_config("--cflags")
    libs = _pkg_config("--libs")
    exported = _exported(_split_flags(libs, "-L"), _split_flags(libs, "-l"))
    cdef = extract_cdef(_preprocess(cflags), exported)
    # where the installed default recipe lives (hq train's default), for hq.default_recipe()
    recipedir = _pkg_config("--variable=recipedir")
    recipedir = recipedir[0] if recipedir else ""
    ffi = FFI()
    ffi.cdef(cdef + "static const char *const hq_py_recipedir;\n" + _LINEAR_CDEF)
    libdirs = _split_flags(libs, "-L")
    with open(_LINEAR_C) as f:
        linear = f.read()
    ffi.set_source(
        "hq._native", _SOURCE + "static const char *const hq_py_recipedir = %s;\n"
        % _c_string(recipedir) + linear,
        include_dirs=_split_flags(cflags, "-I"),
        extra_compile_args=[f for f in cflags if not f.startswith("-I")],
        library_dirs=libdirs,
        libraries=_split_flags(libs, "-l"),
        # the libhqcore this was built against, also where it is not on the loader's path
        runtime_library_dirs=libdirs,
    )
    return ffi


ffibuilder = make_ffi()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
