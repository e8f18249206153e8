"""The progress reporter's events, against its rules written plainly, on random runs of
random plans (stages entered in any order, unknown stages, runs ending anywhere)."""

from __future__ import annotations

import random

import pytest

from actors.progress.reporter import ProgressReporter
from bus import ExitReason, Progress, RunEnding, RunStarted, TurnStarted
from tests.published import Published, feed
from tests.started import run_started


def _position(stages: tuple[str, ...], stage: str) -> int:
    return stages.index(stage) + 1 if stage in stages else len(stages)


def _progress(
    run_id: str, stages: tuple[str, ...], stage: str, status: str, detail: str, turn: int = 0
) -> Progress:
    index = _position(stages, stage)
    if status in ("finished", "skipped") and stage == stages[-1]:
        index = len(stages)
    return Progress(
        run_id=run_id,
        stage=stage,
        index=index,
        total=len(stages),
        status=status,  # type: ignore[arg-type]
        detail=detail,
        turn=turn,
    )


def expected(messages: list[RunStarted | TurnStarted | RunEnding]) -> list[Progress]:
    """The events the reporter publishes for ``messages``, from its documented rules."""
    plans: dict[str, tuple[tuple[str, ...], str, int]] = {}  # stages, current, max_turns
    out: list[Progress] = []
    for msg in messages:
        if isinstance(msg, RunStarted):
            stages = msg.plan or (msg.stage,)
            plans[msg.run_id] = (stages, msg.stage, msg.max_turns)
            out.append(_progress(msg.run_id, stages, msg.stage, "started", "run started"))
        elif isinstance(msg, TurnStarted):
            if msg.run_id not in plans:
                continue
            stages, _, max_turns = plans[msg.run_id]
            plans[msg.run_id] = (stages, msg.stage, max_turns)
            limit = f" of at most {max_turns}" if max_turns else ""
            detail = f"turn {msg.turn}{limit}"
            out.append(_progress(msg.run_id, stages, msg.stage, "running", detail, msg.turn))
        else:
            if msg.run_id not in plans:
                continue
            stages, current, _ = plans.pop(msg.run_id)
            done = f"{msg.exit_reason.value} ({msg.cause})"
            out.append(_progress(msg.run_id, stages, current, "finished", done))
            for stage in stages[_position(stages, current) :]:
                out.append(_progress(msg.run_id, stages, stage, "skipped", "not reached"))
    return out


def random_messages(rng: random.Random) -> list[RunStarted | TurnStarted | RunEnding]:
    names = ("plan", "draft", "review", "agent", "extra")
    messages: list[RunStarted | TurnStarted | RunEnding] = []
    for step in range(200):
        run_id = f"r{rng.randrange(4)}"
        action = rng.random()
        if action < 0.1:
            plan = tuple(rng.sample(names[:4], rng.randint(0, 3)))
            messages.append(
                run_started(
                    run_id=run_id,
                    trace_id="t",
                    task="x",
                    model="m",
                    stage=rng.choice(names),
                    plan=plan,
                    max_turns=rng.choice((0, 5, 20)),
                )
            )
        elif action < 0.2:
            messages.append(
                RunEnding(run_id=run_id, exit_reason=rng.choice(list(ExitReason)), cause="c.x")
            )
        else:
            stage = rng.choice(names)
            messages.append(TurnStarted(run_id=run_id, turn=step, stage=stage, prompt_messages=1))
    return messages


@pytest.mark.parametrize("seed", range(20))
def test_progress_follows_the_rules_on_random_runs(seed: int) -> None:
    messages = random_messages(random.Random(seed))
    published = Published()
    feed(ProgressReporter(published.bus).handlers(), *messages)
    assert published.messages == expected(messages)


def test_a_stage_plan_is_reported_with_its_denominator_and_skips() -> None:
    published = Published()
    plan = ("plan", "draft", "review")
    feed(
        ProgressReporter(published.bus).handlers(),
        run_started(run_id="r", trace_id="t", task="x", model="m", stage="plan", plan=plan),
        TurnStarted(run_id="r", turn=1, stage="plan", prompt_messages=1),
        TurnStarted(run_id="r", turn=2, stage="draft", prompt_messages=1),
        RunEnding(run_id="r", exit_reason=ExitReason.MAX_TURNS, cause="c"),
    )
    progress = [msg for msg in published.messages if isinstance(msg, Progress)]
    assert len(progress) == len(published.messages)
    assert [(p.stage, p.index, p.total, p.status) for p in progress] == [
        ("plan", 1, 3, "started"),
        ("plan", 1, 3, "running"),
        ("draft", 2, 3, "running"),
        ("draft", 2, 3, "finished"),
        ("review", 3, 3, "skipped"),
    ]
