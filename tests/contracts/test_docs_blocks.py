"""README.md and docs/**/*.md run as written: every fenced block is classified by its language tag
(tests/helpers/docs_blocks.py: bash and console blocks are run, python blocks run as scripts,
configuration is parsed, output is not run) and a tag the test does not know fails, so no block
escapes. One case per block, with the id FILE:LINE of its opening fence; a block that cannot run
here (the network, a GPU, a study's hours) says so in the markdown with a ``docs-test`` marker and
is skipped with that reason; long commands run on the bundled models with tiny step counts through
``replace`` markers, also in the markdown.

Each block runs offline in an empty temporary folder holding the reader's files it names (texts,
a plain model folder). Commands and scripts run in processes forked from a server that has
imported torch and transformers (not ssacli), which saves ~4 s of CPU a command on this project's
2-core machine; SSACLI_DOCS_TEST_FRESH=1 runs each in a new interpreter instead.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib

import pytest
import yaml

from tests.helpers import docs_blocks as db

BLOCKS = db.all_blocks()
RUN = ("shell", "transcript", "python", "config")
TIMEOUT_S = 300


def _param(block: db.Block):
    marks = []
    if block.marked("skip"):
        marks.append(pytest.mark.skip(reason=f"{block.id}: {block.marked('skip')[0]}"))
    if block.marked("slow"):
        marks.append(pytest.mark.slow)
    return pytest.param(block, id=block.id, marks=marks)


def test_every_block_has_a_kind_and_its_markers_make_sense():
    """A block whose tag the test does not know (or has none) fails here: tag it `text` if it is
    output, or with its language so that it runs."""
    unknown = [f"{b.id} ```{b.tag}" for b in BLOCKS if b.kind is None]
    assert not unknown, f"blocks of no known kind ({sorted(db.KINDS)}): {unknown}"
    for block in BLOCKS:
        for key in ("skip", "slow"):
            assert all(reason for reason in block.marked(key)), f"{block.id}: `{key}` needs a reason"
        if block.kind == "output":
            assert not block.markers, f"{block.id}: an output block is not run; its markers do nothing"
        if block.kind != "python":
            assert not block.marked("continues"), f"{block.id}: only python blocks continue"
        if block.kind in RUN and not block.marked("skip"):
            if block.kind in ("shell", "transcript"):
                db.shell_script(block)  # raises on a replace that does not match, bad exit codes
            else:
                block.runnable_code()


def test_a_marker_that_would_do_nothing_fails(tmp_path):
    """Markers cannot rot silently: an unknown one, one above no block, a replace whose OLD is gone."""
    page = tmp_path / "page.md"
    cases = {
        "<!-- docs-test: skp typo -->\n```bash\nls\n```\n": "unknown docs-test marker",
        "<!-- docs-test: skip why -->\nSome prose.\n```bash\nls\n```\n": "not right above",
        "```bash\nls\n```\n<!-- docs-test: skip why -->\n": "above no block",
    }
    for text, message in cases.items():
        page.write_text(text)
        with pytest.raises(ValueError, match=message):
            db.blocks_of(page)
    page.write_text("<!-- docs-test: replace --steps 9 => --steps 2 -->\n<!-- a note -->\n```bash\nls\n```\n")
    (block,) = db.blocks_of(page)
    with pytest.raises(ValueError, match="does not match"):
        block.runnable_code()
    page.write_text("```\nuntagged\n```\n<!-- docs-test: exit 0,2 -->\n```console\n$ true\n$ false\n```\n")
    untagged, transcript = db.blocks_of(page)
    assert untagged.kind is None and transcript.kind == "transcript"
    assert db.transcript_commands(transcript.code) == ["true", "false"]
    assert "exit 99" in db.shell_script(transcript)


def test_the_docs_have_blocks_of_each_kind():
    kinds = {b.kind for b in BLOCKS}
    assert {"shell", "transcript", "python", "output"} <= kinds, kinds


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The fork server's socket (None: run each block in a new interpreter)."""
    if os.environ.get("SSACLI_DOCS_TEST_FRESH") == "1" or not sys.platform.startswith("linux"):
        yield None
        return
    folder = tmp_path_factory.mktemp("docs-server")
    process, socket_path = db.start_server(folder, db.run_env(folder, None))
    yield socket_path
    db.stop_server(process, socket_path)


@pytest.fixture(scope="module")
def given_text():
    from ssacli.diagnosis.texts import TEXTS

    return "\n\n".join(TEXTS) + "\n"


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS if b.kind in RUN])
def test_a_docs_block_runs_as_written(block, tmp_path, server, given_text):
    if block.kind == "config":
        code = block.runnable_code()
        {"yaml": yaml.safe_load, "toml": tomllib.loads, "json": json.loads}[block.tag](code)
        return
    folder = tmp_path / "work"
    folder.mkdir()
    db.make_bin(tmp_path / "bin", server)
    env = db.run_env(tmp_path / "bin", server)
    db.make_givens(block, folder, given_text)
    for command in block.marked("setup"):
        code, out = db.run_shell(f"set -e -o pipefail\n{command}\n", folder, env, TIMEOUT_S)
        assert code == 0, f"{block.id}: setup `{command}` exited {code}:\n{out}"
    if block.kind == "python":
        code, out = db.run_python(block.runnable_code(), folder, env, TIMEOUT_S)
        expected = 0
    else:
        code, out = db.run_shell(db.shell_script(block), folder, env, TIMEOUT_S)
        expected = db.expected_exit(block)
    assert code != -1, f"{block.id}: still running after {TIMEOUT_S} s:\n{out}"
    assert code == expected, f"{block.id} exited {code}, expected {expected}:\n{out}"


if __name__ == "__main__":  # python -m tests.contracts.test_docs_blocks: every block, its kind, how it runs
    for b in BLOCKS:
        how = "skip: " + b.marked("skip")[0] if b.marked("skip") else ("slow" if b.marked("slow") else "")
        print(f"{b.id:45} {b.tag or '(none)':8} {b.kind or 'UNKNOWN':10} {how}", file=sys.stdout)
