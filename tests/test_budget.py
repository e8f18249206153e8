"""The performance budget's logic (bench/budget.py), without running callgrind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

from bench import budget
from bench.budget import TOLERANCE, Verdict, compare, regression_message, updated

BASELINE: dict[str, dict[str, Any]] = {
    "cheap": {"unit": "turn", "instructions": 400_000},
    "daemon": {"unit": "run", "instructions": 5_000_000},
}


def test_a_rise_within_the_tolerance_passes_and_one_above_fails() -> None:
    verdicts = compare(BASELINE, {"cheap": ("turn", 440_000.0), "daemon": ("run", 5_500_001.0)})
    by_shape = {verdict.shape: verdict for verdict in verdicts}
    assert not by_shape["cheap"].over()  # +10.0 % exactly: allowed
    assert by_shape["daemon"].over()  # just over +10 %
    assert by_shape["daemon"].baseline == 5_000_000


def test_a_fall_never_fails() -> None:
    (verdict,) = compare(BASELINE, {"cheap": ("turn", 100_000.0)})
    assert not verdict.over()
    assert verdict.ratio == pytest.approx(0.25)


def test_a_shape_without_a_baseline_is_not_a_failure() -> None:
    (verdict,) = compare(BASELINE, {"peer": ("turn", 9e9)})
    assert verdict.baseline is None
    assert verdict.ratio is None
    assert not verdict.over()


def test_the_message_names_the_shape_the_figures_and_the_way_to_update() -> None:
    verdict = Verdict("peer", "turn", 660_000.0, 550_000.0)
    message = regression_message(verdict, "cpython-3.11-pure")
    assert "'peer'" in message
    assert "cpython-3.11-pure" in message
    assert "660,000 instructions per turn" in message
    assert "baseline 550,000" in message
    assert "+20.0 %" in message
    assert f"+{100 * TOLERANCE:.0f} %" in message
    assert "python -m bench.budget --update" in message
    assert "commit message" in message


def test_update_sets_the_build_s_figures_and_keeps_the_rest() -> None:
    document: dict[str, Any] = {
        "tolerance": TOLERANCE,
        "builds": {
            "cpython-3.11-pure": {"shapes": BASELINE},
            "cpython-3.11-compiled": {"shapes": {"cheap": {"unit": "turn", "instructions": 1}}},
        },
    }
    new = updated(document, "cpython-3.11-pure", {"cheap": ("turn", 412_345.6)}, commit="abc1234")
    pure = new["builds"]["cpython-3.11-pure"]
    assert pure["shapes"]["cheap"] == {"unit": "turn", "instructions": 412_346}
    assert pure["shapes"]["daemon"] == BASELINE["daemon"]  # not measured: kept
    assert pure["measured_at"] == "abc1234"
    assert new["builds"]["cpython-3.11-compiled"] == document["builds"]["cpython-3.11-compiled"]
    assert document["builds"]["cpython-3.11-pure"]["shapes"]["cheap"]["instructions"] == 400_000


def test_update_of_an_empty_file_starts_it() -> None:
    new = updated({}, "cpython-3.12-pure", {"daemon": ("run", 3.0)})
    assert new == {
        "tolerance": TOLERANCE,
        "builds": {"cpython-3.12-pure": {"shapes": {"daemon": {"unit": "run", "instructions": 3}}}},
    }


def test_the_committed_baseline_records_every_shape_for_the_pure_build() -> None:
    from bench.budget_shapes import SHAPES

    document = json.loads(budget.BASELINE.read_text())
    assert document["tolerance"] == TOLERANCE
    shapes = document["builds"][budget.build_key()]["shapes"]
    assert set(shapes) == {shape.name for shape in SHAPES}
    for shape in SHAPES:
        assert shapes[shape.name]["unit"] == shape.unit
        assert shapes[shape.name]["instructions"] > 0


def test_the_check_fails_with_the_message_and_update_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """main() end to end with the callgrind measurement replaced by fixed figures."""
    figures = {"cheap": ("turn", 480_000.0), "daemon": ("run", 5_100_000.0)}
    monkeypatch.setattr(budget, "measure", lambda names=(), python="": figures)
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/valgrind")
    path = tmp_path / "budget.json"
    path.write_text(
        json.dumps(
            updated(
                {},
                budget.build_key(),
                {name: (entry["unit"], entry["instructions"]) for name, entry in BASELINE.items()},
            )
        )
    )

    assert budget.main(["--baseline", str(path)]) == 1
    out = capsys.readouterr().out
    assert "budget exceeded: shape 'cheap'" in out
    assert "+20.0 %" in out
    assert "daemon: 5,100,000 instructions per run, baseline 5,000,000 (+2.0 %)" in out

    assert budget.main(["--baseline", str(path), "--update"]) == 0
    assert budget.main(["--baseline", str(path)]) == 0
    recorded = json.loads(path.read_text())["builds"][budget.build_key()]["shapes"]
    assert recorded["cheap"]["instructions"] == 480_000


def test_without_valgrind_the_check_says_so_and_passes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert budget.main([]) == 0
    assert "valgrind is not installed" in capsys.readouterr().out


def test_an_unknown_shape_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        budget.main(["nope"])
    assert "unknown shape nope" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["cheap", "realistic", "peer", "daemon"])
def test_each_shape_runs_and_counts_its_units(name: str) -> None:
    """The workloads the budget counts still run as they claim (no callgrind): one run."""
    from bench.budget_shapes import SHAPES

    (shape,) = [shape for shape in SHAPES if shape.name == name]
    units = anyio.run(shape.run, 1)
    assert units == {"cheap": 20, "realistic": 20, "peer": 200, "daemon": 1}[name]
