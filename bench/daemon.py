"""``python -m bench.daemon``: the daemon's own cost, measured on a real ``loopfuse serve``.

One ``loopfuse serve`` subprocess (a fresh SQLite store in a temporary folder) runs N runs
of a shipped scenario (``completed`` by default: two model requests, one ``list_dir`` call).
The bench process submits them over HTTP (``POST /v1/runs``) from ``--clients`` concurrent
submitters; the daemon runs ``--in-flight`` K of them at once (``runtime.max_concurrent_runs
= K``) and queues the rest (``daemon.queue_size = N``), so with N ≥ K it works at full load.
With ``--follow`` every run is also followed over SSE from its 202 to its ``event: end``.
Without it the bench learns that all runs ended by asking ``GET /v1/runs?status=…&limit=1``
every 100 ms once everything is submitted (a handful of cheap requests).

Reported, over the measured runs (a warm-up of ``--warmup`` runs comes first):

* **daemon CPU per run**: user + system time of the daemon process (its CPU-time clock, to
  the nanosecond; the kernel's share from ``/proc/<pid>/stat``) between the first
  submission and the moment the bench saw the last run ended (its threads included: SQLite
  commits, reads);
* **runs/s** over the same wall time, and the **submit latency** (``POST`` sent to ``202``
  read) p50 / p99 / max;
* **library**: the same N runs (same K) through :class:`~orchestrator.runtime.Runtime` in the
  bench process itself (``time.process_time``), so ``daemon / library`` is the daemon's own
  share as a ratio measured in one invocation;
* **stored**: events and bytes per run in the store (events, checkpoint, request, result);
* **CPU by subsystem** (``--profile``, needs ``py-spy``): ``py-spy record --format raw``
  samples (idle off: threads waiting in a syscall or a lock are not counted) of the daemon
  during the measured runs; each sample is charged to the *innermost loopfuse frame* of its
  stack, mapped to a subsystem by module (:data:`SUBSYSTEMS`); a sample with no loopfuse
  frame (the event loop between callbacks, uvicorn parsing HTTP …) is charged to the
  library package of its innermost frame;
* ``--endpoint``: the same again with the model a real endpoint, the simulator in its own
  process (``loopfuse sim``): ``task`` runs whose model is the ``completed`` script; the
  daemon's CPU per model request (the simulator's CPU is not the daemon's).

``--json`` prints the figures as JSON. Nothing here is a test: ``tests/test_bench_daemon.py``
only runs it at a tiny size to prove it works.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import anyio
import httpx
import msgspec

from orchestrator.config import Config, ModelSettings, RuntimeSettings
from orchestrator.runtime import RunSpec, Runtime
from orchestrator.scenarios.runs import start_scenario
from orchestrator.sim import find_scenario

__all__ = [
    "SUBSYSTEMS",
    "DaemonFigures",
    "group_samples",
    "main",
    "measure_daemon",
]

START_TIMEOUT: Final = 60.0
POLL_SECONDS: Final = 0.1
ENDPOINT_TASK: Final = "Look at the folder and tell me what experiment it holds."
_TICKS: Final = os.sysconf("SC_CLK_TCK")
_CPUCLOCK_SCHED: Final = 2  # linux/posix-timers.h: the process-wide scheduler clock

SUBSYSTEMS: Final[tuple[tuple[str, str], ...]] = (
    ("orchestrator/daemon/store", "store (SQLite)"),
    ("orchestrator/daemon/recorder", "event recorder"),
    ("orchestrator/daemon/sse", "SSE streams"),
    ("orchestrator/daemon/tail", "SSE streams"),
    ("orchestrator/daemon/", "daemon API (app, service, policy)"),
    ("orchestrator/sim/", "simulator (the model)"),
    ("orchestrator/scenarios/", "scenario folders"),
    ("actors/llm/", "LLM client"),
    ("orchestrator/web/", "HTTP server glue"),
    ("orchestrator/", "runtime (conductor, actors, bus)"),
    ("actors/", "runtime (conductor, actors, bus)"),
    ("bus/", "runtime (conductor, actors, bus)"),
)
"""Module path prefix → subsystem, first match wins (for the innermost loopfuse frame)."""

_LIBRARIES: Final[tuple[tuple[str, str], ...]] = (
    ("uvicorn", "HTTP server (uvicorn, h11, starlette)"),
    ("h11", "HTTP server (uvicorn, h11, starlette)"),
    ("starlette", "HTTP server (uvicorn, h11, starlette)"),
    ("httpx", "HTTP client (httpx, httpcore, openai)"),
    ("httpcore", "HTTP client (httpx, httpcore, openai)"),
    ("openai", "HTTP client (httpx, httpcore, openai)"),
    ("sqlite3", "store (SQLite)"),
    ("asyncio", "event loop (asyncio, anyio)"),
    ("anyio", "event loop (asyncio, anyio)"),
    ("selectors", "event loop (asyncio, anyio)"),
    ("tempfile", "scenario folders"),
    ("shutil", "scenario folders"),
    ("pathlib", "scenario folders"),
    ("logging", "logging"),
    ("json", "logging"),
)
_PASSTHROUGH: Final = (
    "orchestrator/cli",
    "orchestrator/__main__",
    "orchestrator/daemon/commands",
    "orchestrator/daemon/server",
    "orchestrator/web/serving",
)
"""Entry points and the ASGI guard: frames every sample of the event loop or of the HTTP
stack passes through; never the innermost loopfuse frame that a sample is charged to."""
_FRAME: Final = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*):\d+\)$")


@dataclass
class Phase:
    """One measured batch of runs."""

    runs: int
    wall_seconds: float
    cpu_seconds: float
    model_requests: int = 0
    submit_ms: list[float] = field(default_factory=list)
    disk_bytes: int = 0
    """What the daemon wrote to the block device (``/proc/<pid>/io`` ``write_bytes``)."""
    system_seconds: float = 0.0
    """The part of ``cpu_seconds`` spent in the kernel on the daemon's behalf (system time:
    its socket and file system calls, thread wake-ups)."""
    context_switches: int = 0
    """Voluntary + involuntary context switches of the daemon's threads (those alive at the
    end): each thread hand-off (a worker's wake-up, the GIL passed between threads) is one."""

    @property
    def cpu_ms_per_run(self) -> float:
        return 1000 * self.cpu_seconds / max(self.runs, 1)

    @property
    def cpu_us_per_request(self) -> float:
        return 1e6 * self.cpu_seconds / max(self.model_requests, 1)

    @property
    def runs_per_second(self) -> float:
        return self.runs / self.wall_seconds if self.wall_seconds else 0.0

    def submit_percentile(self, q: float) -> float:
        if not self.submit_ms:
            return 0.0
        ordered = sorted(self.submit_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class DaemonFigures:
    """What one invocation measured (see the module docstring)."""

    scenario: str
    runs: int
    in_flight: int
    clients: int
    follow: bool
    daemon: Phase
    library: Phase | None
    stored: dict[str, float]
    subsystems: dict[str, float]
    endpoint_daemon: Phase | None = None
    endpoint_library: Phase | None = None
    endpoint_subsystems: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("daemon", "library", "endpoint_daemon", "endpoint_library"):
            phase: Phase | None = getattr(self, name)
            if phase is None:
                continue
            entry = out[name]
            entry.pop("submit_ms")
            entry["cpu_ms_per_run"] = phase.cpu_ms_per_run
            entry["runs_per_second"] = phase.runs_per_second
            if phase.model_requests:
                entry["cpu_us_per_request"] = phase.cpu_us_per_request
            if phase.submit_ms:
                entry["submit_p50_ms"] = phase.submit_percentile(0.50)
                entry["submit_p99_ms"] = phase.submit_percentile(0.99)
                entry["submit_max_ms"] = max(phase.submit_ms)
        return out


# ---------------------------------------------------------------------- the daemon process

WRAP_VARIABLE: Final = "BENCH_DAEMON_WRAP"
"""An environment variable: a command line the daemon is run under (shell words)."""

SLOW_NAME: Final = "completed_slow"
_SLOW: Final = """
description = "completed, with the model taking {seconds} s per request."
task = "Look at the folder and tell me what experiment it holds."

[config]
max_turns = 5

[folder]
"README.txt" = "Yeast growth curves at 30 C, three biological replicates."

[[steps]]
latency = {seconds}
tool_calls = [{{ name = "list_dir", arguments = {{ path = "." }} }}]

[[steps]]
latency = {seconds}
text = "The folder holds yeast growth curves: OD600 every two hours, three replicates."

[expect]
exit_reason = "completed"
"""


def slow_scenario(folder: Path, seconds: float) -> Path:
    """``completed`` with the model answering after ``seconds`` (runs that wait, as runs on
    a real model do): ``<folder>/completed_slow.toml``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{SLOW_NAME}.toml"
    path.write_text(_SLOW.format(seconds=seconds), encoding="utf-8")
    return path


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` (all its threads, ended ones too), to the
    nanosecond: Linux's CPU-time clock of another process, the clock id glibc's
    ``clock_getcpuclockid`` makes. ``/proc/<pid>/stat`` counts in clock ticks (10 ms), so a
    few runs' CPU could read as nothing there."""
    return time.clock_gettime((~pid << 3) | _CPUCLOCK_SCHED)


def proc_system_seconds(pid: int) -> float:
    """System CPU seconds of process ``pid`` (all its threads), in clock ticks."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[12]) / _TICKS


def proc_context_switches(pid: int) -> int:
    """Context switches so far of the live threads of process ``pid``."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:  # the thread ended
            continue
        total += sum(int(line.split()[1]) for line in lines if "ctxt_switches" in line)
    return total


def proc_written_bytes(pid: int) -> int:
    """Bytes process ``pid`` caused to be written to the block device (``write_bytes`` of
    ``/proc/<pid>/io``: the store's WAL, its checkpoints into the database file, logs)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["write_bytes"])


def _write_config(
    folder: Path, *, runs: int, in_flight: int, base_url: str | None, scenario: Path | None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        "[daemon]",
        f'store_path = "{folder / "daemon.db"}"',
        f"queue_size = {max(runs, 1)}",
        # --follow holds a stream per run, all from this host: room for every one of them.
        f"max_connections = {runs + 1024}",
        f"max_connections_per_client = {runs + 1024}",
        *([f'scenarios = ["{scenario}"]'] if scenario is not None else []),
        "[runtime]",
        f"max_concurrent_runs = {in_flight}",
    ]
    if base_url is not None:
        model = scenario.stem if scenario is not None else "completed"  # --model-seconds
        lines += ["[model]", f'base_url = "{base_url}"', f'model = "{model}"']
    path = folder / "loopfuse.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@contextlib.contextmanager
def serve_process(config: Path, log: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``loopfuse serve --port 0`` on ``config``; yields the process and its URL once it
    listens (its banner). The command is prefixed with what :data:`WRAP_VARIABLE` holds, if
    anything (``valgrind --tool=callgrind …``: instructions, which this machine's noise does
    not move)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(config.parent)}
    env.setdefault("OPENAI_API_KEY", "bench")
    wrap = shlex.split(os.environ.get(WRAP_VARIABLE, ""))
    with log.open("a", encoding="utf-8") as stderr:
        process = subprocess.Popen(
            [
                *wrap,
                *(sys.executable, "-m", "orchestrator", "serve"),
                *("--config", str(config), "--port", "0"),
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
    try:
        assert process.stdout is not None
        timeout = START_TIMEOUT * (20 if wrap else 1)  # valgrind starts Python slowly
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        banner = process.stdout.readline() if ready else ""
        found = re.search(r"listening on (\S+)", banner)
        if found is None:
            raise RuntimeError(f"loopfuse serve did not come up: {log.read_text()[-2000:]}")
        yield process, found[1]
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


# ---------------------------------------------------------------------- driving it over HTTP


async def _follow(client: httpx.AsyncClient, run_id: str) -> None:
    """Read the run's SSE stream to its ``event: end``."""
    async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line in ("event: end", "event: shutdown"):
                return


async def _all_ended(client: httpx.AsyncClient) -> None:
    """Wait until the daemon has no queued or running run."""
    while True:
        busy = False
        for status in ("queued", "running"):
            page = (await client.get("/v1/runs", params={"status": status, "limit": 1})).json()
            busy = busy or bool(page["runs"])
        if not busy:
            return
        await anyio.sleep(POLL_SECONDS)


async def _drive(
    url: str,
    pid: int,
    bodies: Sequence[dict[str, Any]],
    *,
    clients: int,
    follow: bool,
    rate: float = 0.0,
) -> tuple[Phase, list[str]]:
    """Submit ``bodies`` from ``clients`` submitters; the phase from first POST to last end."""
    limits = httpx.Limits(max_connections=clients + len(bodies) + 4, max_keepalive_connections=None)
    timeout = httpx.Timeout(600.0)
    latencies: list[float] = []
    ids: list[str] = []
    queue = list(reversed(bodies))
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        async with anyio.create_task_group() as followers:

            async def submitter() -> None:
                while queue:
                    body = queue.pop()
                    if rate:  # open-loop arrivals: submission n is due at n / rate
                        due = start + (len(bodies) - len(queue) - 1) / rate
                        await anyio.sleep(max(0.0, due - time.perf_counter()))
                    began = time.perf_counter()
                    response = await client.post("/v1/runs", json=body)
                    latencies.append(1000 * (time.perf_counter() - began))
                    if response.status_code != 202:
                        raise RuntimeError(f"POST /v1/runs: {response.status_code} {response.text}")
                    run_id = response.json()["id"]
                    ids.append(run_id)
                    if follow:
                        followers.start_soon(_follow, client, run_id)

            sys0, cpu0, wall0 = proc_system_seconds(pid), proc_cpu_seconds(pid), time.perf_counter()
            start = wall0
            disk0 = proc_written_bytes(pid)
            switches0 = proc_context_switches(pid)
            async with anyio.create_task_group() as tg:
                for _ in range(clients):
                    tg.start_soon(submitter)
        if not follow:
            await _all_ended(client)
        wall = time.perf_counter() - wall0
        cpu = proc_cpu_seconds(pid) - cpu0
        system = proc_system_seconds(pid)
        disk = proc_written_bytes(pid) - disk0
        switches = proc_context_switches(pid) - switches0
    phase = Phase(len(bodies), wall, cpu, submit_ms=latencies, disk_bytes=disk)
    phase.system_seconds = system - sys0
    phase.context_switches = switches
    return phase, ids


def _stored(store: Path, ids: Sequence[str]) -> tuple[dict[str, float], int]:
    """Events and bytes per run in the store, over ``ids``; and their model requests."""
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        conn.execute("CREATE TEMP TABLE measured (id TEXT PRIMARY KEY)")
        conn.executemany("INSERT INTO measured VALUES (?)", [(i,) for i in ids])
        events, event_bytes = conn.execute(
            "SELECT count(*), coalesce(sum(length(data)), 0) FROM events "
            "WHERE run_id IN (SELECT id FROM measured)"
        ).fetchone()
        columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        checkpoint = (  # a table of its own since issue #20; in the runs row before
            "coalesce(length(checkpoint), 0)"
            if "checkpoint" in columns
            else "coalesce((SELECT length(data) FROM run_checkpoints WHERE run = runs.cursor), 0)"
        )
        rows = conn.execute(
            f"SELECT {checkpoint}, length(request), coalesce(length(result), 0), result "
            "FROM runs WHERE id IN (SELECT id FROM measured)"
        ).fetchall()
        kinds = conn.execute(
            "SELECT type, count(*) FROM events WHERE run_id IN (SELECT id FROM measured) "
            "GROUP BY type"
        ).fetchall()
    n = max(len(ids), 1)
    requests = sum(msgspec.json.decode(r[3]).get("llm_requests", 0) for r in rows if r[3])
    figures: dict[str, float] = {
        "events_per_run": events / n,
        "event_bytes_per_run": event_bytes / n,
        "checkpoint_bytes_per_run": sum(r[0] for r in rows) / n,
        "row_bytes_per_run": sum(r[1] + r[2] for r in rows) / n,
    }
    for kind, count in kinds:
        figures[f"events.{kind}"] = count / n
    return figures, requests


# ---------------------------------------------------------------------- py-spy


@contextlib.contextmanager
def _profile(pid: int, out: Path, enabled: bool) -> Iterator[None]:
    spy = shutil.which("py-spy") if enabled else None
    if spy is None:
        yield
        return
    process = subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "250",
         "--output", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _subsystem(frames: Sequence[str]) -> str:
    files = []
    for text in frames:
        match = _FRAME.match(text.strip())
        files.append(match["file"] if match else text)
    for text, file in zip(reversed(frames), reversed(files), strict=True):  # innermost first
        normal = file.replace("\\", "/")
        if any(part in normal for part in _PASSTHROUGH) or (
            "orchestrator/daemon/app" in normal and text.strip().startswith("__call__ ")
        ):
            continue
        for prefix, name in SUBSYSTEMS:
            if normal.startswith(prefix) or f"/{prefix}" in normal:
                return name
    leaf = files[-1].replace("\\", "/") if files else ""
    for package, name in _LIBRARIES:
        if f"/{package}/" in f"/{leaf}" or f"/{package}.py" in f"/{leaf}":
            return name
    return "other"


def _grouped(samples: Path) -> dict[str, float]:
    return group_samples(samples.read_text()) if samples.exists() else {}


def group_samples(raw: str) -> dict[str, float]:
    """py-spy's raw (collapsed) stacks as the share of samples per subsystem (0–1)."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        counts[_subsystem(frames)] += int(count)
    total = sum(counts.values())
    return {name: n / total for name, n in counts.most_common()} if total else {}


# ---------------------------------------------------------------------- in-process library


async def _library(scenario_name: str, runs: int, in_flight: int, *, base_url: str | None) -> Phase:
    """``runs`` runs through the library in this process, ``in_flight`` at once."""
    model = ModelSettings(base_url=base_url) if base_url else ModelSettings()
    config = Config(model=model, runtime=RuntimeSettings(max_concurrent_runs=in_flight))
    scenario = find_scenario(scenario_name)
    async with Runtime(config) as runtime:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if base_url is None:
            handles = [await start_scenario(runtime, scenario) for _ in range(runs)]
        else:
            handles = [await runtime.start(RunSpec(task=ENDPOINT_TASK)) for _ in range(runs)]
        results = [await handle.result() for handle in handles]
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return Phase(runs, wall, cpu, model_requests=sum(r.llm_requests for r in results))


# ---------------------------------------------------------------------- one invocation


async def _daemon_phase(
    folder: Path,
    *,
    scenario: str,
    runs: int,
    warmup: int,
    in_flight: int,
    clients: int,
    follow: bool,
    profile: bool,
    base_url: str | None,
    rate: float = 0.0,
) -> tuple[Phase, dict[str, float], dict[str, float]]:
    path = Path(scenario) if scenario.endswith(".toml") else None
    config = _write_config(
        folder, runs=runs + warmup, in_flight=in_flight, base_url=base_url, scenario=path
    )
    name = path.stem if path is not None else scenario
    body: dict[str, Any] = {"scenario": name} if base_url is None else {"task": ENDPOINT_TASK}
    with serve_process(config, folder / "daemon.log") as (process, url):
        if warmup:
            await _drive(url, process.pid, [body] * warmup, clients=clients, follow=follow)
        samples = folder / "py-spy.txt"
        with _profile(process.pid, samples, profile):
            phase, ids = await _drive(
                url, process.pid, [body] * runs, clients=clients, follow=follow, rate=rate
            )
    stored, requests = _stored(folder / "daemon.db", ids)
    phase.model_requests = requests
    return phase, stored, _grouped(samples)


async def measure_daemon(
    *,
    scenario: str = "completed",
    runs: int = 1000,
    warmup: int = 50,
    in_flight: int = 32,
    clients: int = 32,
    follow: bool = False,
    profile: bool = False,
    library: bool = True,
    endpoint: bool = False,
    samples: Path | None = None,
    model_seconds: float = 0.0,
    rate: float = 0.0,
) -> DaemonFigures:
    """Every phase the options ask for (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="bench-daemon-") as tmp:
        folder = Path(tmp)
        if model_seconds:
            scenario = str(slow_scenario(folder / "scenarios", model_seconds))
        daemon, stored, grouped = await _daemon_phase(
            folder / "scenario",
            scenario=scenario,
            runs=runs,
            warmup=warmup,
            in_flight=in_flight,
            clients=clients,
            follow=follow,
            profile=profile,
            base_url=None,
            rate=rate,
        )
        if samples is not None and (folder / "scenario" / "py-spy.txt").exists():
            shutil.copy(folder / "scenario" / "py-spy.txt", samples)
        lib = None
        if library:
            await _library(scenario, warmup, in_flight, base_url=None)
            lib = await _library(scenario, runs, in_flight, base_url=None)
        name = Path(scenario).stem if scenario.endswith(".toml") else scenario
        figures = DaemonFigures(
            name, runs, in_flight, clients, follow, daemon, lib, stored, grouped
        )
        if endpoint:
            from bench.http_client import simulator_process

            slow = [scenario] if scenario.endswith(".toml") else []
            with simulator_process(slow) as base_url:
                figures.endpoint_daemon, _, figures.endpoint_subsystems = await _daemon_phase(
                    folder / "endpoint",
                    scenario=scenario,
                    runs=runs,
                    warmup=warmup,
                    in_flight=in_flight,
                    clients=clients,
                    follow=False,
                    profile=profile,
                    base_url=base_url,
                    rate=rate,
                )
                if samples is not None and (folder / "endpoint" / "py-spy.txt").exists():
                    shutil.copy(folder / "endpoint" / "py-spy.txt", f"{samples}.endpoint")
                if library:
                    await _library(scenario, warmup, in_flight, base_url=base_url)
                    figures.endpoint_library = await _library(
                        scenario, runs, in_flight, base_url=base_url
                    )
    return figures


# ---------------------------------------------------------------------- report


def report(figures: DaemonFigures, out: TextIO) -> None:
    d, lib = figures.daemon, figures.library
    follow = ", every run followed over SSE" if figures.follow else ""
    print(
        f"loopfuse serve: {figures.runs} × {figures.scenario!r}, {figures.in_flight} in flight, "
        f"{figures.clients} submitting clients{follow}",
        file=out,
    )
    print(
        f"  daemon CPU per run   {d.cpu_ms_per_run:8.2f} ms   ({d.runs_per_second:.0f} runs/s, "
        f"{d.cpu_seconds:.2f} s CPU in {d.wall_seconds:.2f} s, "
        f"{100 * d.system_seconds / max(d.cpu_seconds, 1e-9):.0f} % of it in the kernel, "
        f"{d.context_switches / max(d.runs, 1):.0f} context switches per run)",
        file=out,
    )
    if lib is not None:
        ratio = d.cpu_seconds / lib.cpu_seconds if lib.cpu_seconds else float("nan")
        print(
            f"  library, in-process  {lib.cpu_ms_per_run:8.2f} ms   daemon / library = {ratio:.2f}",
            file=out,
        )
    print(
        f"  submit latency       p50 {d.submit_percentile(0.5):.1f} ms, "
        f"p99 {d.submit_percentile(0.99):.1f} ms, max {max(d.submit_ms, default=0):.1f} ms",
        file=out,
    )
    later = d.submit_ms[figures.in_flight :]
    if len(later) >= 10:
        steady = Phase(len(later), d.wall_seconds, 0.0, submit_ms=later)
        print(
            f"    after the first {figures.in_flight} (that many in flight): "
            f"p50 {steady.submit_percentile(0.5):.1f} ms, "
            f"p99 {steady.submit_percentile(0.99):.1f} ms ({len(later)} submissions)",
            file=out,
        )
    s = figures.stored
    print(
        f"  written to disk      {d.disk_bytes / max(d.runs, 1) / 1024:.1f} KiB per run "
        "(/proc/<pid>/io write_bytes: WAL, checkpoints into the database, logs)",
        file=out,
    )
    print(
        f"  stored per run       {s['events_per_run']:.1f} events, "
        f"{s['event_bytes_per_run']:.0f} B of events, "
        f"{s['checkpoint_bytes_per_run']:.0f} B checkpoint, {s['row_bytes_per_run']:.0f} B "
        "request + result",
        file=out,
    )
    kinds = {k[7:]: v for k, v in s.items() if k.startswith("events.")}
    print(
        "    " + ", ".join(f"{k} {v:g}" for k, v in sorted(kinds.items(), key=lambda i: -i[1])),
        file=out,
    )
    if figures.subsystems:
        print("  daemon CPU by subsystem (py-spy, innermost loopfuse frame):", file=out)
        for name, share in figures.subsystems.items():
            print(
                f"    {name:42s} {100 * share:5.1f} %  {share * d.cpu_ms_per_run:6.2f} ms/run",
                file=out,
            )
    e, el = figures.endpoint_daemon, figures.endpoint_library
    if e is not None:
        print(
            f"  real endpoint (simulator in its own process): daemon CPU per model request "
            f"{e.cpu_us_per_request:.0f} µs ({e.model_requests} requests, "
            f"{e.cpu_ms_per_run:.2f} ms per run, {e.runs_per_second:.0f} runs/s)",
            file=out,
        )
        print(
            f"    submit latency p50 {e.submit_percentile(0.5):.1f} ms, "
            f"p99 {e.submit_percentile(0.99):.1f} ms",
            file=out,
        )
        if el is not None:
            print(
                f"    library, in-process: {el.cpu_us_per_request:.0f} µs per request "
                f"({el.cpu_ms_per_run:.2f} ms per run)",
                file=out,
            )
        for name, share in figures.endpoint_subsystems.items():
            print(
                f"    {name:42s} {100 * share:5.1f} %  "
                f"{share * e.cpu_us_per_request:6.0f} µs/request",
                file=out,
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.daemon", description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--clients", type=int, default=32, help="concurrent submitters")
    parser.add_argument("--scenario", default="completed", help="a shipped name or a file")
    parser.add_argument("--follow", action="store_true", help="follow every run over SSE")
    parser.add_argument("--profile", action="store_true", help="py-spy, grouped by subsystem")
    parser.add_argument("--no-library", action="store_true", help="skip the in-process runs")
    parser.add_argument("--endpoint", action="store_true", help="also a real endpoint")
    parser.add_argument(
        "--model-seconds",
        type=float,
        default=0.0,
        help="the model answers after this long (a copy of `completed`; runs wait, as on a "
        "real model)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="submit at this many runs/s (open loop) instead of as fast as the clients can",
    )
    parser.add_argument("--samples", type=Path, help="keep py-spy's raw samples here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    figures = anyio.run(
        lambda: measure_daemon(
            scenario=args.scenario,
            runs=args.runs,
            warmup=args.warmup,
            in_flight=args.in_flight,
            clients=args.clients,
            follow=args.follow,
            profile=args.profile,
            library=not args.no_library,
            endpoint=args.endpoint,
            samples=args.samples,
            model_seconds=args.model_seconds,
            rate=args.rate,
        )
    )
    if args.json:
        sys.stdout.write(msgspec.json.encode(figures.as_dict()).decode() + "\n")
    else:
        report(figures, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
