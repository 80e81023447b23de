"""A fork server for the docs-blocks test (tests/contracts/test_docs_blocks.py): it imports torch,
transformers and the other heavy third-party modules once, then runs each request (an `ssacli`
command line, or a Python block as a script) in a forked child with the request's working folder,
environment, argv and standard streams. A command then costs what it computes, not the ~4 s of CPU
that starting Python and importing torch and transformers takes on this project's 2-core machine.

ssacli itself is never imported here: each child imports it as a fresh interpreter would, so a
missing import in ssacli still fails. The child's exit code goes back to the client; a child that
dies without one reads as a crash.

Run as ``python tests/helpers/docs_server.py SOCKET``; `ssacli` on the blocks' PATH is a small
client (``docs_client.py``) that forwards its argv, folder, environment and its stdin, stdout and
stderr (as file descriptors) here, then receives the child's pid (to forward signals to it) and its
exit code. Children stay in the server's process group, so killing the group ends them all.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import signal
import socket
import struct
import sys
import traceback

# What a command or a block spends its start-up on; a module missing here is skipped.
PRELOAD = [
    "numpy", "torch", "torch.nn.functional", "transformers", "transformers.modeling_utils",
    "transformers.models.gpt2.modeling_gpt2", "transformers.models.llama.modeling_llama",
    "transformers.models.roberta.modeling_roberta", "transformers.tokenization_utils_tokenizers",
    "tokenizers", "safetensors.torch", "typer", "rich.console", "rich.table", "matplotlib",
    "matplotlib.pyplot", "entmax", "peft", "yaml", "jsonschema",
]  # fmt: skip


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    return data


def _streams(fds: list[int]) -> None:
    """Make the client's descriptors this process's stdin, stdout and stderr, at the fd level and
    as Python sets up sys.stdin/stdout/stderr (stdout line-buffered on a terminal, stderr always)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = open(  # noqa: SIM115
        1, "w", encoding="utf-8", closefd=False, buffering=1 if os.isatty(1) else -1
    )
    sys.stderr = sys.__stderr__ = open(  # noqa: SIM115
        2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1
    )


def _run(request: dict) -> int:
    """The request, as `ssacli ARGV` or `python SCRIPT` would run it; its exit code."""
    try:
        if request["mode"] == "cli":
            sys.argv = ["ssacli", *request["argv"]]
            from ssacli.cli import main

            code = main()
        else:
            script = request["script"]
            sys.argv = [script, *request["argv"]]
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
            code = 0
    except SystemExit as done:
        code = done.code
    except BaseException:  # what Python prints for an uncaught exception, and its exit code
        traceback.print_exc()
        code = 1
    if code is None:
        return 0
    if not isinstance(code, int):
        print(code, file=sys.stderr)
        return 1
    return code & 0xFF


def _log_cpu(request: dict) -> None:
    """With $SSACLI_DOCS_CPU_LOG set, append the CPU seconds this request took (and its
    subprocesses') and what it was: how the docs-blocks test's cost was measured."""
    log = os.environ.get("SSACLI_DOCS_CPU_LOG")
    if not log:
        return
    import resource

    used = sum(
        getattr(resource.getrusage(who), field)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for field in ("ru_utime", "ru_stime")
    )
    what = " ".join(request["argv"]) if request["mode"] == "cli" else request["script"]
    with open(log, "a", encoding="utf-8") as file:
        file.write(f"{used:.2f}\t{request['mode']}\t{what}\n")


def _child(conn: socket.socket) -> None:
    code = 70  # EX_SOFTWARE: the request never ran
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the child waits for its own subprocesses only
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        (size,) = struct.unpack("!I", _recv_exact(conn, 4))
        request = json.loads(_recv_exact(conn, size))
        conn.sendall(struct.pack("!i", os.getpid()))  # so the client can stop it (a timeout, a signal)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _streams(fds)
        code = _run(request)
        _log_cpu(request)
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # what a fresh interpreter runs on its way out
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        conn.sendall(struct.pack("!i", code))
    finally:
        os._exit(code)


def _reap(_signum, _frame) -> None:
    """Wait for finished children, so that their CPU time adds up in this process's (and reaches
    whoever waits for the server: `time pytest …` counts what the blocks cost)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def serve(path: str) -> None:
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    signal.signal(signal.SIGCHLD, _reap)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".tmp")
    server.listen(16)
    server.settimeout(10)
    parent = os.getppid()
    os.rename(path + ".tmp", path)  # the socket appears once it accepts
    while os.getppid() == parent:  # the test that started it is gone (killed): so is the server
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        if os.fork() == 0:
            server.close()
            conn.settimeout(None)
            _child(conn)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
