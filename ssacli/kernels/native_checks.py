"""What every native custom op (ssacli.kernels.native, ssacli.kernels.native_blocks) checks before its
kernel runs, and the fields the ops share: the tensors' device, dtype, shape and contiguity (run by each
op's real and fake implementation, so a call traced by torch.compile is checked as an eager one is),
the loaded library, the position terms' bins and the thread count.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import native_abi
from .native_library import library
from .positions import PositionBins

F32, F64 = torch.float32, torch.float64


def threads_for(rows: int) -> int:
    """torch's intra-op thread count, at least 64 rows each."""
    return max(1, min(torch.get_num_threads(), rows // 64))


def require(t: Tensor | None, name: str, dtype: torch.dtype, shape=None, *, rows: bool = False) -> None:
    """An op's check of one tensor argument (run by its real and its fake implementation, so a call
    traced by torch.compile is checked too): CPU, ``dtype``, ``shape`` (None: any) and contiguous
    (``rows``: only the last axis; the one-loop kernels take any other strides)."""
    if t is None:
        return
    if t.device.type != "cpu" or t.dtype != dtype:
        raise TypeError(f"{name} must be a CPU {dtype} tensor, got {t.dtype} on {t.device}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must be {tuple(shape)}, got {tuple(t.shape)}")
    if rows and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}'s last axis must be contiguous")
    if not rows and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def loaded_library() -> native_abi.Library:
    """The loaded kernels; a RuntimeError where they are not built (an op called past choose_backend)."""
    lib = library()
    if lib is None:
        raise RuntimeError("ssacli's native kernels are not built here")
    return lib


def position_fields(
    kb: Tensor | None, db: Tensor | None, dist: Tensor | None, sink_k: int, bin_width: int
) -> dict:
    """The position-term fields (native_abi.h's SSACLI_POSITIONS): the kb, db and dist sums (float64,
    updated in place) and the bins, or a NULL kb (the terms are not measured)."""
    if kb is None:
        return dict(sink_k=0, bin_width=0, key_bins=0, distance_bins=0, kb=None, db=None, dist=None)
    return dict(sink_k=sink_k, bin_width=bin_width, key_bins=kb.shape[-1], distance_bins=db.shape[-1], kb=kb,
                db=db, dist=dist)  # fmt: skip


def require_positions(
    rows: tuple, kb, db, dist, sink_k: int, bin_width: int, keys_end: int, far: int
) -> None:
    """The position terms' checks: kb, db, dist float64 contiguous for ``rows``, together or not at all,
    with a bin for every key below ``keys_end`` and every distance up to ``far`` (the kernel adds into
    the bins it computes, unchecked)."""
    if not (kb is None) == (db is None) == (dist is None):
        raise ValueError("kb, db and dist come together")
    if kb is None:
        return
    bins = PositionBins(sink_k=sink_k, bin_width=bin_width)
    require(kb, "kb", F64, (*rows, max(kb.shape[-1], bins.key_bins(keys_end))))
    require(db, "db", F64, (*rows, max(db.shape[-1], PositionBins.distance_bins(far + 1))))
    require(dist, "dist", F64, rows)


def bins_of(state: dict) -> tuple[int, int]:
    """(sink_k, bin_width) of a state's position bins; (0, 0) where it measures none."""
    bins = state.get("bins")
    return (0, 0) if bins is None else (bins.sink_k, bins.bin_width)


__all__ = [
    "F32",
    "F64",
    "bins_of",
    "loaded_library",
    "position_fields",
    "require",
    "require_positions",
    "threads_for",
]
