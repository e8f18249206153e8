"""``make_figure``: run model-written matplotlib code under the two sandbox layers.

Offered only when matplotlib is installed (the ``[figures]`` extra). The code is checked
statically, then run in a separate limited process (see :mod:`actors.tools.sandbox`) that
sees the run's folder through ``data_path``/``read_text`` and writes into a per-run output
folder with ``savefig(name)``. A refusal or failure is a tool error naming the reason.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Annotated, Any

import anyio
import msgspec

from actors.tools.context import ToolContext
from actors.tools.errors import ToolError
from actors.tools.registry import Tool
from actors.tools.sandbox import SandboxRefused, run_sandboxed

__all__ = ["MakeFigure", "figure_tool", "make_figure"]

DESCRIPTION = (
    "Run Python plotting code (matplotlib, numpy, math, statistics, csv, json) and save a "
    "figure with savefig('name.png'). Read data with read_text('rel/path') or "
    "data_path('rel/path'). Refused: importing os/sys/subprocess or anything else not "
    "listed, open(), eval/exec, getattr, and any name or attribute starting with '_'."
)


class MakeFigure(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Plotting code to run in the sandbox."""

    code: Annotated[str, msgspec.Meta(min_length=1, max_length=20_000)]


async def make_figure(params: MakeFigure, ctx: ToolContext) -> str:
    """Check and run ``params.code``; return the figures it wrote."""
    if ctx.root is None:
        raise ToolError("invalid_arguments", "this run has no data folder to plot from")
    out = ctx.state.get("figure_dir")
    if not isinstance(out, Path):
        out = Path(tempfile.mkdtemp(prefix=f"loopfuse-figures-{ctx.run_id[:12]}-"))
        ctx.state["figure_dir"] = out
    try:
        result = await anyio.to_thread.run_sync(run_sandboxed, params.code, ctx.root, out)
    except SandboxRefused as refused:
        raise ToolError("invalid_arguments", f"code refused by the sandbox: {refused}") from None
    if not result.ok:
        raise ToolError("failed", f"the code failed in the sandbox: {result.error}")
    if not result.outputs:
        return "The code ran but saved no figure; call savefig('name.png')."
    return "Saved: " + ", ".join(str(out / name) for name in result.outputs)


def figure_tool() -> Tool[Any] | None:
    """The ``make_figure`` tool, or ``None`` when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    return Tool("make_figure", DESCRIPTION, MakeFigure, make_figure, timeout_seconds=60.0)
