"""Keep Python's cycle collector off what lives as long as the process.

A long-running loopfuse process holds a large, permanent heap: imported modules (the
``openai`` SDK's pydantic models among them) and the tokenizer's vocabulary. Every full
collection walks all of it, and with many runs in flight full collections come often.
:func:`freeze_long_lived` moves what exists at start-up to the collector's permanent
generation (:func:`gc.freeze`, as long-running CPython servers do), once per process.
Objects frozen are still freed by reference counting; only garbage cycles among them would
never be collected.
"""

from __future__ import annotations

import gc
import logging

from actors.context import FALLBACK_ENCODING, bpe_counter, encoding_for

__all__ = ["freeze_long_lived"]

logger = logging.getLogger("loopfuse.heap")

_frozen: list[bool] = []  # one True once frozen (a flag without a global statement)


def freeze_long_lived(model: str) -> bool:
    """Load ``model``'s tokenizer, then freeze the heap (the first call only).

    :returns: whether this call froze it.
    """
    if _frozen:
        return False
    try:
        bpe_counter(encoding_for(model) or FALLBACK_ENCODING)("warm up")
    except ImportError:  # no exact tokenizer: estimates fall back; nothing big to keep
        logger.debug("no tokenizer to load before freezing the heap")
    gc.freeze()
    _frozen.append(True)
    logger.debug("froze %d objects out of the cycle collector", gc.get_freeze_count())
    return True
