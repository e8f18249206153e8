"""loopfuse uses only the public API of the HTTP and SDK packages it depends on (issue #18):
no private module of ``openai``, ``httpx2``, ``httpcore2``, ``httpx`` or ``aiohttp`` is
imported, and a module that imports one of them reads no ``_``-prefixed attribute of
anything but its own ``self``/``cls`` (the packages' objects are not told apart by type
here: in such a module every private attribute access counts). A ``getattr`` with a
private name, or a string that names a private module, counts too. A release of
one of those packages may then change anything private without breaking loopfuse; what is
public and relied on is pinned by ``tests/test_llm_contract.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("actors", "orchestrator", "bus", "bench")
PACKAGES = frozenset({"openai", "httpx2", "httpcore2", "httpx", "aiohttp"})
NAMED_TUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})
PRIVATE_MODULE = re.compile(r"^(?:openai|httpx2|httpcore2|httpx|aiohttp)(?:\.\w+)*\._\w")


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def problems(source: str) -> list[str]:
    """What in ``source`` reaches into a private part of :data:`PACKAGES`."""
    tree = ast.parse(source)
    found: list[str] = []
    imports_one = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in PACKAGES:
                    imports_one = True
                    if any(private(part) for part in parts[1:]):
                        found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] in PACKAGES:
                imports_one = True
                names = [alias.name for alias in node.names]
                if any(private(part) for part in parts[1:]) or any(map(private, names)):
                    found.append(f"line {node.lineno}: from {node.module} import {names}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and PRIVATE_MODULE.match(node.value)
        ):
            found.append(f"line {node.lineno}: {node.value!r}")
    if not imports_one:
        return found
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if node.attr in NAMED_TUPLE_API:
                continue
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and private(node.args[1].value)
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def sources() -> list[Path]:
    return sorted(p for top in SCANNED for p in (ROOT / top).rglob("*.py"))


def test_the_scan_finds_what_it_must() -> None:
    """Each kind of slip is seen (so an empty result below means something)."""
    slips = {
        "from openai._models import FinalRequestOptions": 1,
        "import httpx2._transports.default": 1,
        "from httpcore2 import _models": 1,
        "import openai\nclient._client._transport": 2,
        "import httpx2\nx = getattr(transport, '_pool')": 1,
        "import importlib\nimportlib.import_module('openai._base_client')": 1,
        "import openai\nself._client = 1\nfailure._replace(kind='x')": 0,
        "client._client  # no such package imported here": 0,
    }
    for source, count in slips.items():
        assert len(problems(source)) == count, (source, problems(source))


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_part_of_the_http_and_sdk_packages_is_used(path: Path) -> None:
    assert problems(path.read_text(encoding="utf-8")) == []
