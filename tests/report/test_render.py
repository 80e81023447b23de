"""`ssacli render`: a saved diagnose result drawn again equals what diagnose printed and wrote; its
long-format table (to_records, to_frame, CSV, Parquet) holds every metric cell of the JSON; the
JSON Schema accepts every result written and rejects broken ones; bad input is one line and the
documented exit code, and no output ssacli did not write is replaced.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

import ssacli
from ssacli.diagnosis.frames import FRAME_COLUMNS
from ssacli.errors import EXIT_INPUT, EXIT_USAGE, InputError
from tests.helpers.cli import run_main, unwritable
from tests.helpers.models import build_model
from tests.helpers.result_schema import VALIDATOR, diagnose_results, schema_errors, written_file_errors

# Two probes with two levels each and the length probe (it has its own extras and fading summary).
PROBES = ["--probe", "outlier:1,10", "--probe", "logit-scale:1,4", "--probe", "length"]
QUICK = ["--samples", "1", "--length", "8", "--random", *PROBES]
ELAPSED = re.compile(r"elapsed(</th><td>|\s+)[0-9.]+ s")  # the run's wall time: a timing, masked


def cli(args: list[str]) -> tuple[int, str, str]:
    """ssacli.cli.main in-process (a module fixture cannot use capsys): (exit code, stdout, stderr)."""
    from ssacli.cli import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["ssacli", *args])
        patch.setenv("COLUMNS", "100")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exit_info:
                code = exit_info.code or 0
    return code, out.getvalue(), err.getvalue()


def printed(stdout: str) -> str:
    """A report as printed, without its timing and the "wrote FILE" lines (they name other files)."""
    return ELAPSED.sub(
        "elapsed", "\n".join(line for line in stdout.splitlines() if not line.startswith("wrote "))
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path | str]:
    """Tiny llama and gpt2 diagnosed through the CLI: their JSON, HTML and terminal output, and a
    comparison of the two (llama as A, the saved gpt2 JSON as B)."""
    root = tmp_path_factory.mktemp("render")
    out: dict[str, Path | str] = {"root": root}
    for family in ("llama", "gpt2"):
        model = root / family
        build_model(family).save_pretrained(model)
        json_out, html_out = root / f"{family}.json", root / f"{family}.html"
        code, stdout, stderr = cli(
            ["diagnose", str(model), *QUICK, "--json", str(json_out), "--html", str(html_out)]
        )
        assert code == 0, stderr
        out[family], out[f"{family}_html"], out[f"{family}_printed"] = json_out, html_out, stdout
    cmp_json, cmp_html = root / "cmp.json", root / "cmp.html"
    args = ["diagnose", str(root / "llama"), *QUICK, "--compare", str(out["gpt2"])]
    code, stdout, stderr = cli([*args, "--json", str(cmp_json), "--html", str(cmp_html)])
    assert code == 0, stderr
    out.update(cmp=cmp_json, cmp_html=cmp_html, cmp_printed=stdout)
    # one probe, for the tests of what a write may replace: each page it draws costs a third
    out["small"] = root / "small.json"
    small = ["--samples", "1", "--length", "8", "--random", "--probe", "outlier:1,10", "-q"]
    code, _, stderr = cli(["diagnose", str(root / "llama"), *small, "--json", str(out["small"])])
    assert code == 0, stderr
    return out


# ---- render equals what diagnose printed and wrote -------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_render_prints_and_writes_what_diagnose_did(saved, family, tmp_path):
    html = tmp_path / "again.html"
    code, stdout, stderr = cli(["render", str(saved[family]), "--html", str(html)])
    assert code == 0, stderr
    assert printed(stdout) == printed(saved[f"{family}_printed"])
    assert "verdict" in stdout and "outlier" in stdout  # the report itself, not an empty match
    assert ELAPSED.sub("", html.read_text()) == ELAPSED.sub("", saved[f"{family}_html"].read_text())
    assert f"wrote {html}" in stdout


def test_render_compare_and_a_saved_comparison_equal_diagnose_compare(saved, tmp_path):
    html = tmp_path / "cmp.html"
    code, stdout, stderr = cli(
        ["render", str(saved["llama"]), "--compare", str(saved["gpt2"]), "--html", str(html)]
    )
    assert code == 0, stderr
    assert printed(stdout) == printed(saved["cmp_printed"])
    assert ELAPSED.sub("", html.read_text()) == ELAPSED.sub("", saved["cmp_html"].read_text())
    code, stdout, stderr = cli(["render", str(saved["cmp"])])  # the comparison document itself
    assert code == 0, stderr
    assert printed(stdout) == printed(saved["cmp_printed"])


def test_api_render_equals_the_command(saved):
    from rich.console import Console

    result = ssacli.DiagnoseResult.load(saved["llama"])
    console = Console(file=io.StringIO(), width=100)
    ssacli.render(result, console=console)
    assert printed(console.file.getvalue()) == printed(saved["llama_printed"])
    assert ssacli.render_html(result) == saved["llama_html"].read_text()
    assert [r.model for r in ssacli.load_saved(saved["cmp"])] == [
        str(saved["root"] / f) for f in ("llama", "gpt2")
    ]


# ---- the long-format table -------------------------------------------------------------------------


def expected_rows(document: dict) -> list[tuple]:
    """The table read straight from the JSON: every metric cell, None where null; then the position
    profiles' bins, one metric per bin at the level they were measured."""
    rows = []
    for probe in document["probes"]:
        for metric, cube in probe["metrics"].items():
            for li, level in enumerate(probe["levels"]):
                for layer, heads in enumerate(cube[li]):
                    for head, value in enumerate(heads):
                        rows.append((document["model"], probe["name"], level, layer, head, metric, value))
    positions = document.get("positions")
    bins = {"received": "key_edges", "received_boost": "key_edges", "distance": "distance_edges"}
    for name, edges in bins.items():
        cube = positions[name] if positions else []
        for b in range(len(cube[0][0]) if cube else 0):
            metric = f"{name}@{positions[edges][b]}-{positions[edges][b + 1]}"
            for layer, heads in enumerate(cube):
                for head, values in enumerate(heads):
                    where = (document["model"], positions["probe"], positions["level"], layer, head)
                    rows.append((*where, metric, values[b]))
    return rows


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_frame_has_every_cell_of_the_json(saved, family):
    document = json.loads(saved[family].read_text())
    layers, heads = len(document["layers"]), max(document["heads"])
    count = sum(len(p["levels"]) * layers * heads * len(p["metrics"]) for p in document["probes"])
    profiles = document["positions"]
    count += sum(len(profiles[k][0][0]) * layers * heads for k in ("received", "received_boost", "distance"))
    result = ssacli.DiagnoseResult.load(saved[family])
    records = result.to_records()
    assert len(records) == count > 0
    assert [tuple(r[c] for c in FRAME_COLUMNS) for r in records] == expected_rows(document)
    frame = result.to_frame()
    assert list(frame.columns) == list(FRAME_COLUMNS) and len(frame) == count
    assert str(frame["layer"].dtype) == "int64" and str(frame["value"].dtype) == "float64"
    values = [None if math.isnan(v) else v for v in frame["value"]]
    assert values == [row[-1] for row in expected_rows(document)]
    assert 0 < frame["value"].isna().sum() < count  # length's target metrics are undefined, others not


def test_csv_and_parquet_read_back_equal_the_frame(saved, tmp_path):
    csv_file, parquet_file = tmp_path / "heads.csv", tmp_path / "heads.parquet"
    code, stdout, stderr = cli(
        ["render", str(saved["gpt2"]), "--quiet", "--csv", str(csv_file), "--parquet", str(parquet_file)]
    )
    assert code == 0, stderr
    assert stdout.splitlines() == [f"wrote {csv_file}", f"wrote {parquet_file}"]  # --quiet: no report
    frame = ssacli.DiagnoseResult.load(saved["gpt2"]).to_frame()
    back = pd.read_csv(csv_file, float_precision="round_trip", keep_default_na=False, na_values=[""])
    pd.testing.assert_frame_equal(back, frame, check_exact=True)
    pd.testing.assert_frame_equal(pd.read_parquet(parquet_file), frame, check_exact=True)


def test_frame_without_pandas_names_the_extra(saved, monkeypatch):
    result = ssacli.DiagnoseResult.load(saved["llama"])
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(ssacli.SsacliError, match=r'pip install "ssacli\[frame\]"'):
        result.to_frame()
    assert len(result.to_records()) > 0 and result.to_csv().startswith(",".join(FRAME_COLUMNS))


def test_parquet_without_pyarrow_is_one_line_exit_2(saved, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    out = tmp_path / "t.parquet"
    code, _, stderr = run_main(["render", str(saved["llama"]), "--parquet", str(out)], monkeypatch, capsys)
    assert_one_line(stderr, code, EXIT_USAGE, 'pip install "ssacli[frame]"')
    assert not out.exists()


# ---- the JSON Schema -------------------------------------------------------------------------------


def test_every_written_result_follows_the_schema(saved):
    documents = [json.loads(saved[name].read_text()) for name in ("llama", "gpt2", "cmp")]
    assert [len(schema_errors(d)) for d in documents] == [0, 0, 0]
    assert sum(1 for d in documents for _ in diagnose_results(d)) == 4  # llama, gpt2, the pair's sides
    icl = ssacli.diagnose(
        "builtin:every-softmax", samples=1, length=6, probes=[ssacli.parse_probe("dominant-key:0,8")]
    )
    assert schema_errors(icl.to_dict()) == []  # the ICL family: error instead of loss, no vocabulary


def broken(document: dict, change) -> dict:
    copied = copy.deepcopy(document)
    change(copied)
    return copied


MUTATIONS = {
    "newer schema_version": lambda d: d.update(schema_version=4),
    "other schema": lambda d: d.update(schema="ssacli-report"),
    "no probes": lambda d: d.pop("probes"),
    "unknown top-level field": lambda d: d.update(colour="red"),
    "metric as [level][layer]": lambda d: d["probes"][0]["metrics"].update(entropy=[[0.5]]),
    "value as text": lambda d: d["probes"][0]["metrics"]["entropy"][0][0].__setitem__(0, "0.5"),
    "negative row count": lambda d: d["probes"][0]["rows"][0].__setitem__(0, -1),
    "level missing": lambda d: d["probes"][0].pop("levels"),
    "verdict without text": lambda d: next(iter(d["summary"]["verdicts"].values())).pop("text"),
    "reach of another kind": lambda d: d["probes"][0]["summary"]["reach"].update(kind="sideways"),
    "heads as text": lambda d: d.update(heads=["4"]),
    "summary without verdicts": lambda d: d["summary"].pop("verdicts"),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_schema_rejects_a_broken_result(saved, name, tmp_path):
    document = json.loads(saved["llama"].read_text())
    assert list(VALIDATOR.iter_errors(document)) == []
    bad = broken(document, MUTATIONS[name])
    if bad.get("schema") == "ssacli-report":  # no longer a diagnose result: validated directly
        assert list(VALIDATOR.iter_errors(bad))
        return
    assert schema_errors(bad), name
    file = tmp_path / "bad.json"
    file.write_text(json.dumps({"a": bad}))  # nested, as in a comparison: the conftest hook's reader
    assert written_file_errors(file, file)


def test_the_conftest_hook_watches_ssacli_writes():
    from ssacli import files

    assert files.publish.__name__ == "validating_publish"


# ---- bad input: one line, the documented exit code, nothing written ---------------------------------


def assert_one_line(stderr: str, code: int, expected: int, *words: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == expected, stderr
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in stderr, stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_bad_result_files(saved, tmp_path, monkeypatch, capsys):
    document = json.loads(saved["llama"].read_text())
    cases = {
        "missing.json": (None, "does not exist"),
        "text.json": ("not json at all", "cannot read"),
        "list.json": ("[1, 2]", "JSON list"),
        "report.json": (json.dumps({"schema": "ssacli-report", "schema_version": 1}), "`ssacli report` JSON"),
        "check.json": (json.dumps({"schema": "ssacli-check", "schema_version": 1}), "`ssacli check` JSON"),
        "other.json": (json.dumps({"schema": "something"}), "not a diagnose result"),
        "newer.json": (json.dumps({**document, "schema_version": 99}), "upgrade ssacli"),
        "malformed.json": (json.dumps({"schema": "ssacli-diagnose", "schema_version": 3}), "malformed"),
        "half-comparison.json": (
            json.dumps({"schema": "ssacli-diagnose-comparison", "a": document}),
            "both sides",
        ),
    }
    html = tmp_path / "never.html"
    for name, (content, words) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_text(content)
        code, _, stderr = run_main(["render", str(path), "--html", str(html)], monkeypatch, capsys)
        assert_one_line(stderr, code, EXIT_INPUT, words, name)
        assert not html.exists(), name


def test_a_metric_array_of_the_wrong_shape_is_an_input_error(saved, tmp_path, monkeypatch, capsys):
    """A result whose metric array misses a layer (edited, cut short) is the user's input: an
    InputError through the API, one line and the input exit code through `ssacli render`."""
    document = json.loads(saved["llama"].read_text())
    probe = document["probes"][0]
    probe["metrics"]["entropy"] = [level[:-1] for level in probe["metrics"]["entropy"]]
    with pytest.raises(InputError, match=f"probe {probe['name']}: metric entropy has shape"):
        ssacli.DiagnoseResult.from_dict(document)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    code, _, stderr = run_main(["render", str(bad)], monkeypatch, capsys)
    assert_one_line(stderr, code, EXIT_INPUT, str(bad), "metric entropy has shape", "re-create it")
    assert "ValueError" not in stderr  # the problem in words, not an exception's repr


def test_bad_options(saved, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.csv"
    cases = [
        (["--compare", str(saved["cmp"])], "comparison of two results"),
        (["--csv", str(out), "--compare", str(saved["gpt2"])], "export one result"),
        (["--heatmap", "nope", "--csv", str(out)], "unknown heatmap metric"),
        (["--heatmap", "max_weight@embed-scale", "--csv", str(out)], "no probe 'embed-scale'"),
        (["--csv", str(out), "--parquet", str(out)], "the same file"),
    ]
    for extra, words in cases:
        code, _, stderr = run_main(["render", str(saved["llama"]), *extra], monkeypatch, capsys)
        assert_one_line(stderr, code, EXIT_USAGE, words)
        assert not out.exists(), extra
    code, _, stderr = run_main(
        ["render", str(saved["cmp"]), "--compare", str(saved["gpt2"])], monkeypatch, capsys
    )
    assert_one_line(stderr, code, EXIT_USAGE, "already a comparison")
    target = unwritable(tmp_path) / "out.html"
    code, _, stderr = run_main(["render", str(saved["llama"]), "--html", str(target)], monkeypatch, capsys)
    assert_one_line(stderr, code, EXIT_INPUT, "--html")


@pytest.mark.parametrize("option", ["--html", "--csv", "--parquet"])
def test_a_file_ssacli_did_not_write_is_never_replaced(saved, option, tmp_path, monkeypatch, capsys):
    suffix = option.lstrip("-")
    theirs = tmp_path / f"notes.{suffix}"
    theirs.write_text("model,probe\nmy own notes\n" if suffix == "csv" else "<html><title>mine</title>")
    code, _, stderr = run_main(["render", str(saved["small"]), option, str(theirs)], monkeypatch, capsys)
    assert_one_line(stderr, code, EXIT_USAGE, str(theirs), "ssacli wrote", "remove it")
    assert theirs.read_text().endswith(("notes\n", "</title>"))  # untouched
    ours = tmp_path / f"ours.{suffix}"
    for _ in range(2):  # written, then replaced: it is ssacli's own now
        code, _, stderr = run_main(
            ["render", str(saved["small"]), "-q", option, str(ours)], monkeypatch, capsys
        )
        assert code == 0, stderr
    empty = tmp_path / f"empty.{suffix}"
    empty.touch()  # an empty file holds nothing to lose
    code, _, stderr = run_main(["render", str(saved["small"]), "-q", option, str(empty)], monkeypatch, capsys)
    assert code == 0 and empty.stat().st_size > 0, stderr
