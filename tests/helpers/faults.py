"""Faults a test can plant in this process."""

from __future__ import annotations

import errno
import os


def full_disk(monkeypatch, name_starts: str = "", name_holds: str = "") -> None:
    """Every file ssacli opens for writing (through os.fdopen, as ssacli.files does) whose name starts
    with ``name_starts`` and holds ``name_holds`` raises ENOSPC on write, as a full disk would."""
    real = os.fdopen

    class Full:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fdopen(fd, *args, **kwargs):
        handle = real(fd, *args, **kwargs)
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        return Full(handle) if name.startswith(name_starts) and name_holds in name else handle

    monkeypatch.setattr(os, "fdopen", fdopen)
