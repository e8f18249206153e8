"""The static check of model-written plotting code: a friendly early error, not a boundary.

Only allow-listed modules may be imported; ``open``, ``eval``, ``exec``, ``compile``,
``getattr`` & co., and any name or attribute starting with ``_`` (``().__class__``,
``__builtins__``) are refused, naming what and where. Code that passes can still reach
``os`` through an allowed module (``statistics.sys.modules['os']``): the OS sandbox
(:mod:`actors.tools.sandbox.bubblewrap`) is what contains it.
"""

from __future__ import annotations

import ast
from typing import Final

__all__ = ["ALLOWED_MODULES", "REFUSED_NAMES", "SandboxRefused", "check_code"]

ALLOWED_MODULES: Final = frozenset(
    {"matplotlib", "numpy", "math", "statistics", "csv", "json", "collections", "itertools"}
)
REFUSED_NAMES: Final = frozenset(
    {
        "open",
        "eval",
        "exec",
        "compile",
        "__import__",
        "getattr",
        "setattr",
        "delattr",
        "globals",
        "locals",
        "vars",
        "input",
        "breakpoint",
        "help",
        "memoryview",
        "exit",
        "quit",
    }
)


class SandboxRefused(ValueError):
    """The code was refused by the static check; the message names what and where."""


def check_code(code: str) -> tuple[str, ...]:
    """Refuse code that imports outside :data:`ALLOWED_MODULES`, names a refused builtin,
    or touches any name or attribute starting with ``_``.

    :returns: the modules the code imports (sorted), all allowed.
    :raises SandboxRefused: naming the first refused construct and its line.
    """
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise SandboxRefused(f"syntax error at line {exc.lineno}: {exc.msg}") from None
    imported: set[str] = set()
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        match node:
            case ast.Import(names=names):
                for alias in names:
                    imported.add(_check_module(alias.name, line))
            case ast.ImportFrom(module=module, level=level):
                if level:
                    raise SandboxRefused(f"line {line}: relative imports are refused")
                imported.add(_check_module(module or "", line))
            case ast.Name(id=name) if name in REFUSED_NAMES or name.startswith("_"):
                raise SandboxRefused(f"line {line}: the name {name!r} is refused")
            case ast.Attribute(attr=attr) if attr.startswith("_"):
                raise SandboxRefused(f"line {line}: the attribute {attr!r} is refused")
            case ast.alias(asname=asname) if asname and asname.startswith("_"):
                raise SandboxRefused(f"line {line}: the name {asname!r} is refused")
    return tuple(sorted(imported))


def _check_module(name: str, line: object) -> str:
    if name.split(".")[0] not in ALLOWED_MODULES:
        allowed = ", ".join(sorted(ALLOWED_MODULES))
        raise SandboxRefused(f"line {line}: import of {name!r} is refused (allowed: {allowed})")
    return name
