"""The OS sandbox: bubblewrap's arguments, and whether it works on this machine.

:func:`bubblewrap_args` builds the command line (see ``docs/security.md``, "The
make_figure sandbox"): every namespace new (user, pid, network, IPC, UTS, cgroup) and no
further user namespaces inside, no capabilities, a new session, killed with its parent,
no inherited environment; a read-only view of ``/usr``, the ``/lib*`` and ``/bin`` links,
``/etc/ld.so.cache`` and the Python installation (its prefixes and site folders, nothing
else of the host);
the run's folder read-only; size-limited tmpfs folders for ``/tmp`` and the output (the
only writable places); a fresh ``/proc`` for the new pid namespace; a ``/dev`` of
``null``, ``zero`` and ``urandom`` only, read-only like the rest of the root; and the
seccomp filter (no new process, no shared memory outside the tmpfs).

:func:`bubblewrap_problem` starts the same sandbox once with ``python -c pass`` and says
why it failed (``None``: it works); a success is remembered for the process's lifetime.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from actors.tools.sandbox.limits import SandboxLimits
from actors.tools.sandbox.seccomp import no_new_processes

__all__ = [
    "DATA_DIR",
    "DEVICES",
    "OUT_DIR",
    "SANDBOX_ENV",
    "bubblewrap_args",
    "bubblewrap_problem",
    "seccomp_pipe",
]

DATA_DIR: Final = "/sandbox/data"
"""Where the run's folder appears inside the sandbox (read-only)."""
OUT_DIR: Final = "/sandbox/out"
"""The sandbox's output folder (a tmpfs of ``file_bytes``)."""

SANDBOX_ENV: Final = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "MPLBACKEND": "Agg",
    "MPLCONFIGDIR": "/tmp/matplotlib",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}
"""The whole environment of the sandboxed process (``HOME``/``MPLCONFIGDIR`` are moved
into the scratch folder when no sandbox runs)."""

DEVICES: Final = ("/dev/null", "/dev/zero", "/dev/urandom")
"""The whole of the sandbox's ``/dev``: these nodes bound from the host, in a read-only
folder of the sandbox's root (no ``/dev/shm``, no tmpfs)."""

_SYSTEM_LINKS: Final = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def bubblewrap_args(
    bwrap: str,
    data_dir: Path,
    limits: SandboxLimits,
    command: Sequence[str],
    *,
    seccomp_fd: int | None,
) -> list[str]:
    """The ``bwrap`` command line that runs ``command`` in the sandbox.

    :raises ValueError: a prefix of the Python installation is ``/`` (binding it would bind
        the whole host).
    """
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    for name, value in SANDBOX_ENV.items():
        args += ["--setenv", name, value]
    args += ["--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    args += ["--size", str(limits.file_bytes), "--tmpfs", OUT_DIR]
    # Of /etc only the dynamic linker's cache: libraries in folders it alone lists load.
    args += ["--ro-bind", "/usr", "/usr", "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    # The folders the interpreter needs (prefixes, site folders, the executable's own),
    # outside /usr and without one inside another.
    candidates = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        *site.getsitepackages(),
        os.path.dirname(os.path.realpath(sys.executable)),
    }
    roots: list[str] = []
    for path in sorted({os.path.abspath(p) for p in candidates if os.path.isdir(p)}, key=len):
        if path == "/":
            raise ValueError("the Python installation's prefix is /")
        if not _under(path, "/usr") and not any(_under(path, root) for root in roots):
            roots.append(path)
            args += ["--ro-bind", path, path]
    args += ["--ro-bind", str(data_dir.resolve()), DATA_DIR]
    args += ["--proc", "/proc"]
    for device in DEVICES:  # no --dev: its /dev and /dev/shm are unsized, writable tmpfs
        args += ["--dev-bind", device, device]
    args += ["--remount-ro", "/", "--chdir", "/tmp"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return [*args, "--", *command]


def seccomp_pipe() -> int | None:
    """A pipe's read end holding the seccomp filter (the caller closes it), or ``None``
    when there is no filter for this machine."""
    program = no_new_processes()
    if program is None:
        return None
    read, write = os.pipe()
    try:
        os.write(write, program)  # a few hundred bytes: fits the pipe's buffer
    finally:
        os.close(write)
    return read


_working: set[str] = set()
_lock = threading.Lock()


def bubblewrap_problem(bwrap: str | None) -> str | None:
    """Why the sandbox cannot run with ``bwrap`` (a path, or ``None`` when not found), or
    ``None`` when it works here. Blocking (call it in a thread); successes are cached."""
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    with _lock:
        if bwrap in _working:
            return None
    if not os.access(bwrap, os.X_OK):
        return f"{bwrap} was not found or is not executable"
    seccomp = seccomp_pipe()
    try:
        with tempfile.TemporaryDirectory(prefix="loopfuse-sandbox-probe-") as data:
            command = [sys.executable, "-I", "-c", "pass"]
            args = bubblewrap_args(bwrap, Path(data), SandboxLimits(), command, seccomp_fd=seccomp)
            done = subprocess.run(
                args,
                capture_output=True,
                env={},
                timeout=30,
                pass_fds=() if seccomp is None else (seccomp,),
                check=False,
            )
    except ValueError as exc:  # from bubblewrap_args: a Python prefix of /
        return str(exc)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} did not run: {exc}"
    finally:
        if seccomp is not None:
            os.close(seccomp)
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        return f"{bwrap} could not start a sandbox here ({reason})"
    with _lock:
        _working.add(bwrap)
    return None
