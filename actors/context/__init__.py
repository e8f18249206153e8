"""Context limits: token estimates, model windows, and collapse/compaction planning.

Pure code the context gatekeeper (``actors.context.gatekeeper``) plans with and the
conductor carries plans out with: :class:`Estimator` counts prompt pieces (exact for
OpenAI models, bounded elsewhere), :class:`PromptLedger` keeps one run's
prompt as per-message estimates, :class:`Calibration` learns from reported usage, and
:mod:`~actors.context.planning` decides what to fold or summarise.
The package exports what each of these modules exports (their ``__all__``).
"""

from __future__ import annotations

from actors.context import calibration, ledger, planning, policy, tokens, windows
from actors.context.calibration import *  # noqa: F403
from actors.context.ledger import *  # noqa: F403
from actors.context.planning import *  # noqa: F403
from actors.context.policy import *  # noqa: F403
from actors.context.tokens import *  # noqa: F403
from actors.context.windows import *  # noqa: F403

__all__ = []
__all__ += calibration.__all__
__all__ += ledger.__all__
__all__ += planning.__all__
__all__ += policy.__all__
__all__ += tokens.__all__
__all__ += windows.__all__
