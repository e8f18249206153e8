"""A run's prompt, message by message, as token estimates: what the gatekeeper keeps.

The ledger mirrors the conductor's transcript by position. It grows by the messages the
conductor reports (``extend``), and changes exactly where the gatekeeper asked the
conductor to change the transcript (``fold``, ``splice``). Every message is counted once,
when it first appears, so a turn costs O(new messages), never a re-count of the whole
transcript.
"""

from __future__ import annotations

from collections.abc import Iterable

from actors.context.records import Entry, Estimate
from actors.context.tokens import Estimator
from bus import ChatMessage, Fold

__all__ = ["Entry", "PromptLedger"]


class PromptLedger:
    """Token estimates of one run's transcript, kept in step with it."""

    __slots__ = (
        "_call_names",
        "bound",
        "entries",
        "estimator",
        "floor",
        "fold_scan",
        "longest_result",
        "tokens",
    )

    def __init__(self, estimator: Estimator) -> None:
        self.estimator = estimator
        self.entries: list[Entry] = []
        self.tokens = 0
        """The prompt's tokens (``total.tokens``, kept as a plain number)."""
        self.floor = 0
        """``total.floor``, likewise."""
        self.bound = 0
        """``total.bound``, likewise (0 for a model whose tokenizer is known)."""
        self.longest_result = 0
        """Characters of the longest tool result the last :meth:`extend` added (0: none)."""
        self._call_names: dict[str, str] = {}
        self.fold_scan = (0, 0)
        """``(min_chars, n)``: for that fold minimum, entries before ``n`` are folded or can
        never be folded, so collapse planning starts at ``n`` (a long run near its window
        plans every turn; without this, each plan re-read the whole history)."""

    def fold_scan_start(self, min_chars: int) -> int:
        """Where :func:`~actors.context.planning.plan_collapse` starts for ``min_chars``."""
        chars, start = self.fold_scan
        return start if chars == min_chars else 0

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def total(self) -> Estimate:
        """The estimate of the whole transcript: the sum of its entries'."""
        return Estimate(self.tokens, self.floor, self.bound)

    def extend(self, messages: Iterable[ChatMessage], turn: int) -> None:
        """Append ``messages`` (added in ``turn``), counting each."""
        entries, names, estimate_of = self.entries, self._call_names, self.estimator.message
        longest = 0
        for message in messages:  # every message of every run: no helper calls
            estimate = estimate_of(message)
            role, call_id, content = message.role, message.tool_call_id, message.content
            tool = None
            if role == "assistant":
                for call in message.tool_calls:
                    names[call.id] = call.name
            chars = 0 if content is None else len(content)
            if role == "tool" and call_id is not None:
                tool = names.pop(call_id, None)
                if chars > longest:
                    longest = chars
            entries.append(Entry(role, estimate, chars, turn, tool, call_id))
            self.tokens += estimate.tokens
            self.floor += estimate.floor
            self.bound += estimate.bound
        self.longest_result = longest

    def fold(self, fold: Fold, *, final: bool = True) -> None:
        """Put ``fold.stub`` in place of a tool result.

        ``final`` false (a result cut to fit, not folded): it may still be folded later."""
        entry = self.entries[fold.index]
        stub = self.estimator.message(
            ChatMessage(role="tool", tool_call_id=fold.call_id, content=fold.stub)
        )
        saved = entry.estimate - stub
        self.tokens -= saved.tokens
        self.floor -= saved.floor
        self.bound -= saved.bound
        # A cut result is unanswered, past where collapse planning stopped: no rescan.
        entry.estimate, entry.chars, entry.folded = stub, len(fold.stub), final

    def splice(self, start: int, end: int, message: ChatMessage, turn: int) -> None:
        """Replace entries ``start``..``end`` (exclusive) by ``message`` (a summary)."""
        self.extend((message,), turn)  # counted at the end first: a failed count changes nothing
        entry = self.entries.pop()
        for old in self.entries[start:end]:
            self.tokens -= old.estimate.tokens
            self.floor -= old.estimate.floor
            self.bound -= old.estimate.bound
        self.entries[start:end] = [entry]
        self.fold_scan = (0, 0)  # positions moved

    def reset(self) -> None:
        """Forget everything (before counting a transcript afresh)."""
        self.entries.clear()
        self._call_names.clear()
        self.tokens = self.floor = self.bound = 0
        self.fold_scan = (0, 0)

    def last_assistant(self) -> int:
        """Index of the last assistant message, or -1."""
        for index in range(len(self.entries) - 1, -1, -1):
            if self.entries[index].role == "assistant":
                return index
        return -1

    def first_user(self) -> int:
        """Index of the first user message (the task), or -1."""
        return next((i for i, entry in enumerate(self.entries) if entry.role == "user"), -1)
