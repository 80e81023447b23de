"""The fenced code blocks of README.md and docs/**/*.md, what each is, and how the docs-blocks test
(tests/contracts/test_docs_blocks.py) runs it.

Every block is classified by its language tag; a tag not in KINDS (or none) fails the test, so a
new block cannot go unchecked:

* ``bash`` (``sh``, ``shell``): a script, run with ``bash`` under ``set -e -o pipefail`` in an
  empty temporary folder; it must exit 0 (or the code of an ``exit`` marker).
* ``console``: a transcript; each ``$ COMMAND`` line (with its ``\\`` continuation lines) runs in
  order in one shell and must exit 0 (or its code in an ``exit`` marker); the output lines are not
  compared (they were captured at full size).
* ``python``: a script, run in its own process with the temporary folder as working folder.
* ``yaml``, ``toml``, ``json``: configuration, parsed.
* ``text``: output or grammar shown to the reader; not run.

Markers are HTML comment lines right above the opening fence (the rendered page hides them, the
markdown shows them); other comment lines may stand between them. Each says in the markdown why a
block does not run exactly as printed:

* ``<!-- docs-test: skip REASON -->``: not run; the test is skipped with REASON.
* ``<!-- docs-test: slow REASON -->``: run only with ``-m slow``.
* ``<!-- docs-test: replace OLD => NEW -->``: run with every OLD replaced by NEW (a Hub model by
  a bundled one, ``--steps 2000`` by ``--steps 2``); OLD must occur, so a stale marker fails.
* ``<!-- docs-test: setup COMMAND -->``: a shell command run first in the same folder, for what
  the block reads that an earlier block or the reader made; it must exit 0.
* ``<!-- docs-test: exit CODES -->``: the documented exit code of a block that shows a failure
  (``console``: one code per command, comma-separated).
* ``<!-- docs-test: continues -->`` (python): the file's previous python block runs first, in the
  same script (a snippet that uses the names of the one before it).

The folder of each run holds the reader's files that the block (or its setup) names: GIVEN_TEXTS
(the built-in probe texts, ~12k characters) and GIVEN_MODELS (the bundled language model
`builtin:wikitext-softmax` as a plain `save_pretrained` folder: Llama, 4 layers, 0.8M parameters,
with its tokenizer). Runs are offline, with one CPU thread (run_env).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.helpers import docs_client

ROOT = Path(__file__).resolve().parents[2]
KINDS = {
    "bash": "shell", "sh": "shell", "shell": "shell", "console": "transcript", "python": "python",
    "yaml": "config", "toml": "config", "json": "config", "text": "output",
}  # fmt: skip
MARKERS = ("skip", "slow", "replace", "setup", "exit", "continues")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(\S+)\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")
GIVEN_TEXTS = ("small.txt", "train.txt")
GIVEN_MODELS = ("my-model", "my-lm")
SERVER = ROOT / "tests" / "helpers" / "docs_server.py"
CLIENT = ROOT / "tests" / "helpers" / "docs_client.py"


def documents() -> list[Path]:
    """README.md and every markdown file under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclasses.dataclass
class Block:
    path: Path
    line: int  # the opening fence's line, 1-based
    tag: str
    code: str
    markers: list[tuple[str, str]]
    previous: Block | None = dataclasses.field(default=None, repr=False)  # for `continues`

    @property
    def id(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path.name
        return f"{path}:L{self.line}"

    @property
    def kind(self) -> str | None:
        return KINDS.get(self.tag)

    def marked(self, key: str) -> list[str]:
        return [value for name, value in self.markers if name == key]

    def runnable_code(self) -> str:
        """The code as the test runs it: each `replace` applied (OLD must occur), and for a python
        block that `continues`, the previous block's runnable code first."""
        code = self.code
        for rule in self.marked("replace"):
            old, sep, new = rule.partition(" => ")
            if not sep or old not in code:
                raise ValueError(f"{self.id}: replace marker {rule!r} does not match the block")
            code = code.replace(old, new)
        if self.marked("continues"):
            if self.previous is None:
                raise ValueError(f"{self.id}: `continues` but no earlier {self.tag} block")
            code = self.previous.runnable_code() + "\n" + code
        return code


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of one markdown file with their markers. A marker that is not right above
    a fence, or that ssacli's test does not know, raises ValueError (it would silently do nothing)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending: list[tuple[str, str]] = []
    last: dict[str, Block] = {}
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i])
        fence = FENCE.match(lines[i])
        if marker:
            if marker.group(1) not in MARKERS:
                raise ValueError(f"{path.name}:L{i + 1}: unknown docs-test marker {marker.group(1)!r}")
            pending.append((marker.group(1), marker.group(2)))
            i += 1
            continue
        if fence:
            indent, ticks, tag = fence.groups()
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith(ticks[0] * len(ticks)):
                end += 1
            body = [line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]]
            block = Block(path, i + 1, tag.lower(), "\n".join(body) + "\n", pending, last.get(tag.lower()))
            found.append(block)
            last[block.tag] = block
            pending = []
            i = end + 1
            continue
        if pending and lines[i].strip() and not lines[i].lstrip().startswith("<!--"):
            raise ValueError(f"{path.name}:L{i + 1}: docs-test marker not right above a fenced block")
        i += 1
    if pending:
        raise ValueError(f"{path.name}: docs-test marker at the end of the file, above no block")
    return found


def all_blocks() -> list[Block]:
    return [block for path in documents() for block in blocks_of(path)]


# ---- the commands of a transcript -------------------------------------------------------------


def transcript_commands(code: str) -> list[str]:
    """The ``$ COMMAND`` lines of a console block, each with its continuation lines."""
    commands: list[str] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            command = [lines[i][2:]]
            while command[-1].rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                command.append(lines[i])
            commands.append("\n".join(command))
        i += 1
    return commands


def shell_script(block: Block) -> str:
    """The bash script the test runs for a shell or console block."""
    code = block.runnable_code()
    expected = [c.strip() for value in block.marked("exit") for c in value.split(",")]
    if block.kind == "shell":
        if len(expected) > 1:
            raise ValueError(f"{block.id}: a bash block has one exit code (the script's)")
        return "set -e -o pipefail\n" + code
    commands = transcript_commands(code)
    if not commands:
        raise ValueError(f"{block.id}: a console block without a `$ ` command")
    expected = expected or ["0"] * len(commands)
    if len(expected) != len(commands):
        raise ValueError(f"{block.id}: {len(commands)} commands but exit codes {expected}")
    script = ["set -o pipefail"]
    for number, (command, code_expected) in enumerate(zip(commands, expected, strict=True), 1):
        script += [
            command,
            f'rc=$?; if [ "$rc" != {int(code_expected)} ]; then echo "docs-test: command {number} '
            f'exited $rc, the transcript shows exit {int(code_expected)}" >&2; exit 99; fi',
        ]
    return "\n".join(script) + "\n"


def expected_exit(block: Block) -> int:
    """The exit code the whole run must end with: a bash block's marker (0 without one); a console
    block checks each command itself, so the run must end with 0."""
    if block.kind == "shell" and block.marked("exit"):
        return int(block.marked("exit")[0])
    return 0


# ---- the folder a block runs in ------------------------------------------------------------------


def make_givens(block: Block, folder: Path, text: str) -> None:
    """Write the reader's files that the block names: the texts and the plain model folders."""
    named = block.runnable_code() + "\n".join(block.marked("setup"))
    for name in GIVEN_TEXTS:
        if name in named:
            (folder / name).write_text(text, encoding="utf-8")
    for name in GIVEN_MODELS:
        if re.search(rf"(^|[\s/'\"]){re.escape(name)}($|[\s/'\"])", named, flags=re.M):
            source = ROOT / "ssacli" / "checkpoints" / "wikitext-softmax"
            ignore = shutil.ignore_patterns("ssacli.json", "RECIPE.md")
            shutil.copytree(source, folder / name, ignore=ignore)


# ---- running -------------------------------------------------------------------------------------


def run_env(bin_dir: Path, server: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",  # offline, always
        MPLBACKEND="Agg", NO_COLOR="1", COLUMNS="100",
        # one thread: the blocks' models are tiny, and on a shared 2-core machine a second OpenMP
        # thread spins at every barrier (one command measured 3 s of CPU alone, 70 s under load)
        OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
        SSACLI_DOCS_REPO=str(ROOT),  # for a setup marker that copies a file of the repository
    )  # fmt: skip
    if server:
        env["SSACLI_DOCS_SERVER"] = server
    else:
        env.pop("SSACLI_DOCS_SERVER", None)
    return env


def make_bin(bin_dir: Path, server: str | None) -> None:
    """`ssacli` for the blocks: the fork server's client, or (no server) the installed command."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "ssacli"
    if server:
        shim.write_text(f"#!{sys.executable} -IS\n" + CLIENT.read_text(encoding="utf-8"), encoding="utf-8")
    else:
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ssacli "$@"\n', encoding="utf-8")
    shim.chmod(0o755)


def run_shell(script: str, folder: Path, env: dict, timeout: float) -> tuple[int, str]:
    """Run a bash script in its own process group; (exit code, output tail)."""
    (folder / ".docs-test.sh").write_text(script, encoding="utf-8")
    log = folder / ".docs-test.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            ["bash", ".docs-test.sh"], cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_group(process.pid)
            process.wait()
            code = -1
    return code, _tail(log)


def run_python(code: str, folder: Path, env: dict, timeout: float) -> tuple[int, str]:
    """Run a python block as a script in ``folder``: through the fork server when there is one (a
    fresh forked process: torch and transformers imported, ssacli not), else a new interpreter."""
    script = folder / "docs_block.py"
    script.write_text(code, encoding="utf-8")
    log = folder / ".docs-test.log"
    if "SSACLI_DOCS_SERVER" not in env:
        with open(log, "wb") as out:
            try:
                done = subprocess.run(
                    [sys.executable, script.name], cwd=folder, env=env, stdout=out,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout,
                )  # fmt: skip
                returncode = done.returncode
            except subprocess.TimeoutExpired:
                returncode = -1
        return returncode, _tail(log)
    payload = {"mode": "python", "script": str(script), "argv": [], "cwd": str(folder), "env": env}
    pids: list[int] = []
    result: list[int] = []
    with open(os.devnull, "rb") as stdin, open(log, "wb") as out:
        worker = threading.Thread(
            target=lambda: result.append(
                docs_client.request(payload, [stdin.fileno(), out.fileno(), out.fileno()], pids.append)
            ),
            daemon=True,
        )
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            for pid in pids:
                _kill(pid)
            worker.join(10)
            return -1, _tail(log)
    return result[0], _tail(log)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _stop_group(pgid: int) -> None:
    """SIGTERM to the group (the `ssacli` clients forward it to the commands they run), then KILL."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            return
        time.sleep(2)


def _tail(log: Path, size: int = 4000) -> str:
    text = log.read_text(encoding="utf-8", errors="replace")
    return text[-size:]


def start_server(folder: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """The fork server, started in its own process group; returns once its socket accepts. The
    socket lives in a short folder of its own (a socket path has at most 107 bytes)."""
    socket_path = os.path.join(tempfile.mkdtemp(prefix="ssacli-docs-"), "s")
    with open(folder / "server.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(SERVER), socket_path], cwd=folder, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while not os.path.exists(socket_path):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(process, socket_path)
            raise RuntimeError("the docs-test fork server did not start: " + _tail(folder / "server.log"))
        time.sleep(0.1)
    return process, socket_path


def stop_server(process: subprocess.Popen, socket_path: str | None = None) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the server and any child still running
    except ProcessLookupError:
        pass
    process.wait()
    if socket_path:
        shutil.rmtree(os.path.dirname(socket_path), ignore_errors=True)
