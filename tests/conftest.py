"""Fixtures shared by the whole suite; the helpers tests import are in tests/helpers."""

from __future__ import annotations

import os

# No test reaches the network: Hub ids load from caches the tests build (tests/models/test_hub.py), as
# with --offline; set before transformers imports huggingface_hub, which reads it once. The tests of
# the online path turn it off for themselves and fake the Hub's one answer.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.helpers.models import SPECIAL, VOCAB  # noqa: E402

# Under pytest-xdist each worker gets its share of the cores, so workers do not oversubscribe them
# (subprocesses the tests start inherit OMP_NUM_THREADS).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_share)
    torch.set_num_threads(_share)


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


@pytest.fixture(autouse=True)
def written_results_follow_the_schema(monkeypatch):
    """Every diagnose result ssacli writes during a test (a ``.json`` file through ssacli.files, the
    one writer: diagnose, compare, check and report JSON) is validated against the shipped JSON
    Schema (tests/helpers/result_schema.py); a violation fails the test that wrote it, naming the field."""
    from ssacli import files
    from tests.helpers.result_schema import written_file_errors

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
