"""The fork server's client (tests/helpers/docs_server.py, socket in $SSACLI_DOCS_SERVER): sends a
request with this process's stdin, stdout and stderr, forwards SIGINT/SIGTERM/SIGHUP to the child
that runs it, and returns its exit code. Run as a script it is `ssacli` on the PATH of the
docs-blocks test (with -I -S: standard library only)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys


def _int(conn: socket.socket) -> int | None:
    data = b""
    while len(data) < 4:
        chunk = conn.recv(4 - len(data))
        if not chunk:
            return None
        data += chunk
    return struct.unpack("!i", data)[0]


def request(payload: dict, fds: list[int], started=None) -> int:
    """Run ``payload`` ({"mode": "cli"|"python", "argv", "cwd", "env"[, "script"]}) on the server
    with ``fds`` as its stdin, stdout and stderr; ``started(pid)`` is called once it runs."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(payload["env"]["SSACLI_DOCS_SERVER"])
    socket.send_fds(conn, [b"R"], fds)
    data = json.dumps(payload).encode()
    conn.sendall(struct.pack("!I", len(data)) + data)
    pid = _int(conn)
    if pid is not None and started is not None:
        started(pid)
    code = None if pid is None else _int(conn)
    if code is None:
        print("docs-test: the command died without an exit code (see above)", file=sys.stderr)
        return 1
    return code


def main() -> int:
    def forward(pid: int) -> None:
        def send(signum, _frame):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, send)

    payload = {"mode": "cli", "argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}
    return request(payload, [0, 1, 2], started=forward)


if __name__ == "__main__":
    sys.exit(main())
