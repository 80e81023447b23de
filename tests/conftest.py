"""Shared test helpers: tiny models of every supported family, built from fixtures/families.json."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FAMILIES = {k: v for k, v in json.loads((FIXTURES / "families.json").read_text()).items() if k[0] != "_"}
VOCAB = 128
SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}

# Under pytest-xdist each worker gets its share of the cores, so workers do not oversubscribe them
# (subprocesses the tests start inherit OMP_NUM_THREADS).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_share)
    torch.set_num_threads(_share)

_AUTO = {"causal": AutoModelForCausalLM, "encoder": AutoModel, "seq2seq": AutoModelForSeq2SeqLM}


def build_model(family: str, attn_implementation: str = "eager", seed: int = 0, **overrides):
    """A tiny randomly initialized model of ``family`` in fp32, eval mode, no dropout."""
    spec = FAMILIES[family]
    kwargs = {"vocab_size": VOCAB, **SPECIAL, **spec["kwargs"], **overrides}
    config = AutoConfig.for_model(family, **kwargs)
    for name in ("dropout", "attention_dropout", "hidden_dropout_prob", "attention_probs_dropout_prob"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    torch.manual_seed(seed)
    model = _AUTO[spec["kind"]].from_config(config, attn_implementation=attn_implementation)
    return model.eval()


def clone(model):
    return copy.deepcopy(model)


@pytest.fixture
def padded_batch():
    """Three rows of length 7: full, left-padded by 2, right-padded by 3."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, 7), generator=gen)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, :2] = 0
    mask[2, 4:] = 0
    ids[mask == 0] = SPECIAL["pad_token_id"]
    return ids, mask


def run_main(args, monkeypatch, capsys) -> tuple[int, str, str]:
    """ssacli.cli.main in-process, as the `ssacli` console script runs it: (exit code, out, err)."""
    from ssacli.cli import main

    monkeypatch.setattr(sys, "argv", ["ssacli", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def unwritable(tmp_path: Path) -> Path:
    """A folder no one can write in: read-only for a user; for root (who writes anywhere) a path
    under a plain file, which no one can create."""
    if os.geteuid() == 0:
        blocker = tmp_path / "file"
        blocker.write_text("x")
        return blocker
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


@pytest.fixture(autouse=True)
def written_results_follow_the_schema(monkeypatch):
    """Every diagnose result ssacli writes during a test (a ``.json`` file through ssacli.files, the
    one writer: diagnose, compare, check and report JSON) is validated against the shipped JSON
    Schema (tests/result_schema.py); a violation fails the test that wrote it, naming the field."""
    from result_schema import written_file_errors

    from ssacli import files

    errors: list[str] = []
    publish = files.publish

    def validating_publish(tmp, path, *, directory: bool = False) -> None:
        if not directory and str(path).endswith(".json"):
            errors.extend(written_file_errors(tmp, path))
        publish(tmp, path, directory=directory)

    monkeypatch.setattr(files, "publish", validating_publish)
    yield
    if errors:
        schema = "ssacli/diagnosis/diagnose.schema.json"
        pytest.fail(f"a written diagnose result breaks {schema}:\n" + "\n".join(errors))
