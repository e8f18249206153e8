"""``compile``: the LaTeX report to PDF with the ``xelatex`` the one probe found."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Final

import anyio

__all__ = ["COMPILE_TIMEOUT_SECONDS", "compile_latex"]

COMPILE_TIMEOUT_SECONDS: Final = 120.0


async def compile_latex(xelatex: str, tex: Path) -> tuple[Path | None, str | None]:
    """Run ``xelatex`` on ``tex`` next to it; return the PDF, or ``None`` and why not."""
    command = [
        xelatex,
        "-interaction=nonstopmode",
        "-halt-on-error",
        "-no-shell-escape",
        f"-output-directory={tex.parent}",
        str(tex),
    ]
    with anyio.move_on_after(COMPILE_TIMEOUT_SECONDS) as scope:
        done = await anyio.run_process(command, check=False, stderr=subprocess.STDOUT)
    if scope.cancelled_caught:
        return None, f"xelatex took longer than {COMPILE_TIMEOUT_SECONDS:.0f} s"
    pdf = tex.with_suffix(".pdf")
    if done.returncode != 0 or not pdf.exists():
        tail = done.stdout.decode(errors="replace").strip().splitlines()[-3:]
        return None, f"xelatex exited {done.returncode}: {' / '.join(tail)}"
    return pdf, None
