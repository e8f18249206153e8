"""``make_figure``: run model-written matplotlib code in the OS sandbox.

Offered only when matplotlib is installed (the ``[figures]`` extra). The code is checked
statically (a friendly early error), then run in a bubblewrap sandbox (see
:mod:`actors.tools.sandbox`) that sees the run's folder read-only (``read_text`` /
``data_path``) and saves with ``savefig(name)``; the files land in an output folder of the
call's own on the host, removed when the run finishes (a pipeline's stage run: when the
pipeline does, after its report took copies), or at once if the run finished meanwhile.
A refusal, a failure, or a machine where the sandbox cannot run (and the operator did not
opt into ``tools.figure_sandbox = "unsafe-process"``) is a tool error saying why.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import shutil
import tempfile
from collections.abc import Container
from pathlib import Path
from typing import Annotated, Any

import anyio
import msgspec

from actors.tools.context import ToolContext
from actors.tools.errors import ToolError
from actors.tools.limits import FigureSandbox
from actors.tools.registry import Tool
from actors.tools.sandbox import (
    SandboxRefused,
    SandboxUnavailable,
    run_sandboxed,
    sandbox_warning,
)

__all__ = ["MakeFigure", "figure_tool", "make_figure", "warn_about_figure_sandbox"]

DESCRIPTION = (
    "Run Python plotting code (matplotlib, numpy, math, statistics, csv, json) in a sandbox "
    "and save a figure with savefig('name.png') (a name of letters, digits, '.', '_', '-'). "
    "Read data with read_text('rel/path') or data_path('rel/path'); the data is read-only "
    "and there is no network. Refused: importing os/sys/subprocess or anything else not "
    "listed, open(), eval/exec, getattr, and any name or attribute starting with '_'."
)


class MakeFigure(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Plotting code to run in the sandbox."""

    code: Annotated[str, msgspec.Meta(min_length=1, max_length=20_000)]


async def make_figure(params: MakeFigure, ctx: ToolContext) -> str:
    """Check and run ``params.code``; return the figures it wrote."""
    if ctx.root is None:
        raise ToolError("invalid_arguments", "this run has no data folder to plot from")
    out = Path(tempfile.mkdtemp(prefix=f"loopfuse-figures-{ctx.run_id[:12]}-"))
    ctx.temporary.append(out)
    run = functools.partial(run_sandboxed, sandbox=ctx.limits.figure_sandbox)
    try:
        result = await anyio.to_thread.run_sync(run, params.code, ctx.root, out)
    except SandboxRefused as refused:
        raise ToolError("invalid_arguments", f"code refused by the sandbox: {refused}") from None
    except SandboxUnavailable as unavailable:
        raise ToolError("unavailable", str(unavailable)) from None
    finally:
        if ctx.finished:  # the executor removed the run's folders while this call ran
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(shutil.rmtree, out, True)
    if not result.ok:
        raise ToolError("failed", f"the code failed in the sandbox: {result.error}")
    if not result.outputs:
        return "The code ran but saved no figure; call savefig('name.png')."
    return "Saved: " + ", ".join(str(out / name) for name in result.outputs)


def figure_tool() -> Tool[Any] | None:
    """The ``make_figure`` tool, or ``None`` when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    return Tool(
        "make_figure",
        DESCRIPTION,
        MakeFigure,
        make_figure,
        timeout_seconds=60.0,
        needs_folder=True,
    )


async def warn_about_figure_sandbox(
    logger: logging.Logger, tools: Container[str], sandbox: FigureSandbox
) -> str | None:
    """At start-up: when ``make_figure`` is among ``tools``, log (warning) that its code
    runs without an OS sandbox (``unsafe-process``) or that every call will be refused
    (bubblewrap cannot run here). Returns the warning, ``None`` when all is well."""
    if "make_figure" not in tools:
        return None
    warning = await anyio.to_thread.run_sync(sandbox_warning, sandbox)
    if warning is not None:
        logger.warning(warning)
    return warning
