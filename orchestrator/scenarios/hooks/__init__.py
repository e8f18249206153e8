"""Command hooks the shipped scenarios run as ``{python} -m orchestrator.scenarios.hooks.X``.

Each reads the proposed call as one JSON line on stdin and answers with its exit status
(0 allow, 2 block, 3 deny; see ``docs/hooks.md``). They use the standard library only.
"""
