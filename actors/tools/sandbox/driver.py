"""The script that runs inside the sandbox: limits, then the model's code, then its files.

Never imported by loopfuse: :mod:`actors.tools.sandbox.runner` passes this file's source
to ``python -I -c`` with one JSON argument (the folders, the allow-list, the limits) and
the model's code on stdin. Standard library only.

In order: the original stdout becomes the private result channel and fd 1 points at
stderr (the code's ``print`` goes to the error log); the rlimits are set (the kernel
enforces them from here on, and they cannot be raised again); the code runs with
restricted builtins and an import hook for the allow-list (defence in depth only: the code
can get around both, the OS sandbox around this process is the boundary); then every
regular file in the output folder is written to the result channel as
``name SIZE\\n`` + bytes, after a header line, ending with ``end\\n``
(:mod:`actors.tools.sandbox.outputs` reads it).
"""

import builtins
import json
import os
import re
import resource
import stat
import sys
from typing import Any, BinaryIO

HEADER = b"loopfuse-figures 1\n"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def set_limits(limits: dict[str, int]) -> None:
    cpu = limits["cpu_seconds"]
    # SIGXCPU at the soft limit, SIGKILL a second later if it is ignored.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for name, key in (
        ("RLIMIT_AS", "memory_bytes"),
        ("RLIMIT_FSIZE", "file_bytes"),
        ("RLIMIT_NOFILE", "open_files"),
        ("RLIMIT_NPROC", "processes"),
    ):
        resource.setrlimit(getattr(resource, name), (limits[key], limits[key]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main() -> int:
    config = json.loads(sys.argv[1])
    data, out = config["data"], config["out"]
    allowed, refused = set(config["allowed"]), set(config["refused"])
    code = sys.stdin.read()
    result = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    set_limits(config["limits"])
    real_import = builtins.__import__

    def guarded(
        name: str,
        globals: Any = None,
        locals: Any = None,
        fromlist: Any = (),
        level: int = 0,
    ) -> Any:
        if level or name.split(".")[0] not in allowed:
            raise ImportError(f"import of {name!r} is refused")
        return real_import(name, globals, locals, fromlist, level)

    def output(name: str) -> str:
        name = os.path.basename(name)
        if not NAME.fullmatch(name):
            raise ValueError(f"{name!r}: a file name of letters, digits, '.', '_' and '-'")
        return os.path.join(out, name)

    def data_path(rel: str) -> str:
        path = os.path.realpath(os.path.join(data, rel))
        if path != data and not path.startswith(data + os.sep):
            raise PermissionError(f"{rel!r} is outside the allowed folder")
        return path

    def read_text(rel: str) -> str:
        with open(data_path(rel), encoding="utf-8") as f:
            return f.read()

    def savefig(name: str, **kwargs: object) -> None:
        import matplotlib.pyplot as plt

        plt.savefig(output(name), **kwargs)

    def write_text(name: str, text: object) -> None:
        with open(output(name), "w", encoding="utf-8") as f:
            f.write(str(text))

    safe = {k: v for k, v in vars(builtins).items() if k not in refused and not k.startswith("_")}
    safe["__import__"] = guarded
    safe["__build_class__"] = builtins.__build_class__
    namespace = {
        "__name__": "__sandbox__",
        "__builtins__": safe,
        "DATA_DIR": data,
        "OUT_DIR": out,
        "data_path": data_path,
        "read_text": read_text,
        "savefig": savefig,
        "write_text": write_text,
    }
    try:
        exec(compile(code, "<figure>", "exec"), namespace)
    except BaseException as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        write_outputs(out, result)
    except OSError as exc:
        print(f"the figures could not be passed back: {exc}", file=sys.stderr)
        return 1
    return 0


def write_outputs(out: str, result: BinaryIO) -> None:
    result.write(HEADER)
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if not NAME.fullmatch(name) or not stat.S_ISREG(os.lstat(path).st_mode):
            continue  # subfolders, links, odd names: not a figure
        with open(path, "rb") as f:
            content = f.read()
        result.write(b"%s %d\n" % (name.encode(), len(content)))
        result.write(content)
    result.write(b"end\n")
    result.flush()


if __name__ == "__main__":
    sys.exit(main())
