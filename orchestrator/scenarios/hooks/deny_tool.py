"""Deny every call this hook is asked about (exit 3): the run stops, ``hook.<name>``.

Usage: ``{python} -m orchestrator.scenarios.hooks.deny_tool [REASON]``; limit the tools it
judges with the hook's ``tools`` list.
"""

from __future__ import annotations

import json
import sys

EXIT_DENY = 3


def main() -> int:
    reason = " ".join(sys.argv[1:]) or "this tool is not allowed here"
    call = json.loads(sys.stdin.readline() or "{}")
    print(f"{call.get('tool', 'this tool')} is denied: {reason}", file=sys.stderr)
    return EXIT_DENY


if __name__ == "__main__":
    sys.exit(main())
