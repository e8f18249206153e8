"""The built-in tools of seed 000: ``list_dir``, ``read_file``, ``read_image``,
``finish_exploration`` and (with matplotlib) ``make_figure``."""

from __future__ import annotations

from typing import Any

from actors.tools.figure import figure_tool
from actors.tools.finish import FinishExploration, finish_exploration
from actors.tools.fs_image import image_tool
from actors.tools.fs_list import ListDir, list_dir
from actors.tools.fs_read import ReadFile, read_file
from actors.tools.limits import READ_CHARS
from actors.tools.registry import Tool, ToolRegistry

__all__ = ["builtin_tools", "default_registry"]


def builtin_tools() -> tuple[Tool[Any], ...]:
    """Fresh instances of the built-in tools (``make_figure`` only with matplotlib). All of
    them work on the run's folder (``needs_folder``): a run without one is offered none.

    ``read_image`` is registered but, like every tool, offered only to runs that enable
    it: the report workflow enables it only for a vision-capable explore model.
    """
    figure = figure_tool()
    return (
        Tool(
            "list_dir",
            "List a directory of the folder: entries sorted by name, directories end with "
            "'/', files show their size.",
            ListDir,
            list_dir,
            idempotent=True,
            needs_folder=True,
        ),
        Tool(
            "read_file",
            f"Read a text file of the folder. Output is cut at {READ_CHARS} characters; "
            "when cut, a note says which offset (in lines) to pass to read on, with limit "
            "in lines.",
            ReadFile,
            read_file,
            idempotent=True,
            needs_folder=True,
        ),
        Tool(
            "finish_exploration",
            "Call once you understand the folder: record the experiment, its goal and the key "
            "findings. This ends the exploration.",
            FinishExploration,
            finish_exploration,
            finishes_stage=True,
            needs_folder=True,  # it records what the exploration of the folder found
        ),
        image_tool(),
        *((figure,) if figure is not None else ()),
    )


def default_registry() -> ToolRegistry:
    """A new registry holding the built-in tools."""
    return ToolRegistry(builtin_tools())
