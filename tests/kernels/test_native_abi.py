"""The typed boundary of the native kernels (ssacli.kernels.native_abi, native_abi.h/.c): the argument
structs agree with the library's layout table, and any difference is named and makes the library
refused (one warning, the torch path); calls name every field; SSACLI_NATIVE is a switch of its own,
apart from SSACLI_COMPILE; native.disabled() holds in its own thread or task only; torch's sgemm is
known to take 32-bit integers before the kernels are given it."""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from ssacli.kernels import native, native_abi

ROOT = Path(__file__).resolve().parents[2]


def _library():
    lib = native.library()
    if lib is None:
        pytest.skip("the native kernels could not be built here (no C compiler)")
    return lib


def _struct(fields: list) -> type[native_abi.Args]:
    class Changed(native_abi.Args):
        __slots__ = ()
        _fields_ = fields

    return Changed


def _row_stats_with(fields: list) -> dict[str, native_abi.Kernel]:
    """KERNELS with ssacli_row_stats' struct replaced by one of these fields."""
    return {**native_abi.KERNELS, "ssacli_row_stats": native_abi.Kernel(_struct(fields), ctypes.c_int)}


ROW_FIELDS = list(native_abi.RowStatsArgs._fields_)
ROW_NAMES = [name for name, _ in ROW_FIELDS]


def _swapped(a: str, b: str) -> list:
    fields = list(ROW_FIELDS)
    i, j = ROW_NAMES.index(a), ROW_NAMES.index(b)
    fields[i], fields[j] = fields[j], fields[i]
    return fields


def test_python_and_the_library_agree_on_every_struct():
    assert native_abi.layout_problems(_library()) == []


@pytest.mark.parametrize(
    "kernels, named",
    [
        # two fields of the same size and kind swapped: only the names tell, and they are compared
        (_row_stats_with(_swapped("m", "l")), "ssacli_row_stats: field 9 is ('m', 72, 8, 'p') in C"),
        # an int read as a float: same size and offset, another kind
        (_row_stats_with([*ROW_FIELDS[:-1], ("threads", ctypes.c_float)]), "('threads', 208, 4, 'f') in Py"),
        # a field left out: fewer fields, a smaller struct
        (_row_stats_with(ROW_FIELDS[:-1]), "ssacli_row_stats: 27 fields and 216 bytes in C, 26 and 208"),
        # a kernel Python declares that the library does not have
        ({**native_abi.KERNELS, "ssacli_nothing": native_abi.KERNELS["ssacli_row_stats"]}, "ssacli_nothing"),
    ],
    ids=["swapped", "kind", "missing", "unknown kernel"],
)
def test_a_struct_that_differs_from_the_library_is_named(kernels, named):
    problems = native_abi.layout_problems(_library(), kernels)
    assert problems and any(named in problem for problem in problems), problems


def test_a_library_whose_structs_differ_is_refused_with_one_warning_and_the_torch_path_runs():
    """In a fresh process, ssacli_row_stats' struct in KERNELS (what the library is checked against
    at load) has two fields swapped: the library is refused with one RuntimeWarning naming the field,
    nothing native runs, and the statistics are the torch path's, exactly."""
    script = (
        "import ctypes, sys, warnings, torch\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from ssacli.kernels import native, native_abi\n"
        "from ssacli.kernels.online_stats import softmax_statistics\n"
        "from ssacli.kernels.stats_call import StatisticsCall\n"
        "from tests.kernels.test_native_abi import _row_stats_with, _swapped\n"
        "native_abi.KERNELS.update(_row_stats_with(_swapped('m', 'l')))\n"
        "q, k, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 4)\n"
        "def run():\n"
        "    return softmax_statistics(q, k, v, StatisticsCall(scaling=0.25), compile=False)[1].total\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    a = run(); b = run()\n"
        "with native.disabled():\n"
        "    torch_path = run()\n"
        "said = [str(w.message) for w in seen if 'native kernels failed' in str(w.message)]\n"
        "print(len(said), native.available(), native.library(), bool(torch.equal(a, torch_path)))\n"
        "print(said[0] if said else '')\n"
    )
    env = {**os.environ}
    env.pop("SSACLI_NATIVE", None)  # the load is the point, whatever the caller's setting
    done = subprocess.run(
        [sys.executable, "-c", script, str(ROOT)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    counts, message = done.stdout.splitlines()[-2:]
    if "no C compiler" in message:
        pytest.skip("no C compiler here")
    assert counts.split() == ["1", "False", "None", "True"]
    assert "loading ssacli's native kernels failed" in message and "field 9" in message
    assert "using the torch block math" in message


def test_a_call_must_name_every_field_and_only_fields():
    """Checked before the library is touched (a field left out would be a silent 0 or NULL)."""
    fields = dict.fromkeys(ROW_NAMES, 0)
    del fields["threads"]
    with pytest.raises(TypeError, match=r"missing \['threads'\]"):
        native_abi.call(None, "ssacli_row_stats", **fields)
    with pytest.raises(AttributeError, match="thread"):
        native_abi.call(None, "ssacli_row_stats", **fields, thread=1)
    for kernel in native_abi.KERNELS.values():  # __slots__ = () everywhere: no name is kept silently
        assert not hasattr(kernel.args(), "__dict__")


def _switches(env: dict) -> list[str]:
    script = (
        "from ssacli.kernels import compiled, native\n"
        "print(native.native_setting(), native.library() is None, native.available(),\n"
        "      compiled.compile_setting(), compiled.compile_enabled())\n"
    )
    done = subprocess.run([sys.executable, "-W", "error", "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_ssacli_native_and_ssacli_compile_are_separate_switches(tmp_path):
    """SSACLI_NATIVE=0 never builds or loads the kernels (a failing compiler and an empty cache: no
    warning, nothing written) and leaves torch.compile's setting alone; SSACLI_COMPILE=0 switches
    torch.compile off and leaves the native kernels on."""
    env = {k: v for k, v in os.environ.items() if k not in ("SSACLI_NATIVE", "SSACLI_COMPILE")}
    cache = tmp_path / "cache"
    off = _switches({**env, "SSACLI_NATIVE": "0", "CC": "false", "SSACLI_CACHE": str(cache)})
    assert off == ["0", "True", "False", "auto", "True"]
    assert not cache.exists()
    _library()
    assert _switches({**env, "SSACLI_COMPILE": "0"}) == ["auto", "False", "True", "0", "False"]


def test_disabled_holds_in_its_own_thread_only():
    """While one thread is inside native.disabled(), another thread (and the main one) still has the
    native kernels; nested blocks keep the outer, wider switch."""
    _library()
    flash = native.flash_available()
    inside, looked = threading.Event(), threading.Event()
    seen: dict[str, tuple[bool, bool]] = {}

    def switcher():
        with native.disabled():
            seen["switcher"] = (native.available(), native.flash_available())
            inside.set()
            looked.wait(60)
        seen["switcher after"] = (native.available(), native.flash_available())

    def other():
        inside.wait(60)
        seen["other"] = (native.available(), native.flash_available())
        looked.set()

    threads = [threading.Thread(target=switcher), threading.Thread(target=other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert seen == {"switcher": (False, False), "other": (True, flash), "switcher after": (True, flash)}
    with native.disabled(flash_only=True):
        assert (native.available(), native.flash_available()) == (True, False)
        with native.disabled():
            assert (native.available(), native.flash_available()) == (False, False)
            with native.disabled(flash_only=True):  # never switches back on what is off
                assert not native.available()
        assert (native.available(), native.flash_available()) == (True, False)
    assert (native.available(), native.flash_available()) == (True, flash)


def test_disabled_holds_in_its_own_asyncio_task_only():
    _library()

    async def main():
        inside, looked = asyncio.Event(), asyncio.Event()

        async def switcher():
            with native.disabled():
                inside.set()
                await looked.wait()
                return native.available()

        async def other():
            await inside.wait()
            looked.set()
            return native.available()

        return await asyncio.gather(switcher(), other())

    assert asyncio.run(main()) == [False, True]


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
