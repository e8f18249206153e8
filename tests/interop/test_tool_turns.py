"""Tool-call turns against llama-cpp-python, in both chat formats, as a user runs them:
``loopfuse run --folder`` with a config file (issue #18, items 1 and 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.interop.conftest import LlamaServer, run_loopfuse, write_config
from tests.interop.model_writer import SHORT_REPLY

pytestmark = pytest.mark.interop


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A folder with the directory a forced ``list_dir`` asks for: the model's only string,
    :data:`SHORT_REPLY`, is the ``path`` it sends."""
    root = tmp_path / "folder"
    (root / SHORT_REPLY).mkdir(parents=True)
    (root / SHORT_REPLY / "notes.txt").write_text("meeting notes\n")
    return root


def _result(done: object) -> dict[str, object]:
    assert hasattr(done, "stdout")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("server_fixture", ["llama_fc", "llama_chatml"])
@pytest.mark.parametrize("stream", [True, False])
def test_a_tool_call_turn_is_accepted_and_the_run_completes(
    server_fixture: str, stream: bool, folder: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server: LlamaServer = request.getfixturevalue(server_fixture)
    config = write_config(
        tmp_path / "loopfuse.toml",
        server,
        f'tool_choice = "list_dir"\nstream = {str(stream).lower()}\n',
    )
    mark = server.log_mark()
    done = run_loopfuse(
        "run", "--task", "List the folder.", "--folder", str(folder), "--json", config=config
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = _result(done)
    assert result["exit_reason"] == "completed"
    # the second request carried the assistant's tool-call turn and its result, and the
    # server took it (a refused turn would end the run with a model.* cause)
    assert result["llm_requests"] == 2
    calls = result["call_log"]
    assert isinstance(calls, list)
    [call] = calls
    assert call["tool"] == "list_dir"
    assert json.loads(call["arguments"]) == {"path": SHORT_REPLY}
    assert not call["is_error"]
    assert server.statuses_since(mark) == [200, 200]


def test_a_forced_tool_is_called_and_reset_to_auto_after_it(
    llama_fc: LlamaServer, folder: Path, tmp_path: Path
) -> None:
    # reset_tool_choice = false: every request forces list_dir, so the model never answers
    config = write_config(
        tmp_path / "forced.toml",
        llama_fc,
        'tool_choice = "list_dir"\nreset_tool_choice = false\n[budget]\nmax_turns = 4\n',
    )
    done = run_loopfuse("run", "--task", "List.", "--folder", str(folder), "--json", config=config)
    result = _result(done)
    assert done.returncode == 1, done.stderr
    assert result["exit_reason"] != "completed"
    tools = [call["tool"] for call in result["call_log"]]  # type: ignore[attr-defined]
    assert len(tools) >= 3
    assert set(tools) == {"list_dir"}


def test_a_models_own_tool_choice_overrides_the_model_sections(
    llama_chatml: LlamaServer, folder: Path, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "per_model.toml",
        llama_chatml,
        f'tool_choice = "list_dir"\n[models."{llama_chatml.model_id}"]\n'
        'tool_choice = "read_file"\n',
    )
    done = run_loopfuse("run", "--task", "Read.", "--folder", str(folder), "--json", config=config)
    result = _result(done)
    assert [c["tool"] for c in result["call_log"]][:1] == ["read_file"], done.stderr  # type: ignore[attr-defined]


def test_tool_choice_none_gets_a_plain_answer(
    llama_fc: LlamaServer, folder: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "none.toml", llama_fc, 'tool_choice = "none"\n')
    done = run_loopfuse("run", "--task", "Hi.", "--folder", str(folder), "--json", config=config)
    assert done.returncode == 0, done.stderr
    result = _result(done)
    assert result["tool_calls"] == 0
    assert result["output"] == SHORT_REPLY
