"""make_figure's sandbox holds no more of the host's memory than its documented tmpfs, and
leaves nothing on the host after a call.

The probe gets around the static check and the driver's restricted builtins (the prelude
of ``test_figure_sandbox_escapes``) and writes until it fails everywhere it might: ``/dev``,
``/dev/shm``, the root, ``/tmp``, the output folder, memory files (``memfd_create``).
While it still holds what it wrote it reads the host's shared memory (``Shmem`` in
``/proc/meminfo``: host-wide, the same in the sandbox) and compares it with what it read
before. bubblewrap's own ``--dev`` gave a writable ``/dev`` and ``/dev/shm`` (tmpfs of half
the host's RAM), and memory files count in no tmpfs and, written with ``write``, in no
``RLIMIT_AS``.
"""

from __future__ import annotations

import ast
import os
import tempfile
from pathlib import Path

import pytest

from actors.tools.sandbox import SandboxLimits, run_process_layer
from tests.sandbox_support import bubblewrap_or_skip
from tests.test_figure_sandbox_escapes import PRELUDE

CAP = 256 << 20
"""The probe stops writing a place here (without the bounds it would fill the host)."""

FILL_PROBE = """
def shmem():
    for line in B.open('/proc/meminfo'):
        if line.startswith('Shmem:'):
            return int(line.split()[1]) * 1024
CHUNK = b'x' * (4 << 20)
CAP = CAP_BYTES
held = []
def fill(folder):
    written, n = 0, 0
    try:
        while written < CAP:
            with B.open(folder + '/fill' + str(n), 'wb') as f:
                for _ in range(4):
                    written += f.write(CHUNK)
            n += 1
    except BaseException as exc:
        return (written, type(exc).__name__)
    return (written, 'cap')
def fill_memory_files():
    written = 0
    try:
        while written < CAP:
            fd = os.memfd_create('fill')
            held.append(fd)
            for _ in range(4):
                written += os.write(fd, CHUNK)
    except BaseException as exc:
        return (written, type(exc).__name__)
    return (written, 'cap')
before = shmem()
seen = {'dev': sorted(os.listdir('/dev'))}
for folder in ('/dev', '/dev/shm', '/', '/tmp', OUT_DIR):
    seen[folder] = fill(folder)
seen['memfd'] = fill_memory_files()
seen['shmem'] = shmem() - before
for name in os.listdir(OUT_DIR):
    os.remove(OUT_DIR + '/' + name)
write_text('report.txt', repr(seen))
"""


def _host_shm_used() -> int:
    info = os.statvfs("/dev/shm")
    return (info.f_blocks - info.f_bfree) * info.f_frsize


def test_writing_until_it_fails_holds_only_the_documented_tmpfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bwrap = bubblewrap_or_skip()
    host_tmp = tmp_path / "host-tmp"  # the runner's scratch, channel and error files
    host_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(host_tmp))
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    limits = SandboxLimits()
    shm_before = _host_shm_used()

    code = PRELUDE + FILL_PROBE.replace("CAP_BYTES", str(CAP))
    result = run_process_layer(code, data, out, bwrap=bwrap, limits=limits)

    assert result.ok, result.error
    seen = ast.literal_eval((out / "report.txt").read_text())
    assert seen["dev"] == ["null", "urandom", "zero"]
    assert seen["/dev"] == (0, "OSError")  # read-only (EROFS)
    assert seen["/dev/shm"] == (0, "FileNotFoundError")
    assert seen["/"] == (0, "OSError")
    assert seen["memfd"] == (0, "PermissionError")  # the seccomp filter
    tmp_written, tmp_error = seen["/tmp"]
    assert 0 < tmp_written <= limits.tmp_bytes
    assert tmp_error == "OSError"  # ENOSPC: the tmpfs is full
    out_written, out_error = seen[os.fspath("/sandbox/out")]
    assert 0 < out_written <= limits.file_bytes
    assert out_error == "OSError"
    # The host's shared memory grew by the two tmpfs at most (84 MiB; 32 MiB for the
    # rest of the machine meanwhile), while the sandbox held everything it wrote.
    assert seen["shmem"] <= limits.tmp_bytes + limits.file_bytes + (32 << 20)
    assert _host_shm_used() - shm_before < 8 << 20
    assert list(host_tmp.iterdir()) == []  # no view, channel or scratch left behind
    assert sorted(p.name for p in out.iterdir()) == ["report.txt"]
