"""Running model-written plotting code (``make_figure``) in an OS sandbox.

The boundary is the operating system's: the code runs in a bubblewrap sandbox
(:mod:`~actors.tools.sandbox.bubblewrap`: new namespaces, a read-only view of only what
Python needs, no network, no environment, no new processes, rlimits, a wall-clock
timeout). Without a working bubblewrap the call is refused unless the operator chose
``tools.figure_sandbox = "unsafe-process"`` (:mod:`~actors.tools.sandbox.runner`).

The static check (:mod:`~actors.tools.sandbox.static_check`) and the driver's restricted
builtins (:mod:`~actors.tools.sandbox.driver`) stay as friendly early errors and defence
in depth; code can get around both, so neither is the boundary. ``docs/security.md``
("The make_figure sandbox") lists what is isolated and what is not.
"""

from actors.tools.sandbox.limits import SandboxLimits
from actors.tools.sandbox.runner import (
    SandboxUnavailable,
    run_process_layer,
    run_sandboxed,
    sandbox_warning,
)
from actors.tools.sandbox.static_check import SandboxRefused, check_code

__all__ = [
    "SandboxLimits",
    "SandboxRefused",
    "SandboxUnavailable",
    "check_code",
    "run_process_layer",
    "run_sandboxed",
    "sandbox_warning",
]
