"""deploy/: Prometheus config and alert rules (promtool), the Grafana dashboard and its
provisioning, docker compose, the Dockerfile, the systemd unit, the Kubernetes manifests
and the README that documents them. Static checks; the live ones are in
``test_deploy_prometheus.py``."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Final

import pytest

from bus import Bus
from orchestrator.config import Config, load_config
from orchestrator.metrics import MetricsRecorder, new_registry

ROOT: Final = Path(__file__).resolve().parent.parent
DEPLOY: Final = ROOT / "deploy"
DASHBOARD: Final = DEPLOY / "grafana" / "dashboards" / "loopfuse.json"
PROMTOOL: Final = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install -y prometheus)"
)

ROWS: Final = (
    "Runs and exit reasons",
    "Fuses",
    "Model and tokens",
    "Tools",
    "Context",
    "The daemon itself",
)
METRIC_NAME: Final = re.compile(r"\b((?:loopfuse|process)_[a-z0-9_]+)\b")


def text(relative: str) -> str:
    return (DEPLOY / relative).read_text(encoding="utf-8")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def exposed_names() -> set[str]:
    """Every sample name a runtime's registry exposes (``_total``, ``_bucket`` …), also for
    families that have no sample yet (mailboxes of subscribers not started)."""
    registry = new_registry()
    MetricsRecorder(Bus(), registry, models=("m",), tools=("read_file",))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)  # as prose names a histogram
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names | daemon_names()


def daemon_names() -> set[str]:
    """The daemon collector's series (``loopfuse_daemon_*``), read from its source."""
    source = (ROOT / "orchestrator" / "daemon" / "metrics.py").read_text(encoding="utf-8")
    found = re.findall(r'_(counter|gauge)\(\s*"(\w+)"', source)
    assert found, "the daemon's metric names moved; update this reader"
    return {
        f"loopfuse_daemon_{name}" + ("_total" if kind == "counter" else "") for kind, name in found
    }


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=DEPLOY / "prometheus", capture_output=True, text=True, check=False
    )


# --------------------------------------------------------------------------- prometheus


@needs_promtool
def test_the_scrape_config_is_valid() -> None:
    result = promtool("check", "config", "--lint=all", "--lint-fatal", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_the_alert_rules_are_valid() -> None:
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 8 rules found" in result.stdout


@needs_promtool
def test_the_alert_rules_pass_their_unit_tests() -> None:
    result = promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def alert_blocks() -> dict[str, str]:
    parts = re.split(r"\n\s*- alert: ", text("prometheus/alerts.yml"))[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts}


def test_every_alert_says_what_happened_and_what_to_do() -> None:
    blocks = alert_blocks()
    assert set(blocks) == {
        "LoopfuseDown",
        "LoopfuseLoopStops",
        "LoopfuseBudgetStops",
        "LoopfuseModelErrors",
        "LoopfuseInternalErrors",
        "LoopfuseQueueFull",
        "LoopfuseStoreSlow",
        "LoopfuseMetricsDropping",
    }
    for name, block in blocks.items():
        for key in ("severity:", "summary:", "description:", "runbook:"):
            assert key in block, f"{name} has no {key}"
    tests = text("prometheus/alerts_test.yml")
    for name in blocks:
        assert f"alertname: {name}" in tests, f"{name} has no promtool unit test"


def test_loop_and_budget_alerts_watch_different_things() -> None:
    blocks = alert_blocks()
    assert "loopfuse_loop_detections_total" in blocks["LoopfuseLoopStops"]
    assert 'exit_reason="max_turns"' in blocks["LoopfuseBudgetStops"]
    budget_expr = blocks["LoopfuseBudgetStops"].split("expr:", 1)[1].split("for:")[0]
    assert "loop_detections" not in budget_expr
    assert "hook_stopped" not in budget_expr
    assert "capacity problem" in blocks["LoopfuseBudgetStops"]
    assert "prompt or tool problem" in blocks["LoopfuseLoopStops"]


# --------------------------------------------------------------------------- grafana


def test_the_dashboard_has_a_datasource_variable_and_uses_it_everywhere() -> None:
    board = dashboard()
    assert "__inputs" not in board
    assert board["uid"] == "loopfuse-overview"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}"
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel.get("description"), f"panel {panel['title']!r} has no description"
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_the_dashboard_has_one_row_per_topic_each_with_panels() -> None:
    panels = dashboard()["panels"]
    rows = [panel["title"] for panel in panels if panel["type"] == "row"]
    assert tuple(rows) == ROWS
    counts: dict[str, int] = {}
    current = ""
    for panel in panels:
        if panel["type"] == "row":
            current = panel["title"]
            counts[current] = 0
        else:
            counts[current] += 1
    assert all(count >= 2 for count in counts.values()), counts


def test_the_dashboard_layout_is_consistent() -> None:
    panels = dashboard()["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps another panel"
                cells.add((x, y))


def test_every_metric_the_dashboard_and_alerts_use_is_exposed() -> None:
    exposed = exposed_names()
    sources = {
        "dashboard": DASHBOARD.read_text(encoding="utf-8"),
        "alerts": text("prometheus/alerts.yml"),
    }
    for source, content in sources.items():
        used = set(METRIC_NAME.findall(content))
        assert used, source
        missing = sorted(name for name in used if name not in exposed)
        assert missing == [], f"{source} uses metrics loopfuse does not expose"


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus() -> None:
    datasource = text("grafana/provisioning/datasources/prometheus.yaml")
    assert "type: prometheus" in datasource
    assert "url: http://prometheus:9090" in datasource
    assert "uid: prometheus" in datasource
    dashboards = text("grafana/provisioning/dashboards/loopfuse.yaml")
    assert "type: file" in dashboards
    path = re.search(r"path: (\S+)", dashboards)
    assert path is not None
    compose = text("docker-compose.yml")
    assert f"./grafana/dashboards:{path[1]}:ro" in compose
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in compose


# --------------------------------------------------------------------------- compose


def test_compose_mounts_files_that_exist_and_configures_valid_keys() -> None:
    compose = text("docker-compose.yml")
    for service in ("loopfuse:", "simulator:", "prometheus:", "grafana:"):
        assert f"\n  {service}" in compose
    for source in re.findall(r"- \./([\w./-]+):", compose):
        assert (DEPLOY / source).exists(), source
    dockerfile = re.search(r"dockerfile: (\S+)", compose)
    assert dockerfile is not None
    assert (ROOT / dockerfile[1]).is_file()
    environ = dict(re.findall(r"(LOOPFUSE_[A-Z_]+): \"?([^\"\n]+)\"?", compose))
    config = load_config(environ=environ)
    assert config.model.base_url == "http://simulator:8400/v1"
    port = config.daemon.port
    assert f'targets: ["loopfuse:{port}"]' in text("prometheus/prometheus.yml")
    assert "loopfuse" in config.daemon.allowed_hosts  # the Host Prometheus sends is served
    assert f'"{port}:{port}"' in compose
    assert '"--port", "8400"' in compose


def yaml_documents(relative: str) -> list[Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    return [doc for doc in yaml.safe_load_all(text(relative)) if doc is not None]


@pytest.mark.parametrize(
    "relative",
    [
        "docker-compose.yml",
        "grafana/provisioning/datasources/prometheus.yaml",
        "grafana/provisioning/dashboards/loopfuse.yaml",
        "k8s/configmap.yaml",
        "k8s/deployment.yaml",
        "k8s/service.yaml",
        "k8s/servicemonitor.yaml",
        "k8s/kustomization.yaml",
    ],
)
def test_yaml_files_parse(relative: str) -> None:
    documents = yaml_documents(relative)
    assert documents
    if relative.startswith("k8s/"):
        for document in documents:
            assert document["apiVersion"]
            assert document["kind"]
            if document["kind"] != "Kustomization":
                assert document["metadata"]["name"] == "loopfuse"
    if relative == "docker-compose.yml":
        services = documents[0]["services"]
        assert set(services) == {"loopfuse", "simulator", "prometheus", "grafana"}
        assert all("image" in service or "build" in service for service in services.values())


# --------------------------------------------------------------------------- Dockerfile


def test_the_image_is_small_and_runs_as_a_non_root_user() -> None:
    dockerfile = text("Dockerfile")
    stages = re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)
    assert len(stages) == 2, "a build stage and a slim run stage"
    assert all(image.startswith("python:3.11-slim") for image in stages)
    users = re.findall(r"^USER (\S+)", dockerfile, re.MULTILINE)
    assert users
    assert users[-1].split(":")[0] not in ("0", "root")
    assert "HEALTHCHECK" in dockerfile
    assert "/healthz" in dockerfile
    assert re.search(r"^EXPOSE 8470$", dockerfile, re.MULTILINE)
    assert 'ENTRYPOINT ["loopfuse"]' in dockerfile
    for directory in re.findall(r"^COPY (\w+) \./", dockerfile, re.MULTILINE):
        assert (ROOT / directory).is_dir(), directory
    environ = dict(re.findall(r"(LOOPFUSE_[A-Z_]+)=(\S+)", dockerfile))
    assert load_config(environ=environ).daemon.host == "0.0.0.0"
    ignored = text("Dockerfile.dockerignore")
    assert "**/.venv" in ignored


# --------------------------------------------------------------------------- systemd


def test_the_systemd_unit_restarts_on_failure_and_stops_gracefully() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(text("systemd/loopfuse.service"))
    service = unit["Service"]
    assert service["Type"] == "exec"
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"
    assert service["User"] == "loopfuse"
    assert service["ExecStart"].endswith("loopfuse serve")
    drain = Config().daemon.drain_seconds
    assert float(service["TimeoutStopSec"]) > drain + 10  # drain, then flush the store
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    environ = dict(
        line.split("=", 1) for line in [service["Environment"]] if line.startswith("LOOPFUSE_")
    )
    load_config(environ=environ)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_every_key_of_the_unit() -> None:
    result = subprocess.run(
        ["systemd-analyze", "verify", str(DEPLOY / "systemd" / "loopfuse.service")],
        capture_output=True,
        text=True,
        check=False,
    )
    output = result.stdout + result.stderr
    # The binary and user do not exist here; anything else it reports is a mistake.
    problems = [
        line
        for line in output.splitlines()
        if line.strip() and "is not executable" not in line and "loopfuse" in line
    ]
    assert problems == []


# --------------------------------------------------------------------------- kubernetes


def test_the_kubernetes_manifests_fit_together() -> None:
    deployment = text("k8s/deployment.yaml")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert f"{probe}:" in deployment
    assert "path: /healthz" in deployment
    assert "path: /readyz" in deployment
    assert "runAsNonRoot: true" in deployment
    assert "terminationGracePeriodSeconds: 45" in deployment
    service = text("k8s/service.yaml")
    assert "name: http" in service
    monitor = text("k8s/servicemonitor.yaml")
    assert "kind: ServiceMonitor" in monitor
    assert "port: http" in monitor
    assert "path: /metrics" in monitor
    kustomization = text("k8s/kustomization.yaml")
    for resource in re.findall(r"^  - (\S+)$", kustomization, re.MULTILINE):
        assert (DEPLOY / "k8s" / resource).is_file(), resource


def test_the_configmap_holds_a_valid_config(tmp_path: Path) -> None:
    configmap = text("k8s/configmap.yaml")
    body = configmap.split("loopfuse.toml: |\n", 1)[1]
    toml = "\n".join(line[4:] for line in body.splitlines())
    path = tmp_path / "loopfuse.toml"
    path.write_text(toml, encoding="utf-8")
    config = load_config(path, environ={})
    assert config.daemon.host == "0.0.0.0"
    assert config.daemon.port == 8470
    assert "mountPath: /etc/loopfuse" in text("k8s/deployment.yaml")
    assert "value: /etc/loopfuse/loopfuse.toml" in text("k8s/deployment.yaml")


# --------------------------------------------------------------------------- docs


def test_the_readme_documents_every_deploy_file() -> None:
    readme = text("README.md")
    files = sorted(
        str(path.relative_to(DEPLOY))
        for path in DEPLOY.rglob("*")
        if path.is_file() and path.name != "README.md"
    )
    assert files
    missing = [name for name in files if f"`{name}`" not in readme]
    assert missing == []


def test_docs_describe_every_metric() -> None:
    docs = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    registry = new_registry(process=False)
    MetricsRecorder(Bus(), registry)
    for family in registry.collect():
        if family.name.startswith("loopfuse_"):
            shown = family.name + ("_total" if family.type == "counter" else "")
            assert f"`{shown}`" in docs, shown
