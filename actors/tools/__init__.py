"""Tools: the registry, the path guard, the built-in tools and scripted (fake) tools.

Exceptions::

    Exception
     └── ToolError(kind, message)   a tool's way to answer with an error result
"""

from __future__ import annotations

from actors.tools.builtin import builtin_tools, default_registry
from actors.tools.context import ToolContext
from actors.tools.errors import PATH_ERROR, ToolError
from actors.tools.finish import FinishExploration
from actors.tools.fs_list import ListDir
from actors.tools.fs_read import ReadFile
from actors.tools.invoke import Outcome, cap_text, invoke
from actors.tools.limits import READ_CHARS, ToolExecutorSettings, ToolLimits
from actors.tools.path_guard import guard_path
from actors.tools.registry import Tool, ToolFn, ToolRegistry
from actors.tools.schema import parameters_schema

__all__ = [
    "PATH_ERROR",
    "READ_CHARS",
    "FinishExploration",
    "ListDir",
    "Outcome",
    "ReadFile",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolExecutorSettings",
    "ToolFn",
    "ToolLimits",
    "ToolRegistry",
    "builtin_tools",
    "cap_text",
    "default_registry",
    "guard_path",
    "invoke",
    "parameters_schema",
]
