"""``python -m bench.waste --real`` (issue #29): its failure path needs no model server
(the table itself is exercised by the real-model tier, ``scripts/realmodel``)."""

from __future__ import annotations

import io
import sys

import pytest

from bench.waste import main


def test_real_without_the_model_says_what_to_run_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INTEROP_LLAMA_PYTHON", sys.executable)  # a python without the model
    out = io.StringIO()
    assert main(["--real"], out=out) == 2
    err = capsys.readouterr().err
    assert "scripts/realmodel" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert out.getvalue() == ""


def test_real_takes_no_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--real", "dead_loop"], out=io.StringIO()) == 2
    assert "--real takes no SCENARIO" in capsys.readouterr().err
