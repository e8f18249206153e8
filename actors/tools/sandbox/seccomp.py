"""A seccomp filter that lets sandboxed code start no new process (threads still work) and
make no shared memory outside its size-limited tmpfs.

bubblewrap loads it (``--seccomp FD``) right before it runs the command. ``fork``,
``vfork`` and a ``clone`` without ``CLONE_THREAD`` fail with ``EPERM``; so do
``memfd_create``, ``memfd_secret`` and ``shmget``, whose memory no tmpfs size or
``RLIMIT_AS`` bounds; ``clone3`` fails with ``ENOSYS`` so the C library falls back to
``clone``. A system call made in another ABI than the machine's own kills the process, so
no second syscall table slips past the filter (``docs/security.md``, The make_figure sandbox).

Why a filter on top of ``RLIMIT_NPROC``: the kernel does not enforce that limit for a
process whose real user is root, and the daemon may run as root (containers). ``None``
on machines other than x86-64 and arm64: there only ``RLIMIT_NPROC`` bounds processes.
"""

from __future__ import annotations

import errno
import platform
import struct
import sys
from typing import Final

__all__ = ["no_new_processes"]

# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
_LD_ABS: Final = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ: Final = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE: Final = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET: Final = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET: Final = 0x06  # BPF_RET | BPF_K
_ALLOW: Final = 0x7FFF0000
_KILL_PROCESS: Final = 0x80000000
_ERRNO: Final = 0x00050000
# The program's fixed tail, in order: each jump label's return value.
_TAIL: Final = {
    "allow": _ALLOW,
    "eperm": _ERRNO | errno.EPERM,
    "enosys": _ERRNO | errno.ENOSYS,
    "kill": _KILL_PROCESS,
}

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
_NR: Final = 0
_ARCH: Final = 4
_ARG0_LOW: Final = 16 if sys.byteorder == "little" else 20

_CLONE_THREAD: Final = 0x00010000
_X32_BIT: Final = 0x40000000


class _Arch:
    def __init__(self, audit: int, clone: int, clone3: int, denied: tuple[int, ...]) -> None:
        self.audit, self.clone, self.clone3, self.denied = audit, clone, clone3, denied


_ARCHES: Final = {
    # fork, vfork, memfd_create, memfd_secret, shmget
    "x86_64": _Arch(audit=0xC000003E, clone=56, clone3=435, denied=(57, 58, 319, 447, 29)),
    # memfd_create, memfd_secret, shmget (no fork or vfork on arm64: clone does both)
    "aarch64": _Arch(audit=0xC00000B7, clone=220, clone3=435, denied=(279, 447, 194)),
}
_ALIASES: Final = {"amd64": "x86_64", "arm64": "aarch64"}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _program(arch: _Arch) -> bytes:
    # Jump targets are counted from the next instruction; the tail is fixed:
    # ... | ALLOW | DENY(EPERM) | DENY(ENOSYS) | KILL
    body: list[tuple[int, int, str | None, str | None]] = [
        (_LD_ABS, _ARCH, None, None),
        (_JEQ, arch.audit, None, "kill"),
        (_LD_ABS, _NR, None, None),
    ]
    if arch.audit == 0xC000003E:
        body.append((_JGE, _X32_BIT, "kill", None))
    body += [(_JEQ, nr, "eperm", None) for nr in arch.denied]
    body += [
        (_JEQ, arch.clone3, "enosys", None),
        (_JEQ, arch.clone, None, "allow"),
        (_LD_ABS, _ARG0_LOW, None, None),
        (_JSET, _CLONE_THREAD, "allow", "eperm"),
    ]
    tail = {label: len(body) + i for i, label in enumerate(_TAIL)}

    def offset(at: int, label: str | None) -> int:
        return 0 if label is None else tail[label] - at - 1

    code = b"".join(
        _insn(op, k, offset(at, jt), offset(at, jf)) for at, (op, k, jt, jf) in enumerate(body)
    )
    return code + b"".join(_insn(_RET, k) for k in _TAIL.values())


def no_new_processes(machine: str | None = None) -> bytes | None:
    """The compiled filter (``struct sock_filter`` array) for ``machine`` (default: this
    one), or ``None`` when there is none for its architecture."""
    name = (machine or platform.machine()).lower()
    arch = _ARCHES.get(_ALIASES.get(name, name))
    return None if arch is None else _program(arch)
