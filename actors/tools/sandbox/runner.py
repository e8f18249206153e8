"""Run model-written code in the sandbox and bring its files back.

:func:`run_sandboxed` runs the static check, then :func:`run_process_layer`: with
``sandbox="bubblewrap"`` (the default) the driver runs inside bubblewrap
(:mod:`actors.tools.sandbox.bubblewrap`), and when bubblewrap is missing or cannot start
a sandbox here the call is refused (:class:`SandboxUnavailable`), never run without it.
``sandbox="unsafe-process"`` is the operator's explicit opt-out: the same driver and
rlimits in a plain child process that can read, write and connect wherever the daemon's
user can.

Either way a wall-clock timeout kills the whole process group (and bubblewrap's death
kills the sandbox: ``--die-with-parent``, then the end of its pid namespace), and the
files come back through the result channel (:mod:`actors.tools.sandbox.outputs`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from actors.tools.limits import FigureSandbox
from actors.tools.sandbox.bubblewrap import (
    DATA_DIR,
    OUT_DIR,
    SANDBOX_ENV,
    bubblewrap_args,
    bubblewrap_problem,
    seccomp_pipe,
)
from actors.tools.sandbox.limits import SandboxLimits
from actors.tools.sandbox.outputs import OutputsUnreadable, read_outputs, save_outputs
from actors.tools.sandbox.static_check import ALLOWED_MODULES, REFUSED_NAMES, check_code

__all__ = [
    "SandboxResult",
    "SandboxUnavailable",
    "run_process_layer",
    "run_sandboxed",
    "sandbox_warning",
]

DEFAULT_LIMITS: Final = SandboxLimits()
_ERROR_CHARS: Final = 500
_KILLED: Final = frozenset({signal.SIGKILL, signal.SIGXCPU})
"""How the CPU-time limit ends a process: SIGXCPU at the soft limit, SIGKILL at the hard."""


class SandboxUnavailable(RuntimeError):
    """The bubblewrap sandbox cannot run here; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class SandboxResult:
    ok: bool
    error: str
    outputs: tuple[str, ...]
    """Files the code saved, now in the output folder (names)."""


def unavailable_message(problem: str) -> str:
    """The refusal: the problem, and the operator's two ways out."""
    return (
        f"{problem}; make_figure runs model-written code only inside a bubblewrap sandbox. "
        "The operator can install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) "
        'or set tools.figure_sandbox = "unsafe-process" to run it without one'
    )


def sandbox_warning(sandbox: FigureSandbox) -> str | None:
    """What to log at start-up about ``make_figure``'s sandbox, or ``None`` when bubblewrap
    works here. Blocking (it may start bubblewrap once): call it in a thread."""
    if sandbox == "unsafe-process":
        return (
            'tools.figure_sandbox = "unsafe-process": make_figure runs model-written code '
            "in a plain process, without an OS sandbox (it can read and write what the "
            "daemon's user can, and use the network)"
        )
    problem = bubblewrap_problem(shutil.which("bwrap"))
    if problem is None:
        return None
    return f"make_figure will refuse every call: {unavailable_message(problem)}"


def run_sandboxed(
    code: str,
    data_dir: Path,
    out_dir: Path,
    *,
    sandbox: FigureSandbox = "bubblewrap",
    bwrap: str | None = None,
) -> SandboxResult:
    """Check ``code``, then run it (blocking: call it in a thread).

    :raises SandboxRefused: the static check refused the code.
    :raises SandboxUnavailable: see :func:`run_process_layer`.
    """
    check_code(code)
    return run_process_layer(code, data_dir, out_dir, sandbox=sandbox, bwrap=bwrap)


def run_process_layer(
    code: str,
    data_dir: Path,
    out_dir: Path,
    *,
    sandbox: FigureSandbox = "bubblewrap",
    bwrap: str | None = None,
    limits: SandboxLimits = DEFAULT_LIMITS,
) -> SandboxResult:
    """Run ``code`` without the static check (blocking). ``data_dir`` is visible read-only;
    the files the code saves end up in ``out_dir``. ``bwrap``: the bubblewrap executable
    (default: ``bwrap`` on ``PATH``).

    :raises SandboxUnavailable: ``sandbox="bubblewrap"`` and bubblewrap is missing or
        cannot start a sandbox here.
    """
    bwrap = bwrap or shutil.which("bwrap")
    if sandbox == "bubblewrap" and (problem := bubblewrap_problem(bwrap)) is not None:
        raise SandboxUnavailable(unavailable_message(problem))
    with (
        tempfile.TemporaryDirectory(prefix="loopfuse-figure-") as scratch,
        tempfile.TemporaryFile() as channel,
        tempfile.TemporaryFile() as errors,
    ):
        seccomp = None
        try:
            if sandbox == "bubblewrap":
                assert bwrap is not None
                seccomp = seccomp_pipe()
                command = _command(DATA_DIR, OUT_DIR, limits)
                args = bubblewrap_args(bwrap, data_dir, limits, command, seccomp_fd=seccomp)
                env: dict[str, str] = {}  # not even bwrap's: the sandbox's /proc/1 is bwrap's
            else:
                out = Path(scratch, "out")
                out.mkdir()
                env = {**SANDBOX_ENV, "HOME": scratch, "MPLCONFIGDIR": f"{scratch}/matplotlib"}
                args = _command(str(data_dir.resolve()), str(out), limits)
            process = subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=channel,
                stderr=errors,
                env=env,
                cwd=scratch,
                pass_fds=() if seccomp is None else (seccomp,),
                start_new_session=True,
            )
            try:  # to the end: the exit status, or None when the timeout killed it
                process.communicate(code.encode(), timeout=limits.timeout_seconds)
                returncode: int | None = process.returncode
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        finally:
            if seccomp is not None:
                os.close(seccomp)
        if returncode is None:
            error = f"timed out after {limits.timeout_seconds:g} s (the sandbox was killed)"
        # A signal shows as -N from a plain process and as 128+N from bwrap's exit status.
        elif (-returncode if returncode < 0 else returncode - 128) in _KILLED:
            error = f"stopped by its CPU-time limit ({limits.cpu_seconds} s)"
        elif returncode != 0:
            errors.seek(0, os.SEEK_END)
            errors.seek(max(0, errors.tell() - 4 * _ERROR_CHARS))
            lines = errors.read().decode(errors="replace").strip().splitlines()
            error = (lines[-1] if lines else f"exit status {returncode}")[:_ERROR_CHARS]
        else:
            channel.seek(0)
            try:
                files = read_outputs(channel, limits.file_bytes)
                error = ""
            except OutputsUnreadable as exc:
                error = f"its files could not be read back: {exc}"
        if error:
            return SandboxResult(False, error, ())
    return SandboxResult(True, "", save_outputs(files, out_dir))


@functools.cache
def _driver_source() -> str:
    return Path(__file__).with_name("driver.py").read_text(encoding="utf-8")


def _command(data: str, out: str, limits: SandboxLimits) -> list[str]:
    config = {
        "data": data,
        "out": out,
        "allowed": sorted(ALLOWED_MODULES),
        "refused": sorted(REFUSED_NAMES),
        "limits": limits.rlimits(),
    }
    return [sys.executable, "-I", "-X", "utf8", "-c", _driver_source(), json.dumps(config)]
