"""Natural shifts as probes (issue 52, item 1): ``diagnose --text ID --shift OOD`` reads the user's
text as the reference and the shifted corpus as the probe, both cut into documents of one length,
and reports per document the output damage (loss) and the saturation change (fresh collapse).

Each document's loss is checked against the model's own forward on the token windows the
documented rule names (recomputed here, not read from ssacli), identical corpora against zero
damage, and bad input against one clear line before any forward.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import ssacli
from ssacli.diagnosis.result import DiagnoseResult
from ssacli.diagnosis.shift import shift_lines
from ssacli.diagnosis.texts import TEXTS
from ssacli.diagnosis.verdicts import probe_verdicts
from ssacli.errors import EXIT_INPUT, EXIT_USAGE, UsageError
from ssacli.models.loading import load_model
from tests.helpers.cli import run_main
from tests.helpers.result_schema import schema_errors

MODEL = "builtin:wikitext-softmax"
LENGTH, DOCS = 32, 4
REFERENCE = "\n\n".join(TEXTS)  # English prose
# "code": a shift of domain the model (trained on WikiText) never saw
CODE = "\n".join(
    f"def f_{i}(x, y={i}):\n    return [x * {i} + y for _ in range({i % 7 + 2})]\n" for i in range(60)
)


@pytest.fixture(scope="module")
def loaded():
    return load_model(MODEL)  # a LoadedModel: the model with its tokenizer


def windows(tokenizer, text: str, length: int, count: int) -> list[list[int]]:
    """docs/diagnose.md's rule, recomputed: the whole text's tokens cut into consecutive windows of
    ``length``, ``count`` of them evenly spaced (window i·W // count of W)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    total = len(ids) // length
    return [ids[k * length : (k + 1) * length] for k in (i * total // count for i in range(count))]


def own_losses(loaded, documents: list[list[int]]) -> list[float]:
    """Each document's mean next-token cross-entropy from the model's own forward."""
    with torch.no_grad():
        logits = loaded.model(input_ids=torch.tensor(documents)).logits.double()
    ids = torch.tensor(documents)
    per_token = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    return per_token.mean(1).tolist()


def test_each_documents_loss_is_the_models_own_and_the_damage_their_difference(loaded):
    result = ssacli.diagnose(
        loaded, ["shift"], text=REFERENCE, shift=CODE, shift_name="code", samples=DOCS, length=LENGTH
    )
    probe = result.probe("shift")
    assert probe.levels == [0.0, 1.0]
    ref = own_losses(loaded, windows(loaded.tokenizer, REFERENCE, LENGTH, DOCS))
    new = own_losses(loaded, windows(loaded.tokenizer, CODE, LENGTH, DOCS))
    np.testing.assert_allclose(probe.per_input["loss"][0], ref, rtol=1e-4)
    np.testing.assert_allclose(probe.per_input["loss"][1], new, rtol=1e-4)
    summary = result.to_dict()["probes"][0]["summary"]["shift"]
    assert summary["documents"] == DOCS
    loss = summary["loss"]
    np.testing.assert_allclose(loss["mean_change"], np.mean(new) - np.mean(ref), rtol=1e-4)
    np.testing.assert_allclose(loss["change"], np.array(new) - np.mean(ref), rtol=1e-4, atol=1e-6)
    low, high = loss["interval"]
    assert low <= loss["mean_change"] <= high
    # the level's pooled values are the documents' means (every document is LENGTH tokens)
    np.testing.assert_allclose(probe.extras["loss"], [np.mean(ref), np.mean(new)], rtol=1e-4)
    collapse = summary["collapse"]
    fresh = probe.fresh_collapse_rate()
    np.testing.assert_allclose([collapse["reference_mean"], collapse["shifted_mean"]], fresh, atol=1e-9)
    assert result.settings["shift"]["documents"] == DOCS and result.settings["shift"]["tokens"] == LENGTH
    assert loss["mean_change"] > 0  # code is far out of WikiText's distribution


def test_association_is_the_rank_correlation_of_each_documents_collapse_and_own_loss(loaded):
    docs = 8
    result = ssacli.diagnose(
        loaded, ["shift"], text=REFERENCE, shift=CODE, samples=docs, length=LENGTH, tau=0.5
    )
    summary = result.to_dict()["probes"][0]["summary"]["shift"]
    collapse = summary["collapse"]["shifted"]
    assert np.ptp(collapse) > 0, "precondition: documents differ in collapse at tau 0.5"
    loss = own_losses(loaded, windows(loaded.tokenizer, CODE, LENGTH, docs))

    def ranks(values):  # average ranks by hand: ties share the mean of their positions
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        for v in set(values):
            where = [i for i in order if values[i] == v]
            mean = np.mean([order.index(i) for i in where])
            for i in where:
                out[i] = mean
        return out

    expected = np.corrcoef(ranks(list(collapse)), ranks(loss))[0, 1]
    association = summary["association"]
    assert association["documents"] == docs
    assert association["rho"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    low, high = association["interval"]
    assert -1 <= low <= high <= 1
    (line,) = [one for one in shift_lines(result.probe("shift")) if "Spearman" in one]
    assert f"ρ {expected:+.2f} [{low:+.2f}, {high:+.2f}] over {docs} documents" in line


def test_identical_corpora_read_no_damage_and_no_collapse(loaded):
    result = ssacli.diagnose(loaded, ["shift"], text=REFERENCE, shift=REFERENCE, samples=DOCS, length=LENGTH)
    summary = result.to_dict()["probes"][0]["summary"]["shift"]
    assert abs(summary["loss"]["mean_change"]) < 1e-6 * summary["loss"]["reference_mean"]
    assert abs(summary["collapse"]["mean_change"]) < 1e-9
    (verdict,) = probe_verdicts(result)
    assert verdict.kind not in ("partly collapses", "saturates"), verdict.line


def test_cli_prints_writes_and_round_trips_the_shift(tmp_path, monkeypatch, capsys):
    ref, ood, out = tmp_path / "id.txt", tmp_path / "code.txt", tmp_path / "r.json"
    ref.write_text(REFERENCE, encoding="utf-8")
    ood.write_text(CODE, encoding="utf-8")
    monkeypatch.setenv("COLUMNS", "80")
    args = ["diagnose", MODEL, "--text", str(ref), "--shift", str(ood), "--probe", "shift",
            "--samples", str(DOCS), "--length", str(LENGTH), "--json", str(out)]  # fmt: skip
    code, stdout, _ = run_main(args, monkeypatch, capsys)
    assert code == 0
    assert "output damage: loss" in stdout and "saturation change: fresh collapse" in stdout
    assert "code.txt against the --text file" in " ".join(stdout.split())
    data = json.loads(out.read_text())
    assert schema_errors(data) == []
    again = DiagnoseResult.from_dict(data).to_dict()
    assert again["probes"][0]["summary"]["shift"] == data["probes"][0]["summary"]["shift"]
    assert again["settings"]["shift"] == data["settings"]["shift"]


@pytest.mark.parametrize(
    ("extra", "exit_code", "words"),
    [
        (["--shift", "{tmp}/missing.txt"], EXIT_INPUT, "does not exist"),
        (["--shift", "{tmp}/empty.txt"], EXIT_INPUT, "is empty"),
        (["--probe", "shift"], EXIT_USAGE, "needs a shifted corpus"),
        (["--probe", "shift:0,1", "--shift", "{tmp}/short.txt"], EXIT_USAGE, "takes no levels"),
        (["--random", "--shift", "{tmp}/short.txt"], EXIT_USAGE, "--random"),
    ],
)
def test_bad_shift_input_is_one_line_before_the_model_loads(
    tmp_path, monkeypatch, capsys, extra, exit_code, words
):
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    (tmp_path / "short.txt").write_text("a few words", encoding="utf-8")

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the refusal")

    monkeypatch.setattr("ssacli.diagnosis.run.as_loaded", no_load)
    args = ["diagnose", MODEL, *(a.format(tmp=tmp_path) for a in extra)]
    code, stdout, stderr = run_main(args, monkeypatch, capsys)
    assert code == exit_code, stderr
    assert words in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_a_corpus_shorter_than_one_document_is_refused_before_any_forward(tmp_path, monkeypatch, capsys):
    (tmp_path / "short.txt").write_text("a few words", encoding="utf-8")
    args = ["diagnose", MODEL, "--shift", str(tmp_path / "short.txt"), "--probe", "shift", "--length", "32"]
    code, _, stderr = run_main(args, monkeypatch, capsys)
    assert code == EXIT_USAGE
    assert "short.txt' has" in stderr and "fewer than one document of 32" in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.parametrize("as_path", [str, lambda p: p])
@pytest.mark.parametrize("keyword", ["text", "shift"])
def test_a_files_path_given_as_the_text_is_refused_not_tokenized(tmp_path, as_path, keyword):
    """text= and shift= take the text itself; a path there would be tokenized as a short prompt
    (the prompts would be the path's tokens, repeated), so it is refused with the fix."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(REFERENCE)
    given = {"text": REFERENCE, "shift": CODE, keyword: as_path(corpus)}
    with pytest.raises(UsageError, match=rf"{keyword}= takes the text itself.*read_text\(\)"):
        ssacli.diagnose(MODEL, ["shift"], samples=2, length=8, **given)
