"""Limits the tools and the tool executor work under (config, validated by msgspec)."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

__all__ = ["IMAGE_MAX_BYTES", "READ_CHARS", "FigureSandbox", "ToolExecutorSettings", "ToolLimits"]

READ_CHARS: Final = 7000
"""``read_file`` cuts its text at this many characters (seed 000: ``READ_CHARS``)."""

IMAGE_MAX_BYTES: Final = 72 * 1024
"""``read_image`` refuses larger files: the image travels as a base64 data URL in the tool
result (4/3 of its size), which must fit in the default ``max_result_chars``."""

IMAGE_RESULT_OVERHEAD: Final = 1_000
"""Characters of a ``read_image`` result besides the image's base64 (text, URL head)."""

_Positive = Annotated[int, msgspec.Meta(gt=0)]

FigureSandbox = Literal["bubblewrap", "unsafe-process"]
"""How ``make_figure`` runs model-written code: in a bubblewrap sandbox (refused when
bubblewrap cannot run), or, when the operator opts out, in a plain child process."""


class ToolLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the built-in file tools may read and show in one call."""

    read_chars: _Positive = READ_CHARS
    """``read_file`` text cut (characters)."""
    list_entries: _Positive = 500
    """``list_dir`` shows at most this many entries."""
    list_scan_entries: _Positive = 100_000
    """``list_dir`` reads at most this many entries of a directory (a directory of millions
    of empty files costs its owner little), and shows the first ``list_entries`` of them."""
    binary_probe_bytes: _Positive = 8192
    """A NUL byte in this many leading bytes makes a file binary."""
    max_scan_bytes: _Positive = 256 * 1024 * 1024
    """``read_file`` gives up past this many bytes read, whatever the lines' length (a huge
    ``offset``, or the rest of a multi-GiB line to skip)."""
    max_scan_seconds: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    """``read_file`` gives up after reading for this long (a slow file system)."""
    image_max_bytes: _Positive = IMAGE_MAX_BYTES
    """``read_image`` refuses image files larger than this (bytes)."""
    figure_sandbox: FigureSandbox = "bubblewrap"
    """``make_figure``'s sandbox (``tools.figure_sandbox``)."""


class ToolExecutorSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the tool executor runs calls."""

    default_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """Deadline of a call whose tool sets no ``timeout_seconds`` of its own."""
    max_result_chars: _Positive = 100_000
    """Results longer than this are cut, with a note saying how much."""
    max_parallel_calls: _Positive = 8
    """Calls of one reply that run at the same time; the rest wait their turn."""
    limits: ToolLimits = ToolLimits()

    def __post_init__(self) -> None:
        # A result longer than max_result_chars is cut, and a cut image is no image (the
        # cut note ends the text, so the model gets text, never a broken image). A cap set
        # on purpose must fit; the default one only lets images through when they fit.
        image_max_bytes = self.limits.image_max_bytes
        needed = 4 * -(-image_max_bytes // 3) + IMAGE_RESULT_OVERHEAD
        if image_max_bytes != IMAGE_MAX_BYTES and needed > self.max_result_chars:
            raise ValueError(
                f"limits.image_max_bytes: an image of {self.limits.image_max_bytes} bytes "
                f"needs {needed} characters in a tool result, more than max_result_chars "
                f"({self.max_result_chars}); raise max_result_chars or lower image_max_bytes"
            )
