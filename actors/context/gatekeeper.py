"""The context gatekeeper: no request goes out that cannot fit the model's context window.

It answers (``answers=True``, only with :meth:`Bus.publish_nowait`):

* ``TurnStarted``: the turn's new tool results are first cut to take together at most
  ``tool_result_share`` of the room the run's fixed prompt leaves (a ``collapse`` whose
  folds keep each result's head); past ``collapse_at`` of the limit, old answered tool
  results are folded (``ContextAction(collapse)``); past the limit,
  ``ContextAction(blocked)`` and a ``blocking_limit`` stop: the request is never sent.
* ``PromptRejected``: a collapse of every answered tool result, then a compaction
  (``ContextAction(compact)``), then a ``prompt_too_long`` stop; a step that changes
  nothing is skipped.
* ``ModelRequest``: what was sent joins the ledger. ``ModelReplied``: the reported prompt
  tokens calibrate the model's ratio, or far below the estimate are flagged
  (``ContextAction(silent_truncation)``).

Each run's first check says how its tokens are counted (``ContextAction(counting)``, again
when that changes). With an operator's endpoint (``server``), each model's first run asks
the server once for its window and its tokenizer's count of a sample
(:mod:`actors.context.server`). Runs without a policy are not watched. How and why:
``docs/context.md``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import anyio
from anyio.abc import TaskStatus

from actors.context import (
    SUMMARY_NUDGE_KIND,
    Calibration,
    ContextPolicy,
    Estimate,
    Estimator,
    PromptLedger,
    Span,
    TextCounter,
    plan_collapse,
    plan_compaction,
    turns_text,
)
from actors.context.calibration import HIGH
from actors.context.cutting import NOTE_CHARS, cut_result, next_offset
from actors.context.probing import ServerProbes
from actors.context.server import ServerEndpoint, ServerReport
from bus import (
    NUDGE_MARKER,
    Bus,
    ChatMessage,
    ContextAction,
    ContextActionKind,
    Fold,
    Message,
    ModelReplied,
    ModelRequest,
    PromptRejected,
    RunFinished,
    RunStarted,
    ToolSpec,
    TurnStarted,
    stop_signal,
)

__all__ = ["SOURCE", "ContextGatekeeper", "GatekeeperStatistics"]

logger = logging.getLogger("loopfuse.context")

SOURCE: Final = "context_gatekeeper"

HISTORY_CHARS_PER_TOKEN: Final = 3
"""Characters of history shown to the summariser per token of room (a cautious ratio)."""

_WINDOW_IN_MESSAGE: Final = re.compile(r"maximum context length is (\d[\d,]*)", re.IGNORECASE)
_SUMMARY_PREFIX: Final = f"{NUDGE_MARKER}{SUMMARY_NUDGE_KIND}]"


class GatekeeperStatistics(NamedTuple):
    """The gatekeeper at a glance."""

    runs: int
    texts_counted: int
    resyncs: int
    blocked: int
    collapses: int
    silent_truncations: int


MAX_ESTIMATORS: Final = 256
"""Models whose token estimators are kept (one each, shared by the model's runs)."""
CUT_ROUNDS: Final = 3
"""Attempts at a cut result that fits (each shorter): head text can be denser than the rest."""


@dataclass(slots=True)
class _Run:
    run_id: str
    model: str
    policy: ContextPolicy
    ledger: PromptLedger
    tools: Estimate
    window: int
    base: tuple[int, int] = (0, 0)
    """The raw estimate (tokens, bound) of the prompt at the run's first check: its system
    prompt, task and tool schemas, which every request carries."""
    cut_chars: int = -1
    """Results up to this many characters cannot need a cut (a bound worked out once per
    window, so most results skip the check); -1: not worked out yet (or the window
    changed)."""
    cut_window: int = 0
    counting: str = ""
    """How the run's tokens were last said to be counted (``ContextAction(counting)``):
    ``exact``, ``bound``, ``usage`` or ``tokenizer``."""
    stale: bool = False
    stopped: bool = False
    sent_tokens: int = 0
    """The estimate of the last request sent, not yet answered (0: none)."""
    sent_floor: int = 0
    sent_bound: int = 0
    sent_turn: int = 0
    pending: Span | None = None
    recovery_turn: int = 0
    tried: tuple[str, ...] = ()  # tuples: most runs never need these
    done: tuple[str, ...] = ()

    @property
    def limit(self) -> int:
        return self.window - self.policy.safety_buffer - self.policy.output_reserve


class ContextGatekeeper:
    """Context limits for every run of a bus.

    :param policy_for: each run's :class:`ContextPolicy` from its run id (``None``: the
        run is not watched).
    :param counter: counts text for every model (tests pass a spy); default: each model's
        own vocabulary or the fallback's (:class:`~actors.context.Estimator`).
    """

    def __init__(
        self,
        bus: Bus,
        policy_for: Callable[[str], ContextPolicy | None],
        *,
        counter: TextCounter | None = None,
        calibration: Calibration | None = None,
        server: ServerEndpoint | None = None,
    ) -> None:
        self._bus = bus
        self._policy_for = policy_for
        self._counter = counter
        self.calibration = calibration or Calibration()
        self._probes = ServerProbes(server, self.calibration, self._window_reported)
        self._runs: dict[str, _Run] = {}
        self._estimators: dict[str, Estimator] = {}
        self._counted_before = 0  # texts counted by estimators dropped from the table
        self._resyncs = self._blocked = self._collapses = self._silent = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until the bus closes this subscription; started once subscribed."""
        handlers = self.handlers()
        subscription = self._bus.subscribe(*handlers, name=SOURCE, answers=True, inline=True)
        if self._probes.server is None:
            await subscription.serve_by_type(handlers, task_status=task_status)
            return
        async with anyio.create_task_group() as task_group:  # the server probes run here
            self._probes.task_group = task_group
            try:
                await subscription.serve_by_type(handlers, task_status=task_status)
            finally:
                self._probes.task_group = None
                task_group.cancel_scope.cancel()

    def statistics(self) -> GatekeeperStatistics:
        counted = self._counted_before + sum(e.calls for e in self._estimators.values())
        return GatekeeperStatistics(
            len(self._runs),
            counted,
            self._resyncs,
            self._blocked,
            self._collapses,
            self._silent,
        )

    async def server_report(self, model: str) -> ServerReport | None:
        """What the server said about ``model``, once it has answered (``None``: it was
        never asked: no operator endpoint, or too many models)."""
        return await self._probes.report(model)

    def estimate(self, run_id: str) -> int | None:
        """The current calibrated prompt estimate of a watched run (tokens)."""
        run = self._runs.get(run_id)
        return None if run is None else self._prompt(run)

    # ------------------------------------------------------------------ handling

    def handlers(self) -> dict[type[Message], Callable[[Any], None]]:
        """The function of each message type the gatekeeper handles (what the bus calls)."""
        return {
            RunStarted: self._start,
            RunFinished: self._finished,
            TurnStarted: self._turn_started,
            ModelRequest: self._sent,
            ModelReplied: self._replied,
            PromptRejected: self._rejected,
        }

    def _start(self, msg: RunStarted) -> None:
        policy = self._policy_for(msg.run_id)
        if policy is None:
            return
        estimator = self._estimator(msg.model)
        window = policy.window
        report = self._probes.known(msg.model)
        if report is not None and report.window is not None and not policy.window_configured:
            window = report.window
        self._runs[msg.run_id] = _Run(
            run_id=msg.run_id,
            model=msg.model,
            policy=policy,
            ledger=PromptLedger(estimator),
            tools=estimator.tools(msg.tool_specs),
            window=window,
        )
        self._probes.start(msg.model, msg.task, msg.tool_specs, estimator)

    def _estimator(self, model: str) -> Estimator:
        estimator = self._estimators.get(model)
        if estimator is None:  # one per model, shared by its runs (it holds no run state)
            if len(self._estimators) >= MAX_ESTIMATORS:
                self._counted_before += sum(e.calls for e in self._estimators.values())
                self._estimators.clear()
            estimator = self._estimators[model] = Estimator(model, counter=self._counter)
        return estimator

    async def prepare(self, model: str, task: str, tool_specs: Sequence[ToolSpec]) -> None:
        """Before a run of ``model`` starts: ask the server about the model, once per
        model, and wait for its answer (runs of a model already asked about wait for the
        same answer; later ones return at once). The run's first check then counts with
        what the server said, and the probe never competes with the run's own requests
        (llama-cpp-python, ``--interrupt_requests`` on by default, cuts a stream short when
        another request waits). Bounded by the probe's time limits."""
        await self._probes.prepare(model, task, tool_specs, self._estimator(model))

    def _window_reported(self, model: str, window: int) -> None:
        for run in self._runs.values():
            if run.model == model and not run.policy.window_configured:
                run.window, run.cut_chars, run.cut_window = window, -1, 0

    def _finished(self, msg: RunFinished) -> None:
        self._runs.pop(msg.run_id, None)

    def _turn_started(self, msg: TurnStarted) -> None:
        run = self._runs.get(msg.run_id)
        if run is not None and not run.stopped:
            turn = msg.turn - 1 if msg.turn > 1 else 0  # the turn that added the messages
            self._sync(run, msg.appended, msg.prompt_messages, turn)
            counting = run.counting
            if counting in _SETTLED:
                method = counting
            elif run.ledger.estimator.exact:
                method = "exact"
            else:
                method = self.calibration.source(run.model) or "bound"
            if method != counting:  # the run's first check, or the method changed
                if not counting:
                    # what every request carries: the messages up to its task, and the tools
                    fixed = run.ledger.entries[: run.ledger.first_user() + 1]
                    run.base = (
                        run.tools.tokens + sum(entry.estimate.tokens for entry in fixed),
                        run.tools.bound + sum(entry.estimate.bound for entry in fixed),
                    )
                run.counting = method
                detail = self._counting(run)
                self._bus.publish_nowait(
                    ContextAction(run_id=run.run_id, turn=msg.turn, kind="counting", detail=detail)
                )
            # Most results are far below any share: one comparison (see _cut_chars).
            if run.ledger.longest_result > run.cut_chars and not run.stale:
                if run.cut_window != run.window:
                    run.cut_window, run.cut_chars = run.window, _cut_chars(run)
                if run.ledger.longest_result > run.cut_chars:
                    self._cut_results(run, msg)
            self._check(run, msg)

    def _sync(
        self, run: _Run, appended: Sequence[ChatMessage], prompt_messages: int, turn: int
    ) -> None:
        """Add the reported messages the ledger does not have yet (aligned by position)."""
        first = prompt_messages - len(appended)
        skip = len(run.ledger.entries) - first
        if run.stale or first < 0 or skip < 0 or skip > len(appended):
            if not run.stale:
                logger.warning(
                    "run %s: the transcript (%d messages) and the context ledger (%d) "
                    "disagree; estimates resume at the next request",
                    run.run_id,
                    prompt_messages,
                    len(run.ledger),
                )
            run.stale = True
            return
        run.ledger.extend(appended[skip:], turn)

    # ------------------------------------------------------------------ before a request

    def _prompt(self, run: _Run) -> int:
        ledger, tools = run.ledger, run.tools
        raw, bound = ledger.tokens + tools.tokens, ledger.bound + tools.bound
        return self.calibration.apply(run.model, raw, bound)

    def _counting(self, run: _Run) -> str:
        """How ``run``'s prompt tokens are counted now (said once, and on a change)."""
        estimator = run.ledger.estimator
        model = run.model
        if estimator.exact:
            vocabulary = estimator.encoding
            return f"Prompt tokens of {model!r} are counted with its own vocabulary ({vocabulary})."
        source = self.calibration.source(model)
        if source is None:
            return (
                f"Prompt tokens of {model!r} are bounded by the UTF-8 bytes of every text "
                "plus framing (its tokenizer is unknown; no reported usage or server "
                "tokenizer has calibrated it yet)."
            )
        calibration = self.calibration
        ratios = (
            f"{calibration.ratio(model):.2f} × the typical estimate or "
            f"{calibration.ratio_of_bound(model):.2f} × the UTF-8 byte bound, the larger, "
            "never above the bound"
        )
        if source == "tokenizer":
            report = self._probes.known(model)
            path = report.tokenizer if report is not None else None
            return (
                f"Prompt tokens of {model!r} are estimated from what its server's tokenizer "
                f"(POST {path}) counted in a sample: {ratios}."
            )
        samples = calibration.samples(model)
        replies = f"{samples} repl{'y' if samples == 1 else 'ies'}"
        return (
            f"Prompt tokens of {model!r} are estimated from the usage the server reported "
            f"({replies}): {ratios}."
        )

    def _cut_results(self, run: _Run, msg: TurnStarted) -> None:
        """Cut the turn's new tool results so that together they take at most their share
        of the room left (see the module): the room is shared out evenly, a result smaller
        than its part keeps all of it and leaves the rest to the others."""
        appended = msg.appended
        first = msg.prompt_messages - len(appended)
        share = run.policy.tool_result_share
        found = [
            (first + offset, message)
            for offset, message in enumerate(appended)
            if message.role == "tool" and message.content and message.tool_call_id is not None
        ]
        chars = sum(len(message.content or "") for _, message in found)
        # each message's framing counted as RESULT_FRAMING characters: more than it costs
        if chars + (len(found) - 1) * RESULT_FRAMING <= run.cut_chars:
            return  # cannot be over the share together whatever calibration says
        calibration = self.calibration
        room = run.limit - calibration.apply(run.model, *run.base)
        if room <= 0:
            return  # the task alone fills the window: the check says so
        allowed = max(math.floor(share * room), 1)
        entries = run.ledger.entries
        estimates = [entries[index].estimate for index, _ in found]
        owns = [calibration.apply(run.model, e.tokens, e.bound) for e in estimates]
        if sum(owns) <= allowed:
            return
        parts = _shared_out(owns, allowed, [len(m.content or "") <= NOTE_CHARS for _, m in found])
        folds: list[Fold] = []
        before = self._prompt(run)
        for (index, message), own, part in zip(found, owns, parts, strict=True):
            content = message.content or ""
            if own <= part or len(content) <= NOTE_CHARS:
                continue
            call_id, tool = message.tool_call_id or "", entries[index].tool
            calls = (c for m in appended for c in m.tool_calls if c.id == call_id)
            arguments = next(calls, None) if tool == "read_file" else None
            line = next_offset(tool, None if arguments is None else arguments.arguments)
            keep = len(content) * max(part, 0) // max(own, 1) - NOTE_CHARS
            stub = cut_result(content, keep, tool=tool, offset=line)
            for _ in range(CUT_ROUNDS):
                cut = run.ledger.estimator.message(
                    ChatMessage(role="tool", tool_call_id=call_id, content=stub)
                )
                tokens = calibration.apply(run.model, cut.tokens, cut.bound)
                if tokens <= part or keep <= 0:
                    break
                keep = keep * part // tokens - NOTE_CHARS
                stub = cut_result(content, keep, tool=tool, offset=line)
            fold = Fold(index=index, call_id=call_id, stub=stub)
            run.ledger.fold(fold, final=False)
            folds.append(fold)
        if folds:
            after = self._prompt(run)
            self._collapses += 1
            tools = ", ".join(sorted({entries[fold.index].tool or "tool" for fold in folds}))
            together = f" of {len(found)} results" if len(found) > 1 else ""
            detail = (
                f"Cut the result of {tools} ({len(folds)} result(s)) to {allowed:,} tokens"
                f"{together} together, {share:.0%} of the room the system prompt, task and "
                f"tool schemas leave under the limit: {before:,} → {after:,} tokens (estimate)."
            )
            self._act(run, msg.turn, "collapse", detail, before, after, folds=tuple(folds))

    def _check(self, run: _Run, msg: TurnStarted) -> None:
        if run.stale:
            return
        policy = run.policy
        limit = run.window - policy.safety_buffer - policy.output_reserve  # run.limit, sooner
        ledger, tools = run.ledger, run.tools
        prompt = self.calibration.apply(
            run.model, ledger.tokens + tools.tokens, ledger.bound + tools.bound
        )
        if policy.collapse_at and prompt > policy.collapse_at * limit:
            excess = prompt - policy.collapse_to * limit
            needed = math.ceil(excess / self.calibration.ratio(run.model))
            folds, _ = plan_collapse(run.ledger, min_chars=policy.fold_min_chars, needed=needed)
            if folds:
                prompt = self._collapse(run, msg.turn, folds, prompt, reactive=False)
        if prompt <= limit:
            return
        bounded = run.counting == "bound"
        typical = ledger.tokens + tools.tokens
        if bounded and msg.turn == 1 and typical <= limit:
            # Nothing has calibrated the model yet and only its bound is over the limit: the
            # first request goes out, and the server's answer decides (its usage calibrates;
            # a refusal takes the ``prompt_too_long`` path). A bound blocks only once it is
            # all there is (later turns).
            detail = (
                f"The prompt's upper bound ({prompt:,} tokens) is over the limit ({limit:,}) "
                f"but its typical estimate ({typical:,}) is not, and nothing has calibrated "
                f"{run.model!r} yet: the request is sent and the server's answer decides."
            )
            self._act(run, msg.turn, "counting", detail, prompt)
            return
        self._blocked += 1
        detail = (
            f"The prompt of turn {msg.turn} is estimated at {prompt:,} tokens; the "
            f"{run.window:,}-token window of {run.model!r}, less a safety buffer of "
            f"{policy.safety_buffer:,} and {policy.output_reserve:,} reserved for the "
            f"answer, leaves room for {limit:,}. No request was sent."
        )
        if bounded:
            detail += (
                " The estimate is an upper bound (UTF-8 bytes): the model's tokenizer is "
                "unknown, the server reported no usage and loopfuse found no tokenizer "
                "endpoint on it."
            )
        self._act(run, msg.turn, "blocked", detail, prompt, prompt)
        self._stop(run, "context.blocking_limit", detail)

    def _collapse(
        self, run: _Run, turn: int, folds: tuple[Fold, ...], before: int, *, reactive: bool
    ) -> int:
        """Fold ``folds`` in the ledger and say so; returns the prompt's estimate after."""
        for fold in folds:
            run.ledger.fold(fold)
        self._collapses += 1
        after = self._prompt(run)
        why = "the endpoint refused the prompt" if reactive else "the prompt neared the limit"
        detail = f"Folded {len(folds)} old tool result(s) ({why}): {before:,} → {after:,} tokens"
        self._act(
            run, turn, "collapse", f"{detail} (estimate).", before, after, folds, reactive=reactive
        )
        return after

    def _act(
        self,
        run: _Run,
        turn: int,
        kind: ContextActionKind,
        detail: str,
        estimate: int,
        after: int = 0,
        folds: tuple[Fold, ...] = (),
        *,
        reactive: bool = False,
        reported: int = 0,
    ) -> None:
        """Publish what the gatekeeper did to ``run``'s prompt, against its limit."""
        self._bus.publish_nowait(
            ContextAction(
                run_id=run.run_id,
                turn=turn,
                kind=kind,
                reactive=reactive,
                estimate_tokens=estimate,
                after_tokens=after,
                limit_tokens=run.limit,
                reported_tokens=reported,
                folds=folds,
                detail=detail,
            )
        )

    # ------------------------------------------------------------------ requests and replies

    def _sent(self, msg: ModelRequest) -> None:
        run = self._runs.get(msg.run_id)
        if run is None or msg.purpose != "turn":
            return
        ledger = run.ledger
        span, run.pending = run.pending, None
        if span is not None and not run.stale:
            # the request holds the summary at span.start (end <= len(ledger): it is there)
            expected = len(ledger) - (span.end - span.start) + 1
            summary = msg.messages[span.start] if len(msg.messages) >= expected else None
            if summary is not None and (summary.content or "").startswith(_SUMMARY_PREFIX):
                ledger.splice(span.start, span.end, summary, span.last_turn)
            else:
                run.stale = True
        known = len(ledger.entries)
        if run.stale or len(msg.messages) < known:
            # Out of step (should not happen): count the request afresh, once.
            self._resyncs += 1
            ledger.reset()
            ledger.extend(msg.messages, msg.turn)
            run.stale = False
        elif len(msg.messages) > known:  # nudges (most requests add nothing)
            ledger.extend(msg.messages[known:], msg.turn)
        run.sent_tokens = ledger.tokens + run.tools.tokens
        run.sent_floor = ledger.floor + run.tools.floor
        run.sent_bound = ledger.bound + run.tools.bound
        run.sent_turn = msg.turn

    def _replied(self, msg: ModelReplied) -> None:
        run = self._runs.get(msg.run_id)
        if run is None:
            return
        sent, floor, run.sent_tokens = run.sent_tokens, run.sent_floor, 0
        usage = msg.usage
        if not sent or msg.turn != run.sent_turn or usage.estimated:
            return
        reported = usage.prompt_tokens
        if reported <= 0:
            return
        if reported < run.policy.silent_truncation_ratio * floor:
            self._silent += 1
            detail = (
                f"The endpoint counted {reported:,} prompt tokens where at least {floor:,} "
                "were sent: it probably cut the prompt without an error (Ollama does at "
                "num_ctx); the model may not have seen the task or the latest results."
            )
            self._act(run, msg.turn, "silent_truncation", detail, floor, reported=reported)
            return
        self.calibration.observe(run.model, sent, reported, "usage", run.sent_bound)

    # ------------------------------------------------------------------ after a refusal

    def _rejected(self, msg: PromptRejected) -> None:
        run = self._runs.get(msg.run_id)
        if run is None or run.stopped:
            return
        self._sync(run, msg.appended, msg.prompt_messages, msg.turn)
        found = _WINDOW_IN_MESSAGE.search(msg.message)
        if found is not None:
            run.window = min(run.window, int(found[1].replace(",", "")))
            run.cut_chars, run.cut_window = -1, 0  # worked out again at the next turn
        if run.recovery_turn != msg.turn:
            run.recovery_turn, run.tried, run.done = msg.turn, (), ()
        policy = run.policy
        if not run.stale and "collapse" not in run.tried:
            run.tried += ("collapse",)
            folds, _ = plan_collapse(run.ledger, min_chars=policy.fold_min_chars)
            if folds:
                self._collapse(run, msg.turn, folds, self._prompt(run), reactive=True)
                run.done += ("collapsing",)
                return
        if not run.stale and "compact" not in run.tried:
            run.tried += ("compact",)
            span = plan_compaction(run.ledger, keep_turns=policy.keep_recent_turns)
            if span is not None:
                run.done += ("compacting",)
                run.pending = span
                room = run.window - policy.safety_buffer - policy.summary_max_tokens
                self._bus.publish_nowait(
                    ContextAction(
                        run_id=msg.run_id,
                        turn=msg.turn,
                        kind="compact",
                        reactive=True,
                        estimate_tokens=self._prompt(run),
                        limit_tokens=run.limit,
                        start=span.start,
                        end=span.end,
                        first_turn=span.first_turn,
                        last_turn=span.last_turn,
                        summary_max_tokens=policy.summary_max_tokens,
                        history_chars=HISTORY_CHARS_PER_TOKEN * max(room, 1_000),
                        detail=(
                            f"Compacting {turns_text(span.first_turn, span.last_turn)} "
                            f"({span.end - span.start} messages) into a summary."
                        ),
                    )
                )
                return
        if run.done:
            done = f"after {' and '.join(run.done)}"
        elif run.stale:
            done = "with the transcript out of step, so nothing was folded or compacted"
        else:
            done = "with nothing to fold or compact"
        refused = f"The endpoint refused the prompt of turn {msg.turn} as too long"
        self._stop(
            run,
            "context.prompt_too_long",
            f"{refused} {msg.attempt} time(s), {done}: {msg.message or f'status {msg.status}'}",
        )

    # ------------------------------------------------------------------ answers

    def _stop(self, run: _Run, cause: str, detail: str) -> None:
        run.stopped = True
        signal = stop_signal(cause, run_id=run.run_id, source=SOURCE, detail=detail)
        self._bus.publish_nowait(signal)


NEVER_CUT: Final = 2**62
_SETTLED: Final = frozenset(("exact", "usage"))
"""Ways of counting that no later sample changes (usage replaces a tokenizer's ratio)."""
MAX_BOUND_PER_CHAR: Final = 9
"""The most bound tokens a character of a result adds: 4 UTF-8 bytes and 5 of escaping."""
MAX_EXACT_PER_CHAR: Final = 4
"""The most tokens an OpenAI vocabulary makes of one character (its UTF-8 bytes)."""
RESULT_FRAMING: Final = 256
"""Tokens a tool message adds besides its content, at most (framing and call id)."""


def _shared_out(owns: Sequence[int], allowed: int, fixed: Sequence[bool]) -> list[int]:
    """Each result's part of ``allowed`` tokens: results that cannot be cut (``fixed``)
    keep theirs, then the rest is shared evenly, a result smaller than its part keeping
    only what it needs (water-filling); at least 1 token each."""
    parts = [own if keep else 0 for own, keep in zip(owns, fixed, strict=True)]
    left = allowed - sum(parts)
    waiting = sorted(
        (own, i) for i, (own, keep) in enumerate(zip(owns, fixed, strict=True)) if not keep
    )
    for position, (own, i) in enumerate(waiting):
        even = max(left // (len(waiting) - position), 1)
        parts[i] = min(own, even)
        left -= parts[i]
    return parts


def _cut_chars(run: _Run) -> int:
    """The longest result that cannot be over its share whatever calibration says later
    (a calibrated estimate is at most the bound, or ``HIGH`` times an exact count); with
    cutting off, any."""
    tokens, bound = run.base
    share = run.policy.tool_result_share
    if not share:
        return NEVER_CUT
    if bound:
        worst = share * (run.limit - bound) - RESULT_FRAMING
        return max(int(worst) // MAX_BOUND_PER_CHAR, 0)
    worst = share * (run.limit - tokens * HIGH) - RESULT_FRAMING * HIGH
    return max(int(worst) // int(MAX_EXACT_PER_CHAR * HIGH), 0)
