"""A diagnose result as a table: one row per (probe, metric, level, layer, head), long format.

The columns are :data:`FRAME_COLUMNS`: ``model, probe, level, layer, head, metric, value``. Every
per-head metric of every probe is there, undefined cells included (value None / NaN: a metric a
probe does not produce, a head with no counted row, a head a narrower layer does not have), so a
result of P probes with L levels each, N layers, H heads (the widest layer) and M metrics has
sum over probes of L × N × H × M rows, and a group-by never silently drops a head. ``layer`` is the
index into ``result.layers``. Rows are ordered by probe (as run), metric, level, layer, head. A
``--generate`` run adds probe ``generation`` last: one level per decoding step, the step's key
length (prompt + generated tokens so far, the query's own included). Where the run measured where
attention lands (``result.position_profiles()``), one metric per bin follows at the level it was
measured: ``received@A-B``, ``received_boost@A-B`` (keys A … B − 1) and ``distance@A-B`` (distances
A … B − 1), with the probe the profiles name.

:func:`records` needs nothing but the standard library; :func:`frame_csv` writes CSV with it (floats
as Python writes them, which read back exactly). :func:`to_frame` (pandas) and :func:`frame_parquet`
(pyarrow) need the optional extra ``pip install "ssacli[frame]"``. A Parquet file ssacli wrote
carries :data:`PARQUET_KEY` in its schema metadata, and a CSV file the header line, so a later run
can tell its own outputs (:func:`frame_written_by_ssacli`) from files it must not replace.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import UsageError

if TYPE_CHECKING:
    from .result import DiagnoseResult

GENERATION_PROBE = "generation"  # the probe column of --generate's rows (level: the key length)
FRAME_COLUMNS = ("model", "probe", "level", "layer", "head", "metric", "value")
FRAME_EXTRA = 'pip install "ssacli[frame]"'
PARQUET_KEY = b"ssacli"  # schema metadata key of a Parquet file ssacli wrote
FRAME_SCHEMA = {"schema": "ssacli-diagnose-frame", "schema_version": 1, "columns": list(FRAME_COLUMNS)}


def _cells(result: DiagnoseResult) -> Iterator[tuple[str, str, np.ndarray, np.ndarray]]:
    """Per probe and metric: (probe, metric, levels, values [level, layer, head]); then, for a
    ``--generate`` run, probe ``generation`` with the decoding step's key length as its level."""
    for probe in result.probes:
        levels = np.asarray(probe.levels, dtype=np.float64)
        for metric, values in probe.metrics.items():
            yield probe.name, metric, levels, np.asarray(values, dtype=np.float64)
    generation = getattr(result, "generation", None)
    if generation is not None:
        keys = np.asarray(generation.key_lengths(), dtype=np.float64)
        for metric, values in generation.metrics.items():
            yield GENERATION_PROBE, metric, keys, np.asarray(values, dtype=np.float64)
    profiles = result.position_profiles() if hasattr(result, "position_profiles") else None
    if profiles is not None:
        level = np.asarray([profiles.level], dtype=np.float64)
        for name, values, edges in (
            ("received", profiles.received, profiles.key_edges),
            ("received_boost", profiles.received_boost, profiles.key_edges),
            ("distance", profiles.distance, profiles.distance_edges),
        ):
            for b in range(values.shape[-1]):
                yield profiles.probe, f"{name}@{edges[b]}-{edges[b + 1]}", level, values[None, :, :, b]


def _columns(result: DiagnoseResult) -> dict[str, np.ndarray]:
    """The table as one numpy array per column (strings as object arrays)."""
    parts: dict[str, list[np.ndarray]] = {name: [] for name in FRAME_COLUMNS}
    for probe, metric, levels, values in _cells(result):
        level_index, layer, head = (a.ravel() for a in np.indices(values.shape))
        count = values.size
        parts["model"].append(np.full(count, result.model, dtype=object))
        parts["probe"].append(np.full(count, probe, dtype=object))
        parts["level"].append(levels[level_index] if count else np.zeros(0))
        parts["layer"].append(layer.astype(np.int64))
        parts["head"].append(head.astype(np.int64))
        parts["metric"].append(np.full(count, metric, dtype=object))
        parts["value"].append(values.ravel())
    empty = {"level": np.float64, "value": np.float64, "layer": np.int64, "head": np.int64}
    return {
        name: np.concatenate(chunks) if chunks else np.zeros(0, dtype=empty.get(name, object))
        for name, chunks in parts.items()
    }


def records(result: DiagnoseResult) -> list[dict[str, Any]]:
    """The long-format rows as plain dicts (no pandas): undefined values are None, as in the JSON."""
    rows = []
    for probe, metric, levels, values in _cells(result):
        for (level_index, layer, head), value in np.ndenumerate(values):
            rows.append({
                "model": result.model, "probe": probe, "level": float(levels[level_index]),
                "layer": layer, "head": head, "metric": metric,
                "value": float(value) if math.isfinite(value) else None,
            })  # fmt: skip
    return rows


def to_frame(result: DiagnoseResult):
    """The long-format table as a pandas DataFrame (undefined values NaN; ``layer``/``head`` int64)."""
    try:
        import pandas as pd
    except ImportError:
        raise UsageError(f"a data frame needs pandas: {FRAME_EXTRA}") from None
    return pd.DataFrame(_columns(result), columns=list(FRAME_COLUMNS))


def frame_csv(result: DiagnoseResult) -> str:
    """The table as CSV text: a header line, undefined values empty, floats written in full."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(FRAME_COLUMNS)
    for row in records(result):
        writer.writerow(["" if row[c] is None else row[c] for c in FRAME_COLUMNS])
    return buffer.getvalue()


def frame_parquet(result: DiagnoseResult) -> bytes:
    """The table as a Parquet file's bytes (undefined values null), marked as ssacli's own."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(f"Parquet output needs pyarrow: {FRAME_EXTRA}") from None
    columns = _columns(result)
    types = {"level": pa.float64(), "value": pa.float64(), "layer": pa.int64(), "head": pa.int64()}
    table = pa.table({
        name: pa.array(columns[name], type=types.get(name, pa.string()), from_pandas=name == "value")
        for name in FRAME_COLUMNS
    })  # fmt: skip
    table = table.replace_schema_metadata({PARQUET_KEY: json.dumps(FRAME_SCHEMA).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def require_frame_format(fmt: str) -> None:
    """Fail at once (exit 2) when the optional extra that ``fmt`` ("csv", "parquet") needs is missing."""
    if fmt == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise UsageError(f"Parquet output needs pyarrow: {FRAME_EXTRA}") from None


def frame_written_by_ssacli(path: str | Path, fmt: str) -> bool:
    """Whether the existing file ``path`` is a frame ssacli wrote: a CSV starting with the header
    line, a Parquet file whose schema metadata has :data:`PARQUET_KEY`."""
    path = Path(path)
    if fmt == "csv":
        header = ",".join(FRAME_COLUMNS)
        try:
            with path.open(encoding="utf-8", newline="") as handle:
                return handle.readline().rstrip("\r\n") == header
        except (OSError, UnicodeDecodeError):
            return False
    try:
        import pyarrow.parquet as pq

        metadata = pq.read_schema(path).metadata or {}
    except Exception:  # not Parquet at all (pyarrow raises its own error types)
        return False
    return PARQUET_KEY in metadata
