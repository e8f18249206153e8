"""The loop detector: six detectors, three levels, usable without a bus.

::

    detector = LoopDetector(OPENCLAW)
    decision = detector.propose("read_file", '{"path": "a.txt"}')
    if decision.level in ("none", "warning"):
        ...run the call; inject decision.nudge if it is not None...
        detector.record_result(decision.call_id, result_text)
    for delta in stream:
        if detector.feed_text(delta).level != "none": ...cut the stream...
    detector.new_stream()

Order (OpenClaw's): a ``break`` from any detector wins; otherwise the first finding of
global breaker, poll, ping-pong, generic repeat, cycle. A refused call is not recorded
unless ``record_blocked`` (gemini-cli counts it); a recorded refusal gets the call's last
result, so it counts as no progress.
"""

from __future__ import annotations

from collections import deque
from typing import Final

import msgspec

from actors.fingerprint import fingerprint_call, fingerprint_result
from actors.loop.config import LoopConfig, check_config
from actors.loop.content import ContentLoop
from actors.loop.cycle import Cycle
from actors.loop.generic import GenericRepeat
from actors.loop.global_breaker import GlobalBreaker
from actors.loop.history import CallRecord, ToolDetector
from actors.loop.ping_pong import PingPong
from actors.loop.poll import PollNoProgress
from actors.loop.presets import STRICT
from actors.loop.verdicts import Decision, Hit

__all__ = ["MAX_PENDING", "MAX_WARNING_KEYS", "LoopDetector"]

MAX_WARNING_KEYS: Final = 256
"""Warning buckets remembered per run (oldest forgotten first), as OpenClaw."""

MAX_PENDING: Final = 1024
"""Calls remembered while waiting for their result."""

_NONE: Final = Decision()
_decode_args = msgspec.json.Decoder().decode


class LoopDetector:
    """One run's (or one session's) loop detection. Not thread-safe; cheap to create."""

    def __init__(self, config: LoopConfig = STRICT) -> None:
        self.config = check_config(config)
        self._exempt = frozenset(config.exempt_tools)
        self._polls = {tool.name: tool.actions for tool in config.poll_tools}
        self.reset()

    def reset(self) -> None:
        """Forget everything: a new run."""
        cfg = self.config
        self._history: deque[CallRecord] = deque(maxlen=cfg.history_size)
        self._pending: dict[str, CallRecord] = {}
        self._last_results: dict[str, str] = {}
        self._detectors: tuple[ToolDetector, ...] = (
            GlobalBreaker(cfg.global_breaker),
            PollNoProgress(cfg.poll_no_progress),
            PingPong(cfg.ping_pong),
            GenericRepeat(cfg.generic_repeat),
            Cycle(cfg.cycle),
        )
        self._content = ContentLoop(cfg.content)
        self._content_tripped = False
        self._content_offences = 0
        self._strikes = 0
        self._buckets: dict[str, int] = {}
        self._nudged: set[tuple[str, ...]] = set()
        self._seq = 0

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
        self._content.reset_tracking()
        if tool in self._exempt:
            return Decision(call_id=call_id)
        call = CallRecord(
            tool,
            fingerprint or fingerprint_call(tool, arguments_json),
            call_id,
            self._is_poll(tool, arguments_json),
        )
        history = self._history
        hits = [hit for d in self._detectors if (hit := d.check(call, history)) is not None]
        hit = next((h for h in hits if h.level == "break"), hits[0] if hits else None)
        decision = _NONE if hit is None else self._decide(hit, tool, arguments_json)
        if decision.level in ("none", "warning"):
            self._record(call)
        elif self.config.record_blocked:
            self._record(call)
            self._record_refusal(call)
        return msgspec.structs.replace(decision, call_id=call_id)

    def record_result(
        self,
        call_id: str,
        result_text: str = "",
        is_error: bool = False,
        *,
        result_fingerprint: str = "",
    ) -> None:
        """Attach a result to a recorded call (unknown or refused calls are ignored)."""
        call = self._pending.pop(call_id, None)
        if call is None:
            return
        call.result = result_fingerprint or fingerprint_result(result_text, is_error=is_error)
        previous = self._last_results.get(call.fingerprint)
        self._last_results[call.fingerprint] = call.result
        for detector in self._detectors:
            detector.on_result(call, previous)

    def _record_refusal(self, call: CallRecord) -> None:
        """A refused call changed nothing: its result is the call's last result, so it
        counts as no progress (OpenClaw's later "tool-loop-veto" outcome) and a level above
        ``block_at`` stays reachable for the detectors that look at results."""
        previous = self._last_results.get(call.fingerprint)
        if previous is not None:
            self.record_result(call.call_id, result_fingerprint=previous)

    def _is_poll(self, tool: str, arguments_json: str) -> bool:
        actions = self._polls.get(tool)
        if actions is None:
            return False
        if not actions:
            return True
        try:
            args = _decode_args(arguments_json)
        except (msgspec.DecodeError, RecursionError):
            return False
        return isinstance(args, dict) and args.get("action") in actions

    def _record(self, call: CallRecord) -> None:
        self._history.append(call)
        self._pending[call.call_id] = call
        if len(self._pending) > MAX_PENDING:
            del self._pending[next(iter(self._pending))]
        for detector in self._detectors:
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
        allowed = self._bucket_allows(hit) and self._first_nudge(hit)
        return Decision(
            level="warning",
            detector=hit.detector,
            count=hit.count,
            message=hit.message,
            nudge=self._warn_text(hit) if allowed else None,
            rate_limited=not allowed,
        )

    def _warn_text(self, hit: Hit) -> str:
        text = self.config.generic_repeat.warn_text
        return text if text and hit.detector == "generic_repeat" else hit.message

    def _strike(self, hit: Hit, detail: str, message: str) -> Decision:
        strikes = self.config.strikes
        assert strikes is not None
        self._strikes += 1
        if self._strikes >= strikes.stop_at:
            return Decision(
                level="break",
                detector=hit.detector,
                count=hit.count,
                message=f"Loop detected again after a warning. {detail}",
            )
        return Decision(
            level="critical",
            detector=hit.detector,
            count=hit.count,
            message=message,
            nudge=strikes.text.replace("{detail}", detail),
        )

    def _bucket_allows(self, hit: Hit) -> bool:
        size = self.config.warning_bucket
        if size is None:
            return True
        bucket = hit.count // size
        if bucket <= self._buckets.get(hit.key, 0):
            return False
        self._buckets.pop(hit.key, None)
        self._buckets[hit.key] = bucket
        if len(self._buckets) > MAX_WARNING_KEYS:
            del self._buckets[next(iter(self._buckets))]
        return True

    def _first_nudge(self, hit: Hit) -> bool:
        if self.config.nudge_once_per_kind:
            key: tuple[str, ...] = (hit.detector,)
        elif self.config.warning_bucket is None:
            key = (hit.detector, hit.key)
        else:
            return True  # the bucket already rate-limits this warning
        if key in self._nudged:
            return False
        self._nudged.add(key)
        return True

    # ------------------------------------------------------------------ streamed text

    def feed_text(self, chunk: str) -> Decision:
        """Judge a piece of the model's streamed text. After a finding, the rest of this
        stream is ignored until :meth:`new_stream`."""
        if not self.config.content.enabled or self._content_tripped:
            return _NONE
        if not self._content.feed(chunk):
            return _NONE
        self._content_tripped = True
        snippet = self._content.snippet()
        if self.config.strikes is not None:
            hit = Hit("content", "critical", 1, "content", "")
            detail = f'Repeating content detected: "{snippet}..."'
            return self._strike(hit, detail, f"Reply cut off: {detail}")
        self._content_offences += 1
        if self._content_offences >= self.config.content.stop_at_offence:
            return Decision(
                level="break",
                detector="content",
                count=self._content_offences,
                message=f'The model kept repeating its own text: "{snippet}..."',
            )
        return Decision(
            level="critical",
            detector="content",
            count=self._content_offences,
            message=f'Reply cut off: it kept repeating "{snippet}..."',
            nudge=(
                "Your last reply was cut off because it kept repeating the same text "
                f'("{snippet}..."). Do not repeat yourself: continue with the next step, '
                "or give your final answer."
            ),
        )

    def new_stream(self) -> None:
        """A new model response begins: content tracking starts afresh."""
        self._content.reset()
        self._content_tripped = False
