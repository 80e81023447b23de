"""What crosses the boundary between Python and ssacli's native kernels (ssacli.kernels.native): one
argument struct per entry point, and the integer width of the torch ``sgemm_`` the one-loop kernels
borrow.

**Argument structs, declared once.** Each C entry point takes one ``const struct ssacli_<kernel>_args *``
whose fields are declared once, in native_abi.h; the library exports a table of them (native_abi.c:
each struct's size and each field's name, offset, size, kind and pointee type). :class:`Library`
builds its ctypes structs from that table when it loads the library, so Python holds no copy of any
layout: it checks only that ctypes lays each struct out at the offsets C reports (it must, on the
same ABI) and that every kernel it calls (:data:`KERNELS`) is there, and refuses the library
otherwise (ssacli.kernels.native_library: one warning, the torch path). :meth:`Library.call` fills a
struct by field name, every field given (one left out would be a silent 0 or NULL), and takes tensors
for pointer fields: each must be on the CPU with the dtype the C field points at. What a kernel
needs beyond that (shapes, contiguity) is checked by the custom op that calls it (ssacli.kernels.native).

**torch's sgemm.** :func:`torch_sgemm` finds the Fortran ``sgemm_`` in libtorch, and
:func:`sgemm_integer_bits` learns the width of its integer arguments by a call that is safe and
observable for either width, before anything else calls it (see there).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import NamedTuple

import torch

_p, _i64, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int

# The entry points ssacli.kernels.native calls; a library without one of them is refused at load.
KERNELS = (
    "ssacli_row_stats", "ssacli_ssa_forward", "ssacli_ssa_backward", "ssacli_ssa_flash_forward",
    "ssacli_stats_flash", "ssacli_ssa_flash_backward",
)  # fmt: skip
# ctypes' type for each (kind, size) the table reports: pointers, 32/64-bit integers, floats.
_CTYPES = {("p", ctypes.sizeof(_p)): _p, ("i", 8): _i64, ("i", 4): ctypes.c_int32, ("f", 4): ctypes.c_float,
           ("f", 8): ctypes.c_double}  # fmt: skip
# The dtypes a tensor may have for a field pointing at each C element type (bool is one byte, as uint8).
_DTYPES = {"float32": (torch.float32,), "float64": (torch.float64,), "int64": (torch.int64,),
           "uint8": (torch.uint8, torch.bool)}  # fmt: skip


class Field(NamedTuple):
    """One field of an argument struct, as the library's table reports it."""

    name: str
    offset: int
    size: int
    kind: str  # "p" pointer, "i" integer, "f" floating point
    element: str  # a pointer's element type ("float32", "float64", "int64", "uint8"); "" otherwise


class Layout(NamedTuple):
    """An entry point's argument struct: its fields by name, and the ctypes struct built from them."""

    fields: dict[str, Field]
    struct: type[ctypes.Structure]


def _fields(lib: ctypes.CDLL, kernel: str) -> tuple[int, list[Field]]:
    """(struct size, fields) of ``kernel`` from the library's table."""
    count = ctypes.c_int64()
    size = lib.ssacli_abi_size(kernel.encode(), ctypes.byref(count))
    if size < 0:
        raise RuntimeError(f"{kernel}: not in the library's layout table")
    name, offset, width, kind, element = (
        ctypes.c_char_p(),
        _i64(),
        _i64(),
        ctypes.c_char(),
        ctypes.c_char_p(),
    )
    fields = []
    for i in range(count.value):
        refs = (ctypes.byref(x) for x in (name, offset, width, kind, element))
        if lib.ssacli_abi_field(kernel.encode(), i, *refs) != 0:
            raise RuntimeError(f"{kernel}: field {i} is missing from the library's layout table")
        fields.append(Field(name.value.decode(), offset.value, width.value, kind.value.decode(),
                            element.value.decode()))  # fmt: skip
    return size, fields


def _struct(kernel: str, size: int, fields: list[Field]) -> type[ctypes.Structure]:
    """The ctypes struct of ``fields``, checked to sit at C's offsets and size (the same ABI must agree)."""
    try:
        members = [(f.name, _CTYPES[(f.kind, f.size)]) for f in fields]
    except KeyError as err:
        raise RuntimeError(f"{kernel}: a field of kind and size {err.args[0]} has no ctypes type") from None
    struct = type(f"{kernel}_args", (ctypes.Structure,), {"_fields_": members, "__slots__": ()})
    for f in fields:
        if getattr(struct, f.name).offset != f.offset:
            offset = getattr(struct, f.name).offset
            raise RuntimeError(f"{kernel}: field {f.name!r} sits at {offset} in ctypes, {f.offset} in C")
    if ctypes.sizeof(struct) != size:
        raise RuntimeError(f"{kernel}: {ctypes.sizeof(struct)} bytes in ctypes, {size} in C")
    return struct


def _declare_table(lib: ctypes.CDLL) -> None:
    try:
        lib.ssacli_abi_kernel.restype = ctypes.c_char_p
        lib.ssacli_abi_kernel.argtypes = [_i64]
        lib.ssacli_abi_size.restype = _i64
        lib.ssacli_abi_size.argtypes = [ctypes.c_char_p, _p]
        lib.ssacli_abi_field.restype = _int
        lib.ssacli_abi_field.argtypes = [ctypes.c_char_p, _i64, *[_p] * 5]
    except AttributeError:
        raise RuntimeError("the library exports no layout table (ssacli_abi_size)") from None


class Library:
    """The loaded kernels with their argument structs, built from the library's own table; a
    RuntimeError (naming the difference) where a kernel of :data:`KERNELS` is missing or ctypes cannot
    lay a struct out as C did."""

    def __init__(self, lib: ctypes.CDLL, kernels: tuple[str, ...] | None = None):
        kernels = KERNELS if kernels is None else kernels
        _declare_table(lib)
        in_c = []
        while (name := lib.ssacli_abi_kernel(len(in_c))) is not None:
            in_c.append(name.decode())
        missing = sorted(set(kernels) - set(in_c))
        if missing:
            raise RuntimeError(f"the library lacks the kernels {missing}")
        self.cdll, self.layouts = lib, {}
        for kernel in in_c:
            size, fields = _fields(lib, kernel)
            struct = _struct(kernel, size, fields)
            self.layouts[kernel] = Layout({f.name: f for f in fields}, struct)
            function = getattr(lib, kernel)
            function.argtypes, function.restype = [ctypes.POINTER(struct)], _int

    def call(self, kernel: str, **values) -> int:
        """Run ``kernel`` on its struct filled from ``values`` by field name: every field given and no
        other (TypeError: a field left out would be a silent 0 or NULL), pointer fields as CPU tensors
        of the field's dtype (or None: NULL; an int for an untyped address)."""
        return getattr(self.cdll, kernel)(ctypes.byref(self.struct(kernel, **values)))

    def struct(self, kernel: str, **values) -> ctypes.Structure:
        """The filled struct of :meth:`call`, checked (nothing is called)."""
        layout = self.layouts[kernel]
        if values.keys() != layout.fields.keys():
            missing, extra = (
                sorted(layout.fields.keys() - values.keys()),
                sorted(values.keys() - layout.fields.keys()),
            )
            raise TypeError(f"{kernel}: fields missing {missing}, unknown {extra}")
        return layout.struct(**{name: _value(kernel, layout.fields[name], v) for name, v in values.items()})


def _value(kernel: str, field: Field, value):
    """A field's value as ctypes takes it: a tensor's address after its device and dtype are checked."""
    if not isinstance(value, torch.Tensor):
        if field.kind == "p" and field.element and value is not None:
            raise TypeError(
                f"{kernel}: field {field.name!r} takes a {field.element} tensor or None, got {value!r}"
            )
        return value
    if field.kind != "p" or not field.element:
        raise TypeError(f"{kernel}: field {field.name!r} is not a typed pointer; got a tensor")
    if value.device.type != "cpu" or value.dtype not in _DTYPES[field.element]:
        raise TypeError(f"{kernel}: field {field.name!r} takes a CPU {field.element} tensor, got "
                        f"{value.dtype} on {value.device}")  # fmt: skip
    return value.data_ptr()


def strides(*tensors: torch.Tensor) -> torch.Tensor:
    """The [batch, head, row] element strides of each 4-d tensor: the one-loop kernels' ``strides``
    field (native_math.h's STRIDES array; the caller keeps it alive through the call)."""
    return torch.tensor([s for t in tensors for s in t.stride()[:3]], dtype=torch.int64)


def flash_fields(sgemm: int, q, k, v, causal: bool, window: int | None) -> dict:
    """The fields the one-loop kernels share: torch's sgemm, q [B, H, Q, D], k [B, Hkv, K, D],
    v [B, Hkv, K, Dv] (last axes contiguous) and the band (``window`` None: 0, no window)."""
    (B, H, Q, D), (_, Hkv, K, _), Dv = q.shape, k.shape, v.shape[-1]
    return dict(gemm=sgemm, q=q, k=k, v=v, B=B, H=H, Hkv=Hkv, Q=Q, K=K, D=D, Dv=Dv, causal=int(causal),
                window=window or 0)  # fmt: skip


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
    "KERNELS", "Field", "Layout", "Library", "flash_fields", "sgemm_integer_bits", "strides", "torch_sgemm",
]  # fmt: skip
