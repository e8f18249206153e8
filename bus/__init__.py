"""loopfuse's bus: the vocabulary of typed messages and the in-process bus that carries them.

Knows nothing of OpenAI, HTTP or Prometheus; imports nothing else of loopfuse. Exports
what each of its modules exports (their ``__all__``).
"""

from __future__ import annotations

from bus import bus, causes, exit, messages, transcript
from bus.bus import *  # noqa: F403
from bus.causes import *  # noqa: F403
from bus.exit import *  # noqa: F403
from bus.messages import *  # noqa: F403
from bus.transcript import *  # noqa: F403

__all__ = bus.__all__ + causes.__all__ + exit.__all__ + messages.__all__ + transcript.__all__
