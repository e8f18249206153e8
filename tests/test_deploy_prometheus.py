"""The metrics against a real Prometheus: the daemon serves on loopback, the demo scenarios
are submitted through its API, a Prometheus (Debian's ``prometheus``) scrapes its
``/metrics`` every second, and every PromQL expression of the dashboard and of the alert
rules is evaluated through Prometheus's HTTP API.

Skipped, with the reason, only where the ``prometheus`` binary is not installed
(``apt-get install -y prometheus`` provides it and ``promtool``).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import anyio
import pytest

from orchestrator.config import Config, DaemonSettings, ModelPrice
from orchestrator.daemon import open_daemon
from orchestrator.daemon.client import DaemonClient
from orchestrator.sim import parse_scenario, shipped_scenarios
from tests.daemon_support import wait_ended

ROOT: Final = Path(__file__).resolve().parent.parent
DASHBOARD: Final = ROOT / "deploy" / "grafana" / "dashboards" / "loopfuse.json"
ALERTS: Final = ROOT / "deploy" / "prometheus" / "alerts.yml"
PROMETHEUS: Final = shutil.which("prometheus")
PROMTOOL: Final = shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="Prometheus is not installed (Debian: apt-get install -y prometheus)",
)

# Grafana's variables as the test evaluates them: every instance and model, a rate window
# that spans the demo at a 1 s scrape interval.
VARIABLES: Final = {
    "$__rate_interval": "1m",
    "$__range": "5m",
    "$instance": ".*",
    "$model": ".*",
}

# Panels whose series wait for features other engineers are building: each must parse and
# evaluate, but may hold only zeros (or nothing) after the demo. The rest must show data.
WAITING: Final = {
    "Collapses, compactions, blocked requests": "the context gatekeeper in the runtime",
    "Dropped messages": "nothing is dropped in a healthy run",
    "Runs active": "every run has ended when the test looks",
    "Runs queued": "every run has ended when the test looks",
    "Slots in use": "every run has ended when the test looks",
    "Mailbox depth by subscriber": "mailboxes are empty when idle",
}


# A model that fails once, then answers: the demo's model errors are otherwise a race (a
# deadline can cut a call before or after it fails). It has a price, so spend shows.
FLAKY: Final = parse_scenario(
    """
task = "Answer once the endpoint recovers."
[[steps]]
text = "Recovered."
faults = [{ status = 503 }]
[expect]
exit_reason = "completed"
""",
    source="flaky.toml",
    name="flaky",
)


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port: int = sock.getsockname()[1]
        return port


class PrometheusApi:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    async def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        return await anyio.to_thread.run_sync(self._get, path, params)

    async def query(self, expr: str) -> dict[str, Any]:
        """The answer to an instant query (``status`` is ``success`` or ``error``)."""
        try:
            body: dict[str, Any] = await self.get("/api/v1/query", {"query": expr})
        except urllib.error.HTTPError as exc:  # a parse error is a 400 with a JSON body
            body = json.loads(exc.read())
        return body

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    async def ready(self) -> bool:
        return await anyio.to_thread.run_sync(self._ready)


@contextlib.asynccontextmanager
async def open_prometheus(tmp: Path, target_port: int) -> AsyncIterator[PrometheusApi]:
    """A real Prometheus scraping ``127.0.0.1:target_port`` every second, with the alert
    rules of deploy/prometheus loaded, on a free loopback port."""
    assert PROMETHEUS is not None
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  evaluation_interval: 1s\n"
        f"rule_files: ['{ALERTS}']\n"
        "scrape_configs:\n"
        "  - job_name: loopfuse\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n",
        encoding="utf-8",
    )
    port = free_port()
    command = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--enable-feature=exemplar-storage",
        "--log.level=warn",
    ]
    log = (tmp / "prometheus.log").open("wb")
    with log:
        process = await anyio.open_process(command, stdout=log, stderr=subprocess.STDOUT)
        api = PrometheusApi(port)
        try:
            with anyio.fail_after(30):
                while not await api.ready():
                    assert process.returncode is None, (tmp / "prometheus.log").read_text()
                    await anyio.sleep(0.1)
            yield api
        finally:
            process.terminate()
            with anyio.move_on_after(10, shield=True):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


async def wait_for(
    api: PrometheusApi, expr: str, ok: Callable[[list[dict[str, Any]]], bool], seconds: float
) -> list[dict[str, Any]]:
    """Poll ``expr`` until ``ok`` holds for its result (bounded by ``seconds``)."""
    with anyio.fail_after(seconds):
        while True:
            body = await api.query(expr)
            assert body["status"] == "success", (expr, body)
            result: list[dict[str, Any]] = body["data"]["result"]
            if ok(result):
                return result
            await anyio.sleep(0.25)


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, expression with Grafana's variables substituted) for every target."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    targets = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"unknown variable in {panel['title']!r}: {expr}"
            targets.append((panel["title"], expr))
    return targets


def alert_expressions() -> list[tuple[str, str]]:
    """(alert name, expression) from alerts.yml, read without a YAML library: each rule is
    ``- alert: NAME`` then ``expr:`` either inline or as a ``|`` block."""
    lines = ALERTS.read_text(encoding="utf-8").splitlines()
    found: list[tuple[str, str]] = []
    name = ""
    index = 0
    while index < len(lines):
        line = lines[index]
        if match := re.match(r"\s*- alert: (\S+)", line):
            name = match[1]
        elif match := re.match(r"(\s*)expr: (.*)$", line):
            indent, rest = len(match[1]), match[2].strip()
            if rest == "|":
                block = []
                index += 1
                while index < len(lines) and (
                    not lines[index].strip()
                    or len(lines[index]) - len(lines[index].lstrip()) > indent
                ):
                    block.append(lines[index].strip())
                    index += 1
                found.append((name, " ".join(part for part in block if part)))
                continue
            found.append((name, rest))
        index += 1
    return found


def has_value(result: list[dict[str, Any]]) -> bool:
    """At least one series with a finite, non-zero value."""
    for series in result:
        number = float(series["value"][1])
        if math.isfinite(number) and number != 0:
            return True
    return False


@pytest.mark.asyncio
async def test_dashboard_and_alerts_against_a_real_prometheus(tmp_path: Path) -> None:
    single = [s for s in shipped_scenarios() if s.pipeline is None]  # one run each
    names = [scenario.name for scenario in (*single, FLAKY)]
    config = Config(
        daemon=DaemonSettings(store_path=str(tmp_path / "daemon.db"), port=0),
        prices={"flaky": ModelPrice(input_per_million=3.0, output_per_million=15.0)},
    )
    async with (
        open_daemon(config, scenarios=[FLAKY]) as daemon,
        DaemonClient(daemon.url) as client,
        open_prometheus(tmp_path, daemon.port) as prometheus,
    ):
        await wait_for(prometheus, 'up{job="loopfuse"} == 1', bool, 30)
        with anyio.fail_after(120):
            accepted = [await client.submit({"scenario": name}) for name in names]
            for run in accepted:
                await wait_ended(client, run["id"])
        # Wait until Prometheus has scraped the final counts (a bounded poll).
        finished = f"sum(loopfuse_runs_finished_total) == {len(names)}"
        await wait_for(prometheus, finished, bool, 30)

        failures = []
        shows_data: dict[str, bool] = {}
        for title, expr in dashboard_targets():
            body = await prometheus.query(expr)
            if body["status"] != "success":
                failures.append(f"{title}: {expr}: {body.get('error')}")
                continue
            shows_data[title] = shows_data.get(title, False) or has_value(body["data"]["result"])
        assert failures == []
        assert len(shows_data) > 30
        empty = [title for title, ok in shows_data.items() if not ok and title not in WAITING]
        assert empty == [], "dashboard panels without data after the demo"
        assert set(WAITING) <= set(shows_data)

        alerts = alert_expressions()
        assert len(alerts) == 8
        for name, expr in alerts:
            body = await prometheus.query(expr)
            assert body["status"] == "success", (name, expr, body.get("error"))

        # Every rule is loaded and evaluates without error; none fires on a healthy demo
        # except those the demo's own stops can trip (loops, budgets: too few runs).
        rules = await prometheus.get("/api/v1/rules")
        loaded = [rule for group in rules["data"]["groups"] for rule in group["rules"]]
        assert {rule["name"] for rule in loaded} == {name for name, _ in alerts}
        assert {rule["health"] for rule in loaded} <= {"ok", "unknown"}
        with anyio.fail_after(15):
            while {rule["health"] for rule in loaded} != {"ok"}:
                await anyio.sleep(0.25)
                rules = await prometheus.get("/api/v1/rules")
                loaded = [rule for group in rules["data"]["groups"] for rule in group["rules"]]
        assert all(rule.get("lastError", "") == "" for rule in loaded)
        firing = {rule["name"] for rule in loaded if rule.get("state") == "firing"}
        assert "LoopfuseDown" not in firing
        assert "LoopfuseMetricsDropping" not in firing

        # Run ids travel as exemplars (OpenMetrics), never as labels.
        exemplars = await prometheus.get(
            "/api/v1/query_exemplars",
            {"query": "loopfuse_runs_finished_total", "start": "0", "end": "9999999999"},
        )
        run_ids = {
            exemplar["labels"].get("run_id")
            for series in exemplars["data"]
            for exemplar in series["exemplars"]
        }
        assert run_ids
        assert None not in run_ids
        series = await prometheus.get("/api/v1/labels")
        assert "run_id" not in series["data"]

        # What the daemon serves in the text format lints clean.
        text = (await client.metrics()).encode()
        assert "# EOF" not in text.decode()  # not OpenMetrics
        lint = await anyio.run_process(
            [PROMTOOL or "promtool", "check", "metrics"], input=text, check=False
        )
        assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
