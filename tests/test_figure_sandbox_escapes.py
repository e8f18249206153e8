"""Escapes from make_figure's sandbox, run past the static check: the OS boundary holds.

Every probe calls the process layer directly (``run_process_layer``: no static check) and
starts with a prelude that also gets around the driver's restricted builtins and import
hook (``statistics.sys.modules['builtins']``), so what stops it is bubblewrap, the
seccomp filter and the rlimits. Each probe records what it saw in ``report.txt`` (so the
test knows the code ran) and tries to leave a trace on the host. The same probes in
``unsafe-process`` mode show that each one is a real escape without the sandbox.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from actors.tools.limits import FigureSandbox
from actors.tools.sandbox import SandboxLimits, run_process_layer, run_sandboxed
from tests.sandbox_support import HAS_MATPLOTLIB, bubblewrap_or_skip

ROOT = Path(__file__).resolve().parent.parent
SECRET = "daemon-secret-RECOGNISABLE-9311"

PRELUDE = """\
import statistics
sys = statistics.sys
B = sys.modules['builtins']
os = sys.modules['os']
def attempt(action):
    try:
        return repr(action())
    except BaseException as exc:
        return type(exc).__name__ + ': ' + str(exc)
"""


@dataclass(frozen=True)
class Host:
    """What a probe may try to reach on the host."""

    tmp: Path
    data: Path
    out: Path

    @property
    def marker(self) -> Path:
        return self.tmp / "marker"

    @property
    def outside(self) -> Path:
        return self.tmp / "outside.txt"

    def fill(self, template: str) -> str:
        return (
            template.replace("MARKER", str(self.marker))
            .replace("OUTSIDE", str(self.outside))
            .replace("REPO_FILE", str(Path(__file__).resolve()))
        )

    def report(self) -> str:
        return (self.out / "report.txt").read_text()


@dataclass(frozen=True)
class Escape:
    name: str
    code: str
    escaped: Callable[[Host], bool]


ESCAPES = [
    Escape(
        "os.system through statistics.sys.modules",
        "write_text('report.txt', attempt(lambda: "
        "statistics.sys.modules['os'].system('id; touch MARKER')))",
        lambda host: host.marker.exists(),
    ),
    Escape(
        "os.system through json.decoder.re.enum.sys",
        "import json\nwrite_text('report.txt', attempt(lambda: "
        "json.decoder.re.enum.sys.modules['os'].system('touch MARKER')))",
        lambda host: host.marker.exists(),
    ),
    Escape(
        "builtins.open reads /etc/passwd",
        "write_text('report.txt', attempt(lambda: "
        "statistics.sys.modules['builtins'].open('/etc/passwd').read()))",
        lambda host: "root:" in host.report(),
    ),
    Escape(
        "builtins.open reads the repository",
        "write_text('report.txt', attempt(lambda: B.open('REPO_FILE').read()))",
        lambda host: "RECOGNISABLE-9311" in host.report(),
    ),
    Escape(
        "builtins.open writes outside the output folder",
        "write_text('report.txt', attempt(lambda: B.open('OUTSIDE', 'w').write('x')))",
        lambda host: host.outside.exists(),
    ),
    Escape(
        "builtins.open writes into the data folder",
        "write_text('report.txt', attempt(lambda: B.open(DATA_DIR + '/planted', 'w').write('x')))",
        lambda host: (host.data / "planted").exists(),
    ),
    Escape(
        "subprocess",
        "sp = B.__import__('subprocess')\n"
        "write_text('report.txt', attempt(lambda: sp.run(['touch', 'MARKER']).returncode))",
        lambda host: host.marker.exists(),
    ),
    Escape(
        "ctypes",
        "ct = B.__import__('ctypes')\n"
        "write_text('report.txt', attempt(lambda: ct.CDLL(None).system(b'touch MARKER')))",
        lambda host: host.marker.exists(),
    ),
    Escape(
        "an os.fork loop",
        "forked = 0\n"
        "for _ in range(20):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        os._exit(0)\n"
        "    forked += 1\n"
        "write_text('report.txt', str(forked))",
        lambda host: host.report() != "0",
    ),
]


def _probe(escape: Escape, tmp_path: Path, sandbox: FigureSandbox, bwrap: str | None) -> Host:
    host = Host(tmp_path, tmp_path / "data", tmp_path / "out")
    host.data.mkdir()
    (host.data / "a.csv").write_text("1,2\n")
    code = PRELUDE + host.fill(escape.code)
    result = run_process_layer(code, host.data, host.out, sandbox=sandbox, bwrap=bwrap)
    assert result.ok, result.error  # every attempt is caught: the code ran to its end
    assert "report.txt" in result.outputs
    return host


@pytest.fixture(scope="module")
def bwrap() -> str:
    return bubblewrap_or_skip()


@pytest.mark.parametrize("escape", ESCAPES, ids=lambda escape: escape.name)
def test_the_sandbox_stops_it(escape: Escape, tmp_path: Path, bwrap: str) -> None:
    host = _probe(escape, tmp_path, "bubblewrap", bwrap)
    assert not escape.escaped(host), host.report()


@pytest.mark.parametrize("escape", ESCAPES, ids=lambda escape: escape.name)
def test_without_the_sandbox_it_escapes(escape: Escape, tmp_path: Path) -> None:
    # The control: each probe really escapes a plain process (the unsafe mode).
    if escape.name == "an os.fork loop" and os.geteuid() != 0:
        pytest.skip("RLIMIT_NPROC counts every process of this user: it may allow no fork")
    host = _probe(escape, tmp_path, "unsafe-process", None)
    assert escape.escaped(host), host.report()


def test_inside_what_the_probes_saw(tmp_path: Path, bwrap: str) -> None:
    # Why they failed: no such file (not bound), read-only, no new process.
    seen: dict[str, str] = {}
    for escape in ESCAPES:
        case = tmp_path / str(len(seen))
        case.mkdir()
        seen[escape.name] = _probe(escape, case, "bubblewrap", bwrap).report()
    assert seen["builtins.open reads /etc/passwd"].startswith("FileNotFoundError")
    assert seen["builtins.open reads the repository"].startswith("FileNotFoundError")
    assert seen["builtins.open writes outside the output folder"].startswith("FileNotFoundError")
    assert seen["builtins.open writes into the data folder"].startswith("OSError: [Errno 30]")
    assert seen["subprocess"].startswith("PermissionError")
    assert seen["an os.fork loop"] == "0"
    assert seen["os.system through statistics.sys.modules"] != "0"


HELPER = """
import os, sys
from pathlib import Path
from actors.tools.sandbox import run_process_layer
code = sys.argv[1].replace('DAEMON_PID', str(os.getpid()))
result = run_process_layer(code, Path(sys.argv[2]), Path(sys.argv[3]), sandbox=sys.argv[4])
print(result.ok, result.error)
"""

ENVIRON_PROBE = """
found = [repr(dict(os.environ))]
for pid in ('DAEMON_PID', str(os.getppid()), '1', 'self'):
    found.append(pid + ' ' + attempt(lambda: B.open('/proc/' + pid + '/environ', 'rb').read()))
write_text('report.txt', '\\n'.join(found))
"""


def _environment_seen(tmp_path: Path, sandbox: FigureSandbox) -> str:
    # A stand-in daemon: a process started with the secret in its environment (so it is
    # in its /proc/PID/environ too) runs the probe, which knows the daemon's real pid.
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", HELPER, PRELUDE + ENVIRON_PROBE, str(data), str(out), sandbox],
        env={**os.environ, "LOOPFUSE_SANDBOX_SECRET": SECRET},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.startswith("True"), done.stdout + done.stderr
    return (out / "report.txt").read_text()


def test_the_daemons_environment_is_out_of_reach(tmp_path: Path, bwrap: str) -> None:
    seen = _environment_seen(tmp_path, "bubblewrap")
    assert SECRET not in seen
    lines = seen.splitlines()
    assert "LOOPFUSE" not in lines[0]  # os.environ: only what the sandbox sets
    assert "FileNotFoundError" in lines[1]  # the daemon's pid: not in this pid namespace
    assert "HOME=/tmp" in lines[4]  # its own


def test_without_the_sandbox_the_daemons_environment_leaks(tmp_path: Path) -> None:
    assert SECRET in _environment_seen(tmp_path, "unsafe-process")


NETWORK_PROBE = """
so = B.__import__('socket')
write_text('report.txt', attempt(lambda: so.create_connection(('127.0.0.1', PORT), 5).send(b'x')))
"""


def _connects(tmp_path: Path, sandbox: FigureSandbox, bwrap: str | None) -> tuple[bool, str]:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        code = PRELUDE + NETWORK_PROBE.replace("PORT", str(server.getsockname()[1]))
        result = run_process_layer(code, data, out, sandbox=sandbox, bwrap=bwrap)
        assert result.ok, result.error
        try:
            connection, _ = server.accept()  # a completed handshake waits in the backlog
        except BlockingIOError:
            return False, (out / "report.txt").read_text()
        connection.close()
        return True, (out / "report.txt").read_text()


def test_no_network_not_even_loopback(tmp_path: Path, bwrap: str) -> None:
    connected, report = _connects(tmp_path, "bubblewrap", bwrap)
    assert not connected
    # The network namespace has a loopback of its own, where nothing listens.
    assert report.startswith("ConnectionRefusedError")


def test_without_the_sandbox_loopback_answers(tmp_path: Path) -> None:
    connected, report = _connects(tmp_path, "unsafe-process", None)
    assert connected
    assert report == "1"


def test_only_tmp_and_the_output_folder_are_writable(tmp_path: Path, bwrap: str) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    targets = ["/planted", "/usr/planted", "DATA_DIR + '/planted'", "sys.prefix + '/planted'"]
    targets = [t if "+" in t else repr(t) for t in targets] + ["'/tmp/ok'"]
    code = PRELUDE + "lines = []\n"
    for target in targets:
        code += f"lines.append(attempt(lambda: B.open({target}, 'w').write('x')))\n"
    code += "write_text('report.txt', '\\n'.join(lines))\n"
    result = run_process_layer(code, data, out, bwrap=bwrap)
    assert result.ok, result.error
    lines = (out / "report.txt").read_text().splitlines()
    assert all(line.startswith("OSError: [Errno 30]") for line in lines[:4]), lines
    assert lines[4] == "1"
    assert list(data.iterdir()) == []


def test_tmp_output_and_file_sizes_are_bounded(tmp_path: Path, bwrap: str) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    code = PRELUDE + (
        "def fill():\n"
        "    for n in range(10):\n"
        "        with B.open('/tmp/f' + str(n), 'wb') as f:\n"
        "            f.write(b'x' * (512 << 10))\n"
        "lines = [attempt(fill),\n"
        "         attempt(lambda: B.open(OUT_DIR + '/big.bin', 'wb').write(b'x' * (3 << 20)))]\n"
        "os.remove(OUT_DIR + '/big.bin')\n"
        "write_text('report.txt', '\\n'.join(lines))\n"
    )
    limits = SandboxLimits(tmp_bytes=2 << 20, file_bytes=1 << 20)
    result = run_process_layer(code, data, out, bwrap=bwrap, limits=limits)
    assert result.ok, result.error
    tmp_line, out_line = (out / "report.txt").read_text().splitlines()
    assert tmp_line.startswith("OSError: [Errno 28]")  # the /tmp tmpfs is full
    assert out_line.startswith("OSError: [Errno 27]")  # RLIMIT_FSIZE: file too large


def test_time_and_memory_are_limited(tmp_path: Path, bwrap: str) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    spin = "while True:\n    pass"
    wall = run_process_layer(spin, data, out, bwrap=bwrap, limits=SandboxLimits(timeout_seconds=1))
    assert (wall.ok, wall.error) == (False, "timed out after 1 s (the sandbox was killed)")
    cpu = run_process_layer(spin, data, out, bwrap=bwrap, limits=SandboxLimits(cpu_seconds=1))
    assert (cpu.ok, cpu.error) == (False, "stopped by its CPU-time limit (1 s)")
    memory = SandboxLimits(memory_bytes=200 << 20)
    big = run_process_layer("x = bytearray(400 << 20)", data, out, bwrap=bwrap, limits=memory)
    assert not big.ok
    assert big.error.startswith("MemoryError")


def test_links_and_forged_results_do_not_come_back(tmp_path: Path, bwrap: str) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "a.csv").write_text("1,2\n")
    link = PRELUDE + (
        "os.symlink(DATA_DIR + '/a.csv', OUT_DIR + '/link.png')\nwrite_text('a.txt', 1)"
    )
    linked = run_process_layer(link, data, out, bwrap=bwrap)
    assert (linked.ok, linked.outputs) == (True, ("a.txt",))
    assert sorted(p.name for p in out.iterdir()) == ["a.txt"]
    # The code writes its own bytes into the result channel (the stdout the driver keeps).
    forge = PRELUDE + "for fd in range(3, 8):\n    attempt(lambda: os.write(fd, b'../../x 1\\nx'))"
    forged = run_process_layer(forge, data, tmp_path / "forged", bwrap=bwrap)
    assert not forged.ok
    assert forged.error.startswith("its files could not be read back")
    assert not (tmp_path / "forged").exists()


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib (the figures extra) is not installed")
def test_a_real_figure_renders_in_the_sandbox(tmp_path: Path, bwrap: str) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    (data / "a.csv").write_text("1,2\n2,4\n3,9\n")
    code = (
        "import csv\nimport matplotlib.pyplot as plt\n"
        "rows = list(csv.reader(read_text('a.csv').splitlines()))\n"
        "plt.plot([float(r[0]) for r in rows], [float(r[1]) for r in rows])\n"
        "savefig('plot.png')\n"
    )
    result = run_sandboxed(code, data, out, bwrap=bwrap)
    assert (result.ok, result.error, result.outputs) == (True, "", ("plot.png",))
    assert (out / "plot.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
