"""Running ``loopfuse`` as a real process: on pipes, or with its output on a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import select
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

BLOCKER = Path(__file__).resolve().parent / "import_blocker"
"""A ``sitecustomize`` that hides the packages named in ``$TEST_BLOCK_IMPORTS``."""

WAIT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def environment(extra: Mapping[str, str] | None = None, *, block: str = "") -> dict[str, str]:
    """This process's environment, plus ``extra``; ``block`` hides those packages."""
    env = {**os.environ, **(extra or {})}
    for key in ("LOOPFUSE_CONFIG", "LOOPFUSE_URL"):
        if key not in (extra or {}):
            env.pop(key, None)
    if block:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BLOCKER), env.get("PYTHONPATH")]))
        env["TEST_BLOCK_IMPORTS"] = block
    return env


def loopfuse(
    *args: str,
    env: Mapping[str, str] | None = None,
    block: str = "",
    cwd: Path | None = None,
    timeout: float = WAIT,
) -> subprocess.CompletedProcess[str]:
    """``loopfuse ARGS`` to the end, stdout and stderr captured (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment(env, block=block),
        cwd=cwd,
        check=False,
    )


class OnTerminal:
    """``loopfuse ARGS`` with stdout on a pseudo-terminal (stderr on a pipe)."""

    def __init__(self, *args: str, env: Mapping[str, str] | None = None) -> None:
        self._master, slave = pty.openpty()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args],
            stdout=slave,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=environment({"TERM": "xterm-256color", "COLUMNS": "160", **(env or {})}),
        )
        os.close(slave)
        self.seen = b""

    def read_until(self, needle: bytes, timeout: float = WAIT) -> bytes:
        """What the terminal showed until ``needle`` (fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while needle not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{needle!r} never shown; the terminal showed {self.seen!r}"
            ready, _, _ = select.select([self._master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self._master, 65536)
                except OSError:  # the process closed the terminal
                    chunk = b""
                assert chunk, f"{needle!r} never shown; the terminal showed {self.seen!r}"
                self.seen += chunk
        return self.seen

    def finish(self, timeout: float = WAIT) -> tuple[int, str]:
        """Wait for the end, reading the terminal and stderr meanwhile; the exit status
        and stderr."""
        assert self.process.stderr is not None
        err_fd = self.process.stderr.fileno()
        err = b""
        open_fds = {self._master, err_fd}
        deadline = time.monotonic() + timeout
        while open_fds:
            left = deadline - time.monotonic()
            assert left > 0, f"no end; the terminal showed {self.seen!r}, stderr {err!r}"
            ready, _, _ = select.select(list(open_fds), [], [], left)
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the terminal's other side is closed
                    chunk = b""
                if not chunk:
                    open_fds.discard(fd)
                elif fd == err_fd:
                    err += chunk
                else:
                    self.seen += chunk
        os.close(self._master)
        self.process.stderr.close()
        return self.process.wait(timeout), err.decode()
