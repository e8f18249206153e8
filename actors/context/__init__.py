"""Context limits: token estimates, model windows, and collapse/compaction planning.

Pure code the context gatekeeper (``actors.context.gatekeeper``) plans with and the
conductor carries plans out with: :class:`Estimator` counts prompt pieces (exact for
OpenAI models, bounded elsewhere), :class:`PromptLedger` keeps one run's
prompt as per-message estimates, :class:`Calibration` learns from reported usage, and
:mod:`~actors.context.planning` decides what to fold or summarise.
"""

from __future__ import annotations

from actors.context.calibration import Calibration
from actors.context.ledger import Entry, PromptLedger
from actors.context.planning import (
    COMPACT_NUDGE_KIND,
    MESSAGE_CHARS,
    SUMMARY_NUDGE_KIND,
    Span,
    apply_folds,
    compaction_prompt,
    fold_stub,
    pairing_problems,
    plan_collapse,
    plan_compaction,
    summary_message,
)
from actors.context.policy import SAFETY_BUFFER, ContextPolicy, policy_problems
from actors.context.tokens import (
    FALLBACK_ENCODING,
    FALLBACK_MARGIN,
    Estimate,
    Estimator,
    TextCounter,
    bpe_counter,
)
from actors.context.windows import (
    DEFAULT_WINDOW,
    MODEL_ENCODINGS,
    MODEL_WINDOWS,
    Encoding,
    configured_window,
    encoding_for,
    match_model,
    warn_default_window,
    window_for,
)

__all__ = [
    "COMPACT_NUDGE_KIND",
    "DEFAULT_WINDOW",
    "FALLBACK_ENCODING",
    "FALLBACK_MARGIN",
    "MESSAGE_CHARS",
    "MODEL_ENCODINGS",
    "MODEL_WINDOWS",
    "SAFETY_BUFFER",
    "SUMMARY_NUDGE_KIND",
    "Calibration",
    "ContextPolicy",
    "Encoding",
    "Entry",
    "Estimate",
    "Estimator",
    "PromptLedger",
    "Span",
    "TextCounter",
    "apply_folds",
    "bpe_counter",
    "compaction_prompt",
    "configured_window",
    "encoding_for",
    "fold_stub",
    "match_model",
    "pairing_problems",
    "plan_collapse",
    "plan_compaction",
    "policy_problems",
    "summary_message",
    "warn_default_window",
    "window_for",
]
