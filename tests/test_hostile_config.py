"""Hostile configuration: every invalid file or environment value is refused at start,
naming the key and the reason (table-driven over every section)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.errors import ConfigError

# (TOML text, the key the error must name, a word the reason must contain)
BAD_FILES = [
    ("[model]\ntimeout_seconds = 0", "model.timeout_seconds", ">"),
    ("[model]\nmax_attempts = -1", "model.max_attempts", ">"),
    ("[model]\nbase_url = 5", "model.base_url", "str"),
    ("[model]\nbackoff_base_seconds = -0.5", "model.backoff_base_seconds", ">="),
    ("[model]\nmystery = 1", "model.mystery", "unknown"),
    ("[budget]\nmax_turns = 0", "budget.max_turns", ">"),
    ("[budget]\nmax_turns = 'ten'", "budget.max_turns", "int"),
    ("[budget]\ndeadline_seconds = -1.0", "budget.deadline_seconds", ">"),
    ("[budget]\nmode = 'loose'", "budget.mode", "loose"),
    ("[budget]\non_stop = 'panic'", "budget.on_stop", "panic"),
    ("[tools]\ntimeout_seconds = 0", "tools.timeout_seconds", ">"),
    ("[tools]\nenabled = 'read_file'", "tools.enabled", "array"),
    ("[tools]\nmax_cache_hits = -3", "tools.max_cache_hits", ">="),
    ("[loop]\npreset = 'paranoid'", "loop.preset", "paranoid"),
    ("[runtime]\nmax_concurrent_runs = 0", "runtime.max_concurrent_runs", ">"),
    ("[context]\ncollapse_at = 1.5", "context.collapse_at", "<="),
    ("[context]\nsilent_truncation_ratio = 1", "context.silent_truncation_ratio", "<"),
    ("[context.windows]\ngpt = -5", "context.windows", "at least 1"),
    ('[prices."gpt-x"]\ninput_per_million = -1\noutput_per_million = 1', 'prices."gpt-x"', ">="),
    ('[prices."gpt-x"]\ninput_per_million = 1', 'prices."gpt-x"', "output_per_million"),
    ("[daemon]\nport = 70000", "daemon.port", "<="),
    ("[daemon]\nqueue_size = -1", "daemon.queue_size", ">="),
    ("[daemon]\non_crash = 'explode'", "daemon.on_crash", "explode"),
    ("[daemon]\nheartbeat_seconds = 0", "daemon.heartbeat_seconds", ">"),
    ("[daemon]\nmax_body_bytes = 0", "daemon.max_body_bytes", ">"),
    ("log_level = 'loud'", "log_level", "loud"),
    ("hooks = 'not a list'", "hooks", "array"),
    ("[[hooks]]\nevent = 'never'", "hooks", ""),
    ("[nonsense]\nx = 1", "nonsense", "unknown"),
    ("model = 'a string, not a table'", "model", "object"),
    ("[model\nbroken", "(file)", "TOML"),
]


@pytest.mark.parametrize(("text", "key", "word"), BAD_FILES, ids=[k for _, k, _ in BAD_FILES])
def test_every_invalid_file_value_is_refused_with_its_key_and_reason(
    tmp_path: Path, text: str, key: str, word: str
) -> None:
    path = tmp_path / "loopfuse.toml"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    error = info.value
    assert error.key.startswith(key), (error.key, str(error))
    assert error.reason
    assert word.lower() in error.reason.lower(), error.reason
    assert error.source == str(path)
    assert key.split(".")[0].strip('"') in str(error)


BAD_ENV = [
    ("LOOPFUSE_MODEL__TIMEOUT_SECONDS", "0", "model.timeout_seconds"),
    ("LOOPFUSE_MODEL__MAX_ATTEMPTS", "many", "model.max_attempts"),
    ("LOOPFUSE_BUDGET__MAX_TURNS", "-2", "budget.max_turns"),
    ("LOOPFUSE_BUDGET__MODE", "loose", "budget.mode"),
    ("LOOPFUSE_TOOLS__TIMEOUT_SECONDS", "soon", "tools.timeout_seconds"),
    ("LOOPFUSE_LOOP__PRESET", "paranoid", "loop.preset"),
    ("LOOPFUSE_RUNTIME__MAX_CONCURRENT_RUNS", "0", "runtime.max_concurrent_runs"),
    ("LOOPFUSE_CONTEXT__COLLAPSE_AT", "2", "context.collapse_at"),
    ("LOOPFUSE_DAEMON__PORT", "-1", "daemon.port"),
    ("LOOPFUSE_DAEMON__ON_CRASH", "explode", "daemon.on_crash"),
    ("LOOPFUSE_LOG_LEVEL", "loud", "log_level"),
    ("LOOPFUSE_NO_SUCH_SECTION__KEY", "1", "no_such_section"),
    ("LOOPFUSE_MODEL__", "1", "LOOPFUSE_MODEL__"),
    ("LOOPFUSE_MODEL__BASE_URL__X", "1", "model.base_url"),
]


@pytest.mark.parametrize(("name", "value", "key"), BAD_ENV, ids=[n for n, _, _ in BAD_ENV])
def test_every_invalid_environment_value_is_refused_with_its_key_and_reason(
    name: str, value: str, key: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={name: value})
    assert info.value.key.lower().startswith(key.lower()), (info.value.key, str(info.value))
    assert info.value.reason


@pytest.mark.parametrize(
    ("text", "env"),
    [("[budget]\nmax_turns = 0\n", {}), ("", {"LOOPFUSE_DAEMON__ON_CRASH": "explode"})],
)
def test_serve_refuses_to_start_on_a_bad_config(
    tmp_path: Path, text: str, env: dict[str, str]
) -> None:
    path = tmp_path / "loopfuse.toml"
    path.write_text(text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "serve", "--config", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
        check=False,
    )
    assert done.returncode != 0
    key = "budget.max_turns" if text else "daemon.on_crash"
    assert key in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
