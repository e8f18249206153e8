"""The loop detector: the registered detectors, three levels, usable without a bus.

::

    detector = LoopDetector(OPENCLAW)
    decision = detector.propose("read_file", '{"path": "a.txt"}')
    if decision.level in ("none", "warning"):
        ...run the call; inject decision.nudge if it is not None...
        detector.record_result(decision.call_id, result_text)
    for delta in stream:
        if detector.feed_text(delta).level != "none": ...cut the stream...
    detector.new_stream()

Order (OpenClaw's, extended): a ``break`` from any detector wins; otherwise the first
finding, in the registry's order (``actors.loop.registry``). A refused call is not recorded
unless ``record_blocked`` (gemini-cli counts it); a recorded refusal gets the call's last
result, so it counts as no progress.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from actors.fingerprint import fingerprint_call, fingerprint_result
from actors.loop.config import LoopConfig, check_config
from actors.loop.content import ContentLoop
from actors.loop.error_streak import ERROR_CHARS, ErrorStreak
from actors.loop.history import EMPTY_WINDOW, CallRecord, ToolDetector, Window
from actors.loop.llm_check import LlmCheck, check_messages, parse_answer
from actors.loop.normalise import Normaliser
from actors.loop.presets import GEMINI_RECOVERY_TEXT, STRICT
from actors.loop.progress import ProgressTracker
from actors.loop.qwen import is_git_overview
from actors.loop.registry import tool_detectors
from actors.loop.snapshot import LoopSnapshot, decode_snapshot, encode_snapshot
from actors.loop.unknown_tool import STORM_KEY
from actors.loop.verdicts import Decision, Hit

__all__ = ["MAX_PENDING", "MAX_WARNING_KEYS", "LoopDetector"]

MAX_WARNING_KEYS: Final = 256
"""Warning buckets remembered per run (oldest forgotten first), as OpenClaw."""

MAX_PENDING: Final = 1024
"""Calls remembered while waiting for their result."""

_MAX_PLANS: Final = 64
"""Configs whose plan is kept (the presets and recent per-run configs)."""

_NONE: Final = Decision()
_SELF_LIMITED: Final = frozenset({"error-streak"})
"""Warning keys whose detector gives the warning once per streak itself (no buckets)."""
_ONCE_PER_RUN: Final = frozenset({STORM_KEY})
"""Warning keys nudged once per run whatever the preset's buckets."""
_decode_args = msgspec.json.Decoder().decode


def _argument(arguments_json: str, name: str) -> object:
    """The argument ``name`` of a call (``None`` when the arguments are no JSON object)."""
    try:
        args = _decode_args(arguments_json)
    except (msgspec.DecodeError, RecursionError):
        return None
    return args.get(name) if isinstance(args, dict) else None


def _escalated(
    detector: str, count: int, stop: bool, stopped: str, message: str, nudge: str
) -> Decision:
    """A ``break`` (the run stops: ``stopped``) when ``stop``, else a ``critical`` finding
    with its ``message`` and ``nudge``."""
    if stop:
        return Decision(level="break", detector=detector, count=count, message=stopped)
    return Decision(level="critical", detector=detector, count=count, message=message, nudge=nudge)


class _Plan:
    """What one config needs, worked out once and shared by every detector using it:
    the config checked, the enabled detectors (the stateless ones shared), and which
    per-run state is ever read."""

    __slots__ = (
        "config",
        "detectors",
        "error_text",
        "exempt",
        "last_results",
        "min_chars",
        "normaliser",
        "polls",
        "progress",
        "recorders",
        "results",
        "shared",
        "shell_argument",
        "shell_tools",
        "source",
        "watchers",
        "window",
    )

    def __init__(self, source: LoopConfig) -> None:
        self.source = source
        self.config = config = check_config(source)
        self.exempt = frozenset(config.exempt_tools)
        self.polls = {tool.name: tool.actions for tool in config.poll_tools}
        shell = config.shell_stagnation
        self.detectors = detectors = tool_detectors(config)
        self.shared = all(detector.fresh() is detector for detector in detectors)
        # positions of the detectors that record accepted calls, and that watch results
        self.recorders = tuple(i for i, d in enumerate(detectors) if d.records)
        self.watchers = tuple(i for i, d in enumerate(detectors) if d.watches_results)
        # what the detectors read: the window (its calls, their results), results judged
        # for progress, a call's previous result; error texts (the error streak quotes them)
        in_window = any(detector.window_results for detector in detectors)
        self.results = in_window or bool(self.watchers)
        self.window = in_window or any(detector.reads_window for detector in detectors)
        self.normaliser = Normaliser(config)
        self.min_chars = config.no_new_information.min_result_chars
        self.shell_tools = frozenset(shell.tools) if shell.enabled else frozenset()
        self.shell_argument = shell.argument
        self.progress = any(detector.judges_progress for detector in detectors)
        self.error_text = config.error_streak.enabled
        # a call's previous result: evidence for a detector, a recorded refusal's result
        previous = any(detector.previous_results for detector in detectors)
        self.last_results = previous or (self.results and config.record_blocked)

    def pick(
        self, detectors: tuple[ToolDetector, ...], positions: tuple[int, ...]
    ) -> tuple[ToolDetector, ...]:
        """The detectors at ``positions`` (``detectors`` itself when that is all of them)."""
        if len(positions) == len(detectors):
            return detectors
        return tuple([detectors[i] for i in positions]) if positions else ()


_plans: dict[int, _Plan] = {}


class LoopDetector:
    """One run's (or one session's) loop detection. Not thread-safe; cheap to create.

    Only what the config's enabled detectors read is kept: no window of calls when no
    detector reads it, no results when none looks at them, no content state before the
    first streamed text. ``reads_results`` is False when no enabled detector looks at
    results (:meth:`record_result` then does nothing).
    """

    __slots__ = (
        "_buckets",
        "_content",
        "_content_offences",
        "_content_tripped",
        "_detectors",
        "_last_results",
        "_llm",
        "_nudged",
        "_pending",
        "_plan",
        "_progress",
        "_recorders",
        "_refusals",
        "_seq",
        "_since_refusal",
        "_strikes",
        "_watchers",
        "_window",
        "config",
        "reads_results",
    )

    def __init__(self, config: LoopConfig = STRICT) -> None:
        plan = _plans.get(id(config))
        if plan is None or plan.source is not config:
            plan = _Plan(config)
            if len(_plans) >= _MAX_PLANS:
                del _plans[next(iter(_plans))]
            _plans[id(config)] = plan
        self._plan = plan
        self.config = plan.config  # clamped as OpenClaw does
        self.reset()

    def reset(self) -> None:
        """Forget everything: a new run."""
        plan = self._plan
        self._window = Window(self.config.history_size) if plan.window else EMPTY_WINDOW
        self.reads_results = plan.results
        self._pending: dict[str, CallRecord] | None = {} if plan.results else None
        self._last_results: dict[str, str] | None = {} if plan.last_results else None
        detectors = plan.detectors  # the shared tuple when none keeps state
        if not plan.shared:
            detectors = tuple([detector.fresh() for detector in detectors])
        self._detectors = detectors
        self._recorders = plan.pick(detectors, plan.recorders)
        self._watchers = plan.pick(detectors, plan.watchers)
        self._content: ContentLoop | None = None
        self._content_tripped = False
        self._content_offences = 0
        self._strikes = 0
        self._buckets: dict[str, int] | None = None
        self._nudged: set[tuple[str, ...]] | None = None
        self._seq = 0
        self._llm: LlmCheck | None = None
        self._progress = ProgressTracker() if plan.progress else None
        self._refusals = 0
        # results since the first refusal of a streak: a result new there is progress
        self._since_refusal: ProgressTracker | None = None

    # ------------------------------------------------------------------ tool calls

    def propose(
        self,
        tool: str,
        arguments_json: str = "{}",
        *,
        call_id: str = "",
        fingerprint: str = "",
    ) -> Decision:
        """Judge a call before it runs; accepted calls are recorded in the history."""
        self._seq += 1
        call_id = call_id or f"call-{self._seq}"
        if self._content is not None:
            self._content.reset_tracking()
        plan = self._plan
        if tool in plan.exempt:
            return Decision(call_id=call_id)
        poll = tool in plan.polls  # a poll tool: any call, or one of its polling actions
        if poll and plan.polls[tool]:
            poll = _argument(arguments_json, "action") in plan.polls[tool]
        call = CallRecord(
            tool, fingerprint or fingerprint_call(tool, arguments_json), call_id, poll
        )
        if tool in plan.shell_tools:
            command = _argument(arguments_json, plan.shell_argument)
            call.inspection = isinstance(command, str) and is_git_overview(command)
        window = self._window
        chosen: Hit | None = None
        by: ToolDetector | None = None
        streak: ErrorStreak | None = None  # the error streak, when it found something too
        for detector in self._detectors:  # the first break, else the first finding
            hit = detector.check(call, window)
            if hit is not None:
                if isinstance(detector, ErrorStreak):
                    streak = detector
                if hit.level == "break":
                    chosen, by = hit, detector
                    break
                if chosen is None:
                    chosen, by = hit, detector
        if chosen is None:
            if self._since_refusal is None:
                self._refusals = 0
            self._record(call)
            return Decision(call_id=call_id)
        decision = self._decide(chosen, tool, arguments_json)
        if decision.level == "critical":
            limit = self.config.refusal_limit
            if limit is not None and self._refusals >= limit:
                return Decision(
                    level="break",
                    detector=decision.detector,
                    count=self._refusals + 1,
                    message=(
                        f"Stopped: {self._refusals} calls were refused without progress and the "
                        f"model went on. The last refusal: {decision.message}"
                    ),
                    call_id=call_id,
                )
            self._refusals += 1
            if self._since_refusal is None and self._pending is not None:
                # From now on only progress ends the refusals (``refusal_limit``): a call that
                # runs but changes nothing does not. Results are judged from here, the
                # window's results counting as seen; without results (no detector reads
                # them), any call that runs ends the refusals.
                since = self._since_refusal = ProgressTracker()
                for record in self._window.records:
                    if record.result is not None:
                        since.judge(record.fingerprint, record.result, is_error=record.error)
        if decision.level in ("none", "warning"):
            if self._since_refusal is None:
                self._refusals = 0
            self._record(call)
        else:
            if decision.level == "critical" and by is not None:
                by.on_refused(call)
                if streak is not None and streak is not by:
                    streak.on_refused(call)  # this refusal answers its failures too
            if self.config.record_blocked:
                self._record(call)
                # A refused call changed nothing: its result is the call's last result, so
                # it counts as no progress (OpenClaw's later "tool-loop-veto" outcome) and a
                # level above ``block_at`` stays reachable for the detectors that look at
                # results (without last results, no enabled detector looks at them).
                last = self._last_results
                previous = None if last is None else last.get(call.fingerprint)
                if previous is not None:
                    call.refused = True
                    self.record_result(call.call_id, result_fingerprint=previous)
        return msgspec.structs.replace(decision, call_id=call_id)

    def record_result(
        self,
        call_id: str,
        result_text: str = "",
        is_error: bool = False,
        *,
        result_fingerprint: str = "",
        unknown_tool: bool = False,
    ) -> None:
        """Attach a result to a recorded call (unknown or refused calls are ignored).

        The result is normalised (``actors.loop.normalise``) and fingerprinted;
        ``result_fingerprint``, when given, must be ``fingerprint_result(result_text,
        is_error=is_error)`` (the tool executor's) and is used as is when normalisation
        changes nothing (without ``result_text`` it is the fingerprint). ``unknown_tool``:
        the call named a tool that does not exist (``unknown_tool``).
        """
        if self._pending is None:
            return  # no enabled detector looks at results
        call = self._pending.pop(call_id, None)
        if call is None:
            return
        plan = self._plan
        text = result_text
        if result_text and plan.normaliser:
            text = plan.normaliser.normalise(result_text)
        if text is result_text and result_fingerprint:
            call.result = result_fingerprint
        else:
            call.result = fingerprint_result(text, is_error=is_error)
        call.unknown = unknown_tool
        call.informative = len(result_text) >= plan.min_chars
        error = call.error = is_error or unknown_tool
        if error and plan.error_text:
            call.error_text = result_text[:ERROR_CHARS]
        if self._progress is not None and not call.refused:
            call.progress = self._progress.judge(call.fingerprint, call.result, is_error=error)
        since = self._since_refusal
        if (
            since is not None
            and not call.refused
            and since.judge(call.fingerprint, call.result, is_error=error)
        ):
            self._refusals = 0  # progress: the refusals so far have ended
            self._since_refusal = None
        previous: str | None = None
        if self._last_results is not None:
            previous = self._last_results.get(call.fingerprint)
            self._last_results[call.fingerprint] = call.result
        for detector in self._watchers:
            detector.on_result(call, previous)

    def _record(self, call: CallRecord) -> None:
        if self._window is not EMPTY_WINDOW:
            self._window.append(call)
        pending = self._pending
        if pending is not None:
            pending[call.call_id] = call
            if len(pending) > MAX_PENDING:
                del pending[next(iter(pending))]
        for detector in self._recorders:
            detector.record(call)

    def _decide(self, hit: Hit, tool: str, arguments_json: str) -> Decision:
        if self.config.strikes is not None:
            detail = (
                f"Repeated tool call: {tool} with arguments {arguments_json}"
                if hit.detector == "generic_repeat"
                else hit.message
            )
            return self._strike(hit, detail, f"Not run: potential loop detected. {detail}.")
        if hit.level != "warning":
            return Decision(
                level=hit.level, detector=hit.detector, count=hit.count, message=hit.message
            )
        if hit.key in _SELF_LIMITED:
            allowed = True
        elif hit.key in _ONCE_PER_RUN:
            allowed = self._first_nudge(hit, always=True)
        else:
            allowed = self._bucket_allows(hit) and self._first_nudge(hit)
        text = self.config.generic_repeat.warn_text
        if not text or hit.detector != "generic_repeat":
            text = hit.message
        return Decision(
            level="warning",
            detector=hit.detector,
            count=hit.count,
            message=hit.message,
            nudge=text if allowed else None,
            rate_limited=not allowed,
        )

    def _strike(self, hit: Hit, detail: str, message: str) -> Decision:
        strikes = self.config.strikes
        assert strikes is not None
        self._strikes += 1
        return _escalated(
            hit.detector,
            hit.count,
            self._strikes >= strikes.stop_at,
            f"Loop detected again after a warning. {detail}",
            message,
            strikes.text.replace("{detail}", detail),
        )

    def _bucket_allows(self, hit: Hit) -> bool:
        size = self.config.warning_bucket
        if size is None:
            return True
        bucket = hit.count // size
        if self._buckets is None:
            self._buckets = {}
        buckets = self._buckets
        if bucket <= buckets.get(hit.key, 0):
            return False
        buckets.pop(hit.key, None)
        buckets[hit.key] = bucket
        if len(buckets) > MAX_WARNING_KEYS:
            del buckets[next(iter(buckets))]
        return True

    def _first_nudge(self, hit: Hit, *, always: bool = False) -> bool:
        if self.config.nudge_once_per_kind:
            key: tuple[str, ...] = (hit.detector,)
        elif self.config.warning_bucket is None or always:
            key = (hit.detector, hit.key)
        else:
            return True  # the bucket already rate-limits this warning
        if self._nudged is None:
            self._nudged = set()
        if key in self._nudged:
            return False
        self._nudged.add(key)
        return True

    # ------------------------------------------------------------------ model-based check

    def llm_check_due(self, turn: int) -> bool:
        """Whether the model-based check is to be asked now, after the model's reply of
        ``turn`` (never when ``llm_check`` is off, nor while a check is unanswered)."""
        if not self.config.llm_check.enabled:
            return False
        llm = self._llm
        if llm is None:
            llm = self._llm = LlmCheck(self.config.llm_check)
        return llm.due(turn)

    @staticmethod
    def llm_check_messages(task: str, history: Sequence[str]) -> list[tuple[str, str]]:
        """What the checking model is asked: ``(role, content)`` messages built from the
        run's task and its recent history entries (oldest first)."""
        return check_messages(task, history)

    @staticmethod
    def llm_check_readable(text: str) -> bool:
        """Whether ``text`` is a verdict (a JSON object with a confidence in [0, 1]). An
        answer that is not should be asked for once more, then ignored
        (:meth:`llm_check_answer` with ``None``)."""
        return parse_answer(text) is not None

    def llm_check_answer(self, text: str | None) -> Decision:
        """Judge the checking model's answer (``None``: the check failed, which is no
        loop). A loop nudges with gemini-cli's recovery text; loop number
        ``llm_check.stop_at_offence`` (or the strike that stops, under strikes) breaks."""
        llm = self._llm
        if llm is None:
            return _NONE
        verdict = parse_answer(text) if text is not None else None
        if not llm.answered(verdict):
            return _NONE
        assert verdict is not None
        analysis = verdict.analysis.strip() or "the recent history repeats without progress"
        detail = (
            f"A loop check ({verdict.confidence:.2f} confident) found the run stuck: {analysis}"
        )
        hit = Hit("llm_check", "critical", llm.offences, "llm-check", detail)
        if self.config.strikes is not None:
            return self._strike(hit, detail, detail)
        stop = llm.offences >= self.config.llm_check.stop_at_offence
        nudge = GEMINI_RECOVERY_TEXT.replace("{detail}", detail)
        return _escalated("llm_check", llm.offences, stop, detail, detail, nudge)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> bytes:
        """This run's state (msgspec JSON): what :meth:`restore` needs to carry on as if
        the run had never stopped. Content tracking within a stream is not kept."""
        pending, since, llm, nudged = self._pending, self._since_refusal, self._llm, self._nudged
        return encode_snapshot(
            LoopSnapshot(
                config=self.config.name,
                detectors=len(self._detectors),
                seq=self._seq,
                window=list(self._window.records),
                pending=list(pending.values()) if pending is not None else [],
                last_results=dict(self._last_results) if self._last_results is not None else None,
                states=[detector.state() for detector in self._detectors],
                buckets=dict(self._buckets) if self._buckets is not None else None,
                nudged=[list(key) for key in sorted(nudged)] if nudged is not None else None,
                strikes=self._strikes,
                refusals=self._refusals,
                since_refusal=since.state() if since is not None else None,
                progress=self._progress.state() if self._progress is not None else None,
                content_offences=self._content_offences,
                llm=[llm.next_turn, llm.interval, llm.offences] if llm is not None else None,
            )
        )

    def restore(self, data: bytes) -> None:
        """Replace this detector's state with a :meth:`snapshot` of a detector of the same
        config.

        :raises ValueError: ``data`` is not a snapshot, or one of another config.
        """
        try:
            snap = decode_snapshot(data)
        except msgspec.DecodeError as exc:
            raise ValueError(f"not a loop detector snapshot: {exc}") from None
        if snap.config != self.config.name or snap.detectors != len(self._detectors):
            raise ValueError(
                f"loop snapshot of config {snap.config!r} ({snap.detectors} detectors) does "
                f"not fit {self.config.name!r} ({len(self._detectors)} detectors)"
            )
        self.reset()
        by_id: dict[str, CallRecord] = {}
        for record in snap.window:
            by_id[record.call_id] = record
            if self._window is not EMPTY_WINDOW:
                self._window.append(record)
        if self._pending is not None:
            for record in snap.pending:
                self._pending[record.call_id] = by_id.get(record.call_id, record)
        if self._last_results is not None and snap.last_results is not None:
            self._last_results.update(snap.last_results)
        if not self._plan.shared:
            for detector, state in zip(self._detectors, snap.states, strict=False):
                detector.restore(state)
        self._seq = snap.seq
        self._buckets = dict(snap.buckets) if snap.buckets is not None else None
        self._nudged = {tuple(key) for key in snap.nudged} if snap.nudged is not None else None
        self._strikes = snap.strikes
        self._refusals = snap.refusals
        if snap.since_refusal is not None and self._pending is not None:
            self._since_refusal = ProgressTracker()
            self._since_refusal.restore(snap.since_refusal)
        if self._progress is not None and snap.progress is not None:
            self._progress.restore(snap.progress)
        self._content_offences = snap.content_offences
        if snap.llm is not None and len(snap.llm) == 3:
            llm = self._llm = LlmCheck(self.config.llm_check)
            llm.next_turn, llm.interval, llm.offences = snap.llm

    # ------------------------------------------------------------------ streamed text

    def feed_text(self, chunk: str) -> Decision:
        """Judge a piece of the model's streamed text. After a finding, the rest of this
        stream is ignored until :meth:`new_stream`."""
        if not self.config.content.enabled or self._content_tripped:
            return _NONE
        content = self._content
        if content is None:
            content = self._content = ContentLoop(self.config.content)
        if not content.feed(chunk):
            return _NONE
        self._content_tripped = True
        snippet = content.snippet()
        if self.config.strikes is not None:
            hit = Hit("content", "critical", 1, "content", "")
            detail = f'Repeating content detected: "{snippet}..."'
            return self._strike(hit, detail, f"Reply cut off: {detail}")
        self._content_offences += 1
        return _escalated(
            "content",
            self._content_offences,
            self._content_offences >= self.config.content.stop_at_offence,
            f'The model kept repeating its own text: "{snippet}..."',
            f'Reply cut off: it kept repeating "{snippet}..."',
            "Your last reply was cut off because it kept repeating the same text "
            f'("{snippet}..."). Do not repeat yourself: continue with the next step, '
            "or give your final answer.",
        )

    def new_stream(self) -> None:
        """A new model response begins: content tracking starts afresh."""
        if self._content is not None:
            self._content.reset()
        self._content_tripped = False
