"""What one sandboxed run may use."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SandboxLimits"]


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """The wall clock is the runner's; the rest are rlimits the driver sets on itself
    before the model's code runs (inherited, and never raised again), or tmpfs sizes."""

    timeout_seconds: float = 30.0
    """Wall clock: then the whole sandbox is killed."""
    cpu_seconds: int = 30
    """``RLIMIT_CPU``."""
    memory_bytes: int = 1 << 30
    """``RLIMIT_AS``: address space of the process."""
    file_bytes: int = 20 << 20
    """``RLIMIT_FSIZE``, and the size of the output tmpfs: the figures of one call."""
    tmp_bytes: int = 64 << 20
    """The size of the sandbox's ``/tmp`` (a tmpfs: memory not counted in
    ``memory_bytes``)."""
    open_files: int = 64
    """``RLIMIT_NOFILE``."""
    processes: int = 32
    """``RLIMIT_NPROC`` (threads count). The kernel does not apply it to root; the
    seccomp filter stops new processes whoever runs the daemon."""

    def rlimits(self) -> dict[str, int]:
        """The driver's share, by name."""
        names = ("cpu_seconds", "memory_bytes", "file_bytes", "open_files", "processes")
        return {name: getattr(self, name) for name in names}
