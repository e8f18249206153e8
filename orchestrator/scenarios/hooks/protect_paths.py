"""Block (exit 2) a call whose ``path`` argument lies inside a protected folder.

Usage: ``{python} -m orchestrator.scenarios.hooks.protect_paths FOLDER [FOLDER ...]``
(folders relative to the run's folder, e.g. ``raw/``). Any other call is allowed (exit 0).
The model reads the message on stderr as the tool error.
"""

from __future__ import annotations

import json
import posixpath
import sys

EXIT_ALLOW = 0
EXIT_BLOCK = 2


def main() -> int:
    call = json.loads(sys.stdin.readline() or "{}")
    arguments = call.get("arguments")
    path = arguments.get("path") if isinstance(arguments, dict) else None
    if not isinstance(path, str):
        return EXIT_ALLOW
    normal = posixpath.normpath(path)
    for folder in sys.argv[1:]:
        inside = posixpath.normpath(folder)
        if normal == inside or normal.startswith(inside + "/"):
            print(
                f"{path} is inside the protected folder {folder}: raw data must never be "
                "changed or deleted. Leave it alone and work on other files.",
                file=sys.stderr,
            )
            return EXIT_BLOCK
    return EXIT_ALLOW


if __name__ == "__main__":
    sys.exit(main())
