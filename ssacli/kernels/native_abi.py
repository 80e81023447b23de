"""What crosses the boundary between Python and ssacli's native kernels (ssacli.kernels.native): one
argument struct per entry point, and the integer width of the torch ``sgemm_`` the one-loop kernels
borrow.

**Argument structs.** Each C entry point takes one ``const struct ssacli_<kernel>_args *``
(native_abi.h); :data:`KERNELS` holds the same structs as ctypes.Structure classes, fields in the
same order, named as in C, of the same kinds. Where one argument out of place in a positional call
would be silent memory corruption, here:

* a call fills its struct by field name, and every field must be given (:func:`call`: a field left
  out would otherwise be a silent 0 or NULL);
* at load, :func:`layout_problems` compares every struct with the table the library exports
  (native_abi.c: the struct's size, and each field's name, offset, size and kind — pointer, integer,
  floating point — all derived from the same field lists as the C structs) and the kernels' names on
  both sides; ssacli.kernels.native refuses a library with any difference (one warning, the torch
  path).

**torch's sgemm.** :func:`torch_sgemm` finds the Fortran ``sgemm_`` in libtorch, and
:func:`sgemm_integer_bits` learns the width of its integer arguments by a call that is safe and
observable for either width, before anything else calls it (see there).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import ClassVar, NamedTuple

import torch

_p, _i64, _int, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


class Args(ctypes.Structure):
    """An argument struct; :func:`call` fills it by field name, every field given. Each subclass
    declares ``__slots__ = ()``: a name that is no field then raises AttributeError where ctypes
    would keep it as a Python attribute. (No __init__ of its own to check the names: that makes
    ctypes' construction three times slower, ~7 µs a call.)"""

    __slots__ = ()
    names: ClassVar[frozenset[str]] = frozenset()  # its fields' names

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__slots__" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} must declare __slots__ = () (see Args)")
        cls.names = frozenset(name for name, _ in cls.__dict__.get("_fields_", ()))


def _fields(spec: str) -> list[tuple[str, type]]:
    """'name:type …' (p pointer, i int64, int, f float) as ctypes fields: one line per struct below."""
    kinds = {"p": _p, "i": _i64, "int": _int, "f": _f32}
    return [(name, kinds[kind]) for name, kind in (item.split(":") for item in spec.split())]


# The order is the C order (native_abi.h); layout_problems checks it against the library.
_FLASH_HEAD = "gemm:p q:p k:p v:p"
_FLASH_SHAPE = "B:i H:i Hkv:i Q:i K:i D:i Dv:i causal:int window:i"
_POSITIONS = "sink_k:i bin_width:i key_bins:i distance_bins:i kb:p db:p dist:p"  # kb None: not measured


class RowStatsArgs(Args):
    __slots__ = ()
    _fields_ = _fields(
        "t:p raw:p vis:p vis_off:p C:i r0:i r1:i top_k:i p:p m:p l:p spread:p shrink:p top:p sq:p cnt:p "
        f"key0:i pos0:i width:i {_POSITIONS} threads:int"
    )


class SsaForwardArgs(Args):
    __slots__ = ()
    _fields_ = _fields(
        "y:p C:i r0:i r1:i n_head:p heads:i p:p m:p s:p width:i causal:int diag:i window:i threads:int"
    )


class SsaBackwardArgs(Args):
    __slots__ = ()
    _fields_ = _fields(
        "y:p dp:p C:i r0:i r1:i n_head:p heads:i lse:p delta:p dn_row:p width:i causal:int diag:i "
        "window:i threads:int"
    )


class SsaFlashForwardArgs(Args):
    __slots__ = ()
    _fields_ = _fields(
        f"{_FLASH_HEAD} strides:p n_head:p {_FLASH_SHAPE} rows:i cols:i out:p lse:p threads:int"
    )


class StatsFlashArgs(Args):
    __slots__ = ()
    _fields_ = _fields(
        f"{_FLASH_HEAD} strides:p scaling:f {_FLASH_SHAPE} target:p top_k:i rows:i cols:i out:p m:p l:p "
        f"spread:p top:p sq:p cnt:p first:p t_target:p x_target:p {_POSITIONS} threads:int"
    )


class SsaFlashBackwardArgs(Args):
    __slots__ = ()
    _fields_ = _fields(
        f"{_FLASH_HEAD} dout:p strides:p n_head:p lse:p delta:p {_FLASH_SHAPE} rows:i cols:i dq:p "
        "dk_h:p dv_h:p dn:p threads:int"
    )


class Kernel(NamedTuple):
    """An entry point: its argument struct and what it returns (None: void)."""

    args: type[Args]
    returns: type | None


KERNELS: dict[str, Kernel] = {
    "ssacli_row_stats": Kernel(RowStatsArgs, _int),
    "ssacli_ssa_forward": Kernel(SsaForwardArgs, None),
    "ssacli_ssa_backward": Kernel(SsaBackwardArgs, None),
    "ssacli_ssa_flash_forward": Kernel(SsaFlashForwardArgs, _int),
    "ssacli_stats_flash": Kernel(StatsFlashArgs, _int),
    "ssacli_ssa_flash_backward": Kernel(SsaFlashBackwardArgs, _int),
}


def _kind(ctype: type) -> str:
    """The C table's kind of a ctypes field type: 'p' pointer, 'f' floating point, 'i' integer."""
    if ctype in (ctypes.c_float, ctypes.c_double):
        return "f"
    if ctype in (ctypes.c_void_p, ctypes.c_char_p) or issubclass(ctype, ctypes._Pointer):
        return "p"
    return "i"


def _c_layout(lib: ctypes.CDLL, kernel: str) -> tuple[int, list[tuple[str, int, int, str]]] | None:
    """The library's (struct size, [(field, offset, size, kind)]) for ``kernel``; None: not in its table."""
    count = ctypes.c_int64()
    size = lib.ssacli_abi_size(kernel.encode(), ctypes.byref(count))
    if size < 0:
        return None
    name, offset, width, kind = ctypes.c_char_p(), ctypes.c_int64(), ctypes.c_int64(), ctypes.c_char()
    fields = []
    for i in range(count.value):
        refs = (ctypes.byref(x) for x in (name, offset, width, kind))
        if lib.ssacli_abi_field(kernel.encode(), i, *refs) != 0:
            return None
        fields.append((name.value.decode(), offset.value, width.value, kind.value.decode()))
    return size, fields


def layout_problems(lib: ctypes.CDLL, kernels: dict[str, Kernel] | None = None) -> list[str]:
    """How ``kernels`` (default :data:`KERNELS`) differ from the library's own argument structs: the
    kernels named on each side, and per kernel its struct's size and each field's name, offset, size
    and kind, in order. Empty: they agree, and the library may be called."""
    kernels = KERNELS if kernels is None else kernels
    try:
        lib.ssacli_abi_kernel.restype = ctypes.c_char_p
        lib.ssacli_abi_kernel.argtypes = [_i64]
        lib.ssacli_abi_size.restype = _i64
        lib.ssacli_abi_size.argtypes = [ctypes.c_char_p, _p]
        lib.ssacli_abi_field.restype = _int
        lib.ssacli_abi_field.argtypes = [ctypes.c_char_p, _i64, _p, _p, _p, _p]
    except AttributeError:
        return ["the library exports no layout table (ssacli_abi_size)"]
    in_c = []
    while (name := lib.ssacli_abi_kernel(len(in_c))) is not None:
        in_c.append(name.decode())
    problems = []
    if sorted(in_c) != sorted(kernels):
        problems.append(f"the library has kernels {sorted(in_c)}, Python declares {sorted(kernels)}")
    for kernel, declared in kernels.items():
        layout = _c_layout(lib, kernel)
        if layout is None:
            problems.append(f"{kernel}: not in the library's layout table")
            continue
        size, c_fields = layout
        struct = declared.args
        py_fields = [
            (name, getattr(struct, name).offset, getattr(struct, name).size, _kind(ctype))
            for name, ctype in struct._fields_
        ]
        for i, (c_field, py_field) in enumerate(zip(c_fields, py_fields)):
            if c_field != py_field:
                problems.append(f"{kernel}: field {i} is {c_field} in C, {py_field} in Python")
                break
        if len(c_fields) != len(py_fields) or size != ctypes.sizeof(struct):
            problems.append(
                f"{kernel}: {len(c_fields)} fields and {size} bytes in C, {len(py_fields)} and "
                f"{ctypes.sizeof(struct)} in Python"
            )
    return problems


def declare(lib: ctypes.CDLL, kernels: dict[str, Kernel] | None = None) -> None:
    """Give each kernel its one argument (a pointer to its struct) and its return type."""
    for kernel, declared in (KERNELS if kernels is None else kernels).items():
        function = getattr(lib, kernel)
        function.argtypes = [ctypes.POINTER(declared.args)]
        function.restype = declared.returns


def call(lib: ctypes.CDLL, kernel: str, **fields):
    """Run ``kernel`` (declared by :func:`declare`) on its struct filled from ``fields`` by name; every
    field must be given (TypeError: one left out would be a silent 0 or NULL), and no other (an
    unknown name: AttributeError)."""
    struct = KERNELS[kernel].args
    if len(fields) != len(struct.names):  # with no unknown name (AttributeError), a missing one
        missing, extra = sorted(struct.names - fields.keys()), sorted(fields.keys() - struct.names)
        raise TypeError(f"{kernel}: fields missing {missing}, unknown {extra}")
    args = struct(**fields)  # before the library is looked at: an unknown name fails here
    return getattr(lib, kernel)(ctypes.byref(args))


def strides(*tensors: torch.Tensor) -> torch.Tensor:
    """The [batch, head, row] element strides of each 4-d tensor: the one-loop kernels' ``strides``
    field (native_math.h's STRIDES array; the caller keeps it alive through the call)."""
    return torch.tensor([s for t in tensors for s in t.stride()[:3]], dtype=torch.int64)


def flash_fields(sgemm: int, q, k, v, causal: bool, window: int | None) -> dict:
    """The fields the one-loop kernels share: torch's sgemm, q [B, H, Q, D], k [B, Hkv, K, D],
    v [B, Hkv, K, Dv] (last axes contiguous) and the band (``window`` None: 0, no window)."""
    (B, H, Q, D), (_, Hkv, K, _), Dv = q.shape, k.shape, v.shape[-1]
    return dict(gemm=sgemm, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), B=B, H=H, Hkv=Hkv, Q=Q, K=K,
                D=D, Dv=Dv, causal=int(causal), window=window or 0)  # fmt: skip


# ---- torch's own sgemm ------------------------------------------------------------------------------


def torch_sgemm() -> int | None:
    """The address of the Fortran ``sgemm_`` that libtorch_cpu exports where torch is built with MKL
    (torch links MKL into it); None where torch has no MKL or the symbol is not exported. Nothing is
    called: see :func:`sgemm_integer_bits` before any call."""
    if not torch.backends.mkl.is_available():
        return None
    lib_dir = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        try:
            return ctypes.cast(ctypes.CDLL(str(lib_dir / name)).sgemm_, _p).value
        except (OSError, AttributeError):
            continue
    return None


_SGEMM_TYPE = ctypes.CFUNCTYPE(None, *[ctypes.c_char_p] * 2, *[_p] * 11)


def sgemm_integer_bits(address: int) -> int | None:
    """The width of the integer arguments of the Fortran sgemm at ``address``: 32 (LP64, what the
    kernels pass: native_math.h's sgemm_fn), 64 (ILP64), or None (neither answer, or a big-endian
    machine, where the probe below is not safe).

    The probe is one product C = A·B of 1×1 matrices (A = 2, B = 3, C's four floats -1, beta 0) whose
    integer arguments each point at 8 bytes, so either width reads only memory that is there: N, K
    and the leading dimensions hold the 64-bit value 1, which either width reads as 1; M holds the
    32-bit halves (1, -1), so a 32-bit sgemm reads M = 1 and writes C[0] = 6, while a 64-bit one
    reads M = 1 − 2³² < 0 and returns at its argument check without touching C (MKL's xerbla prints
    "Parameter 3 was incorrect" and returns; MKL is the only BLAS :func:`torch_sgemm` takes). 32 is
    the answer only if C is exactly (6, -1, -1, -1)."""
    if sys.byteorder != "little":
        return None
    i32, f32 = ctypes.c_int32, ctypes.c_float
    m = (i32 * 2)(1, -1)
    n, k, lda, ldb, ldc = ((i32 * 2)(1, 0) for _ in range(5))
    a, b, c = (f32 * 1)(2.0), (f32 * 1)(3.0), (f32 * 4)(-1.0, -1.0, -1.0, -1.0)
    alpha, beta = f32(1.0), f32(0.0)
    sgemm = _SGEMM_TYPE(address)
    sgemm(b"N", b"N", m, n, k, ctypes.byref(alpha), a, lda, b, ldb, ctypes.byref(beta), c, ldc)
    result = list(c)
    if result == [6.0, -1.0, -1.0, -1.0]:
        return 32
    if result == [-1.0] * 4:
        return 64
    return None


__all__ = [
    "Args", "KERNELS", "Kernel", "RowStatsArgs", "SsaBackwardArgs", "SsaFlashBackwardArgs",
    "SsaFlashForwardArgs", "SsaForwardArgs", "StatsFlashArgs", "call", "declare", "flash_fields",
    "layout_problems", "sgemm_integer_bits", "strides", "torch_sgemm",
]  # fmt: skip
