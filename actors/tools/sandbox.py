"""Running model-written plotting code: a static check, then a limited separate process.

Layer 1, :func:`check_code` (before anything runs): only allow-listed modules may be
imported; ``open``, ``eval``, ``exec``, ``compile``, ``getattr`` & co., any name or
attribute starting with ``_`` (``().__class__``, ``__builtins__``) are refused, naming what.

Layer 2, :func:`run_sandboxed`: a separate ``python -I`` process in a fresh temporary
working directory, with CPU-time, address-space and file-size limits (``setrlimit``), a
wall-clock timeout, no network when ``unshare -rn`` works on this machine (a new user and
network namespace; otherwise the network is *not* cut and :data:`NETWORK_ISOLATION` says
so), and inside it restricted builtins (no ``open``/``eval``/``exec``/…) and an import hook
that refuses modules outside the allow-list for the model's code. The data folder and the
output folder are passed as paths; the helpers ``data_path``/``read_text`` resolve only
inside the data folder and ``savefig`` writes only into the output folder.

Limits, honestly: without root there is no mount namespace here, so the process could read
any file the user can, if it got past both layers; the layers make that hard, they do not
make it impossible. Run untrusted code in a container for a hard boundary.
"""

from __future__ import annotations

import ast
import functools
import json
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "ALLOWED_MODULES",
    "NETWORK_ISOLATION",
    "SandboxRefused",
    "SandboxResult",
    "check_code",
    "network_isolation",
    "run_process_layer",
    "run_sandboxed",
]

ALLOWED_MODULES: Final = frozenset(
    {"matplotlib", "numpy", "math", "statistics", "csv", "json", "collections", "itertools"}
)
REFUSED_NAMES: Final = frozenset(
    {
        "open",
        "eval",
        "exec",
        "compile",
        "__import__",
        "getattr",
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "input",
        "breakpoint",
        "help",
        "memoryview",
        "exit",
        "quit",
    }
)


class SandboxRefused(ValueError):
    """The code was refused by the static check; the message names what and where."""


def check_code(code: str) -> None:
    """Refuse code that imports outside :data:`ALLOWED_MODULES`, names a refused builtin,
    or touches any name or attribute starting with ``_``.

    :raises SandboxRefused: naming the first refused construct and its line.
    """
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise SandboxRefused(f"syntax error at line {exc.lineno}: {exc.msg}") from None
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        match node:
            case ast.Import(names=names):
                for alias in names:
                    _check_module(alias.name, line)
            case ast.ImportFrom(module=module, level=level):
                if level:
                    raise SandboxRefused(f"line {line}: relative imports are refused")
                _check_module(module or "", line)
            case ast.Name(id=name) if name in REFUSED_NAMES or name.startswith("_"):
                raise SandboxRefused(f"line {line}: the name {name!r} is refused")
            case ast.Attribute(attr=attr) if attr.startswith("_"):
                raise SandboxRefused(f"line {line}: the attribute {attr!r} is refused")
            case ast.alias(asname=asname) if asname and asname.startswith("_"):
                raise SandboxRefused(f"line {line}: the name {asname!r} is refused")
            case _:
                pass


def _check_module(name: str, line: object) -> None:
    if name.split(".")[0] not in ALLOWED_MODULES:
        allowed = ", ".join(sorted(ALLOWED_MODULES))
        raise SandboxRefused(f"line {line}: import of {name!r} is refused (allowed: {allowed})")


@functools.cache
def _unshare() -> tuple[str, ...]:
    """The prefix that runs a command without network, or ``()`` when unavailable."""
    path = shutil.which("unshare")
    if path is None:
        return ()
    try:
        done = subprocess.run([path, "-rn", "true"], capture_output=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (path, "-rn") if done.returncode == 0 else ()


def network_isolation() -> bool:
    """True when sandboxed code runs without network on this machine."""
    return bool(_unshare())


NETWORK_ISOLATION: Final = "unshare -rn (a new network namespace) when it works, else none"


@dataclass(frozen=True)
class SandboxResult:
    ok: bool
    error: str
    outputs: tuple[str, ...]
    """Files the code wrote into the output folder (names)."""
    network_isolated: bool


_DRIVER: Final = r"""
import builtins, json, os, sys
DATA, OUT = sys.argv[1], sys.argv[2]
ALLOWED, REFUSED = set(json.loads(sys.argv[3])), set(json.loads(sys.argv[4]))
os.environ["MPLBACKEND"] = "Agg"
_real_import = builtins.__import__
def _guarded(name, globals=None, locals=None, fromlist=(), level=0):
    # the model's code only: its import statements and __import__ calls resolve here
    if level or name.split(".")[0] not in ALLOWED:
        raise ImportError(f"import of {name!r} is refused")
    return _real_import(name, globals, locals, fromlist, level)
def _inside(base, rel):
    path = os.path.realpath(os.path.join(base, rel))
    if path != base and not path.startswith(base + os.sep):
        raise PermissionError(f"{rel!r} is outside the allowed folder")
    return path
def data_path(rel):
    return _inside(DATA, rel)
def read_text(rel):
    with open(data_path(rel), encoding="utf-8") as f:
        return f.read()
def savefig(name, **kwargs):
    import matplotlib.pyplot as plt
    plt.savefig(_inside(OUT, os.path.basename(name)), **kwargs)
def write_text(name, text):
    with open(_inside(OUT, os.path.basename(name)), "w", encoding="utf-8") as f:
        f.write(str(text))
safe = {k: v for k, v in vars(builtins).items() if k not in REFUSED and not k.startswith("_")}
safe["__import__"] = _guarded
safe["__build_class__"] = builtins.__build_class__
code = sys.stdin.read()
namespace = {"__name__": "__sandbox__", "__builtins__": safe, "DATA_DIR": DATA, "OUT_DIR": OUT,
             "data_path": data_path, "read_text": read_text, "savefig": savefig,
             "write_text": write_text}
try:
    exec(compile(code, "<figure>", "exec"), namespace)
except BaseException as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
"""


def _limits(cpu_seconds: int, memory_bytes: int, file_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_sandboxed(
    code: str,
    data_dir: Path,
    out_dir: Path,
    *,
    timeout_seconds: float = 30.0,
    memory_bytes: int = 1 << 30,
    file_bytes: int = 20 << 20,
) -> SandboxResult:
    """Check ``code``, then run it in a limited process (blocking: call it in a thread).

    :raises SandboxRefused: the static check refused the code.
    """
    check_code(code)
    return run_process_layer(
        code,
        data_dir,
        out_dir,
        timeout_seconds=timeout_seconds,
        memory_bytes=memory_bytes,
        file_bytes=file_bytes,
    )


def run_process_layer(
    code: str,
    data_dir: Path,
    out_dir: Path,
    *,
    timeout_seconds: float = 30.0,
    memory_bytes: int = 1 << 30,
    file_bytes: int = 20 << 20,
) -> SandboxResult:
    """Layer 2 alone: run ``code`` in the limited process without the static check (tests
    use it to show what this layer stops by itself)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in out_dir.iterdir()}
    prefix = _unshare()
    args = [
        *prefix,
        sys.executable,
        "-I",
        "-c",
        _DRIVER,
        str(data_dir.resolve()),
        str(out_dir.resolve()),
        json.dumps(sorted(ALLOWED_MODULES)),
        json.dumps(sorted(REFUSED_NAMES)),
    ]
    cpu = max(1, int(timeout_seconds))
    with tempfile.TemporaryDirectory(prefix="loopfuse-figure-") as cwd:
        try:
            done = subprocess.run(
                args,
                input=code,
                capture_output=True,
                text=True,
                cwd=cwd,
                env={
                    "MPLBACKEND": "Agg",
                    "MPLCONFIGDIR": cwd,
                    "HOME": cwd,
                    "PATH": "/usr/bin:/bin",
                },
                timeout=timeout_seconds,
                preexec_fn=functools.partial(_limits, cpu, memory_bytes, file_bytes),
                check=False,
            )
        except subprocess.TimeoutExpired:
            return SandboxResult(False, f"timed out after {timeout_seconds:g} s", (), bool(prefix))
    outputs = tuple(sorted(p.name for p in out_dir.iterdir() if p.name not in before))
    if done.returncode in (-signal.SIGKILL, -signal.SIGXCPU):
        # The CPU-time limit (RLIMIT_CPU) ended it before the wall-clock timeout did.
        reason = f"timed out after {timeout_seconds:g} s (its CPU time limit)"
        return SandboxResult(False, reason, outputs, bool(prefix))
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return SandboxResult(False, tail[0][:500], outputs, bool(prefix))
    return SandboxResult(True, "", outputs, bool(prefix))
