"""The typed boundary of the native kernels (ssacli.kernels.native_abi, native_abi.h/.c): the argument
structs are declared once, in C, and Python builds its ctypes structs from the library's own layout
table, refusing a library it cannot lay out as C did or one that lacks a kernel (one warning, the torch
path); calls name every field and give pointer fields tensors of the field's dtype; SSACLI_BACKEND
naming a torch path never builds the kernels; torch's sgemm is known to take 32-bit integers before
the kernels are given it."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ssacli.kernels import native, native_abi

ROOT = Path(__file__).resolve().parents[2]


def _library() -> native_abi.Library:
    lib = native.library()
    if lib is None:
        pytest.skip("the native kernels could not be built here (no C compiler)")
    return lib


def test_python_lays_out_every_struct_as_the_library_says():
    """Every kernel Python calls is in the library's table, and each ctypes struct built from the table
    has the table's offsets, sizes and pointee types (the structs are declared in C alone)."""
    lib = _library()
    assert set(native_abi.KERNELS) <= set(lib.layouts)
    for kernel, layout in lib.layouts.items():
        assert [name for name, _ in layout.struct._fields_] == list(layout.fields)
        for field in layout.fields.values():
            assert getattr(layout.struct, field.name).offset == field.offset, (kernel, field)
            assert getattr(layout.struct, field.name).size == field.size, (kernel, field)
    row = lib.layouts["ssacli_row_stats"].fields  # what the C declares, as the table tells it
    assert (row["t"].kind, row["t"].element) == ("p", "float32")
    assert (row["vis"].element, row["vis_off"].element, row["m"].element) == ("uint8", "int64", "float64")
    assert (row["C"].kind, row["C"].size, row["threads"].size) == ("i", 8, 4)
    assert lib.layouts["ssacli_ssa_flash_forward"].fields["gemm"].element == ""  # an address


def _fields(*specs) -> list[native_abi.Field]:
    return [native_abi.Field(*spec) for spec in specs]


@pytest.mark.parametrize(
    "size, fields, named",
    [
        # a table whose offsets no C compiler on this ABI would give: the field is named
        (
            16,
            _fields(("a", 0, 8, "i", ""), ("b", 4, 8, "p", "float32")),
            "field 'b' sits at 8 in ctypes, 4 in C",
        ),
        # a struct size that disagrees with its fields
        (24, _fields(("a", 0, 8, "i", ""), ("b", 8, 8, "p", "float32")), "16 bytes in ctypes, 24 in C"),
        # a kind and size ctypes has no type for
        (2, _fields(("a", 0, 2, "i", "")), "kind and size ('i', 2)"),
    ],
    ids=["offset", "size", "kind"],
)
def test_a_table_ctypes_cannot_reproduce_is_refused_naming_why(size, fields, named):
    with pytest.raises(RuntimeError, match=named.replace("(", r"\(").replace(")", r"\)")):
        native_abi._struct("ssacli_test", size, fields)


def test_a_library_that_lacks_a_kernel_is_refused_with_one_warning_and_the_torch_path_runs():
    """In a fresh process Python calls one kernel more than the library has: the library is refused
    with one RuntimeWarning naming it, nothing native runs, and the statistics are the torch path's,
    exactly."""
    script = (
        "import sys, warnings, torch\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from ssacli.kernels import native, native_abi\n"
        "from ssacli.kernels.online_stats import softmax_statistics\n"
        "from ssacli.kernels.stats_call import StatisticsCall\n"
        "native_abi.KERNELS = (*native_abi.KERNELS, 'ssacli_nothing')\n"
        "q, k, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 4)\n"
        "def run(backend='auto'):\n"
        "    return softmax_statistics(q, k, v, StatisticsCall(scaling=0.25), backend=backend)[1].total\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    a = run(); b = run()\n"
        "torch_path = run('torch-blocks')\n"
        "said = [str(w.message) for w in seen if 'native kernels failed' in str(w.message)]\n"
        "same = bool(torch.equal(a, torch_path))\n"
        "print(len(said), native.available(), native.kernels_here() == '', same)\n"
        "print(said[0] if said else '')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SSACLI_BACKEND"}  # the load is the point
    done = subprocess.run(
        [sys.executable, "-c", script, str(ROOT)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    counts, message = done.stdout.splitlines()[-2:]
    if "no C compiler" in message:
        pytest.skip("no C compiler here")
    assert counts.split() == ["1", "False", "True", "True"]
    assert "loading ssacli's native kernels failed" in message and "ssacli_nothing" in message
    assert "using the torch block math" in message


def test_a_call_must_name_every_field_and_only_fields():
    """Checked before the library is touched (a field left out would be a silent 0 or NULL)."""
    lib = _library()
    fields = dict.fromkeys(lib.layouts["ssacli_row_stats"].fields, None)
    for name in ("C", "r0", "r1", "top_k", "key0", "pos0", "width", "sink_k", "bin_width", "key_bins",
                 "distance_bins", "threads"):  # fmt: skip
        fields[name] = 0
    lib.struct("ssacli_row_stats", **fields)
    del fields["threads"]
    with pytest.raises(TypeError, match=r"missing \['threads'\]"):
        lib.struct("ssacli_row_stats", **fields)
    with pytest.raises(TypeError, match=r"unknown \['thread'\]"):
        lib.struct("ssacli_row_stats", **fields, thread=1)


def test_a_pointer_field_takes_a_cpu_tensor_of_its_dtype():
    """The dtype comes from the C declaration (float * is float32, double * float64, ...)."""
    lib = _library()
    field = lib.layouts["ssacli_row_stats"].fields
    assert native_abi._value("k", field["t"], torch.zeros(3)) != 0
    assert native_abi._value("k", field["vis"], torch.zeros(3, dtype=torch.bool)) != 0  # one byte, as uint8
    with pytest.raises(TypeError, match="field 't' takes a CPU float32 tensor, got torch.float64"):
        native_abi._value("k", field["t"], torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="field 'm' takes a CPU float64 tensor, got torch.float32"):
        native_abi._value("k", field["m"], torch.zeros(3))
    with pytest.raises(TypeError, match="field 'm' takes a float64 tensor or None"):
        native_abi._value("k", field["m"], 12345)  # a raw address where a tensor belongs
    with pytest.raises(TypeError, match="field 'C' is not a typed pointer"):
        native_abi._value("k", field["C"], torch.zeros(3))


def test_ssacli_backend_torch_blocks_never_builds_the_kernels(tmp_path):
    """SSACLI_BACKEND=torch-blocks (a failing compiler and an empty cache): SSA attention and the
    statistics run without a warning and nothing is built or written."""
    script = (
        "import torch\n"
        "from ssacli.kernels import native_library\n"
        "from ssacli.kernels.fused import ssa_attention\n"
        "from ssacli.kernels.online_stats import softmax_statistics\n"
        "from ssacli.kernels.stats_call import StatisticsCall\n"
        "q = torch.randn(1, 2, 8, 16, requires_grad=True)\n"
        "ssa_attention(q, q, q, 0.8, 1.5, causal=True).sum().backward()\n"
        "softmax_statistics(q.detach(), q.detach(), q.detach(), StatisticsCall(scaling=0.25, causal=True))\n"
        "print(native_library._load.cache_info().currsize)\n"
    )
    cache = tmp_path / "cache"
    env = {**os.environ, "SSACLI_BACKEND": "torch-blocks", "CC": "false", "SSACLI_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-W", "error", "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0"]  # the library was never looked up
    assert not cache.exists()


def test_torch_sgemm_takes_32_bit_integers():
    """The probe (native_abi.sgemm_integer_bits) on the sgemm_ the one-loop kernels are given."""
    address = native_abi.torch_sgemm()
    if address is None:
        pytest.skip("torch has no MKL sgemm_ here")
    assert native_abi.sgemm_integer_bits(address) == 32


def test_the_probe_tells_a_64_bit_sgemm(capfd):
    """oneMKL also exports sgemm_64 (64-bit integers) from libtorch: the same probe says 64, safely
    (its M reads as negative: MKL rejects the call at its argument check and prints why)."""
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        address = ctypes.cast(lib.sgemm_64, ctypes.c_void_p).value
    except (OSError, AttributeError):
        pytest.skip("no sgemm_64 in this torch")
    assert native_abi.sgemm_integer_bits(address) == 64
    capfd.readouterr()  # MKL's "Parameter 3 was incorrect on entry to SGEMM"
