"""A throw-away ``nats-server`` with JetStream on loopback, for tests and local trials."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Final

__all__ = ["NatsServer", "nats_server_binary"]

READY: Final = "Server is ready"


def nats_server_binary() -> str | None:
    """The ``nats-server`` on ``PATH`` (Debian: ``apt-get install nats-server``), or ``None``."""
    return shutil.which("nats-server")


def _drain(stream: IO[str]) -> None:
    with stream:
        for _ in stream:
            pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class NatsServer:
    """``nats-server -js`` on ``127.0.0.1`` with its store in ``store_dir``; restartable on
    the same port and store (:meth:`stop` then :meth:`start`)."""

    def __init__(self, store_dir: Path, *, port: int | None = None) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise FileNotFoundError("nats-server is not installed")
        self.binary = binary
        self.store_dir = store_dir
        self.port = port or _free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start the server and return once it says it is ready."""
        process = subprocess.Popen(
            [
                self.binary,
                "-js",
                "-sd",
                str(self.store_dir),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stderr is not None
        lines: list[str] = []
        for line in process.stderr:
            lines.append(line)
            if READY in line:
                break
        else:
            process.wait()
            raise RuntimeError("nats-server did not start:\n" + "".join(lines[-20:]))
        # Keep reading its log: a Go program writing to a closed stderr dies of SIGPIPE.
        threading.Thread(target=_drain, args=(process.stderr,), daemon=True).start()
        self._process = process

    def stop(self) -> None:
        """Stop the server (SIGKILL: an outage, not a shutdown) and wait for it."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    @classmethod
    @contextmanager
    def running(cls, store_dir: Path) -> Iterator[NatsServer]:
        server = cls(store_dir)
        server.start()
        try:
            yield server
        finally:
            server.stop()
