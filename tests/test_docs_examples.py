"""Executable documentation (#30): every shell and Python block of README.md and docs/*.md
runs as written, and every relative link resolves.

The rules, per fenced block (parsed with markdown-it-py, the CommonMark parser):

- ``sh`` blocks run in bash (``set -e``), ``python`` blocks with this test's Python. A block
  fails on a non-zero exit or a traceback in its output.
- An untagged block whose first line starts with ``$ `` is a transcript: each ``$ `` line is
  run, its exit status is not checked (a transcript shows failures too), no traceback may
  appear, and the output must contain the words the transcript's first output line starts
  with (up to the first word holding a digit, an ellipsis or a path: ids, counts and times
  differ from run to run).
- ``toml`` blocks must parse (``tomllib``); one whose first line is ``# NAME.toml`` is also
  written to ``NAME.toml`` for the page's later blocks. Other blocks (output, diagrams,
  synopses, JSON, nginx) are not run.
- The blocks of one page run in order, in one test and one temporary directory of their
  own, as a reader would run them: a later block may use a file an earlier one wrote; the
  checkout's ``docs/examples`` is there at that path, as in a clone. The
  environment has this virtualenv's ``bin`` first on ``PATH``, this checkout on
  ``PYTHONPATH``, no ``LOOPFUSE_*`` variables and a private ``XDG_STATE_HOME``.
- Install steps are no-ops by the table :data:`NO_OPS` (the suite runs in an installed
  virtualenv already), each with its reason.
- A block that cannot run here is marked in the Markdown, right before it, with
  ``<!-- docs-test: skip reason="…" -->``. The marks are counted (:data:`SKIPS_EXPECTED`),
  so their number cannot grow unnoticed; ``-s`` prints the list.
- :data:`XFAIL` lists the blocks that fail today because of a bug owned elsewhere, each
  with its issue item: such a block must still fail, so an entry is removed once fixed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

REPO: Final = Path(__file__).resolve().parent.parent
PAGES: Final = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
BIN: Final = Path(sys.executable).parent
BLOCK_TIMEOUT_SECONDS: Final = 120

NO_OPS: Final = {
    r"python3 -m venv \S+": "the suite runs in a virtualenv already",
    r"\. \.venv/bin/activate": "the suite's virtualenv is first on PATH",
    r"pip install (-q )?(-e )?\S+( \S+)*": "scripts/test installed loopfuse and its extras",
}
"""Install steps a block's command line may hold (one ``&&`` segment, a whole line, a
trailing comment allowed), replaced by ``:``, and why."""

SKIPS_EXPECTED: Final = 27
"""How many blocks carry a ``docs-test: skip`` mark. Adding one means changing this."""

XFAIL: Final[dict[tuple[str, str], str]] = {}
"""``(page, text in the block)`` → why it fails today (an issue item another branch fixes).
Each must still fail: remove the entry once its fix is merged."""

_SKIP_MARK: Final = re.compile(r"<!--\s*docs-test:\s*skip\s+reason=\"([^\"]+)\"\s*-->")
_TRACEBACK: Final = "Traceback (most recent call last)"
_FILE_COMMENT: Final = re.compile(r"# ([\w.-]+\.toml)\s*\n")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based, the opening fence
    lang: str
    text: str
    skip: str | None  # the reason of a docs-test skip mark

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def _tokens(page: Path) -> list[Token]:
    return MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))


def blocks_of(page: Path) -> Iterator[Block]:
    """The fenced blocks of ``page``, each with the skip mark right before it, if any."""
    previous: Token | None = None
    for token in _tokens(page):
        if token.type == "fence" and token.map is not None:
            mark = None
            if previous is not None and previous.type == "html_block":
                found = _SKIP_MARK.search(previous.content)
                mark = found.group(1) if found else None
            lang = token.info.split()[0] if token.info.strip() else ""
            yield Block(page, token.map[0] + 1, lang, token.content, mark)
        previous = token


BLOCKS: Final = [block for page in PAGES for block in blocks_of(page)]
RUN: Final = [
    b
    for b in BLOCKS
    if b.lang in ("sh", "python")
    or (not b.lang and b.text.startswith("$ "))
    or (b.lang == "toml" and _FILE_COMMENT.match(b.text))
]


def _is_no_op(segment: str) -> str | None:
    bare = segment.split("  #", 1)[0].strip()
    for pattern, why in NO_OPS.items():
        if re.fullmatch(pattern, bare):
            return why
    return None


def shell_script(text: str) -> str:
    """``text`` with each install step (:data:`NO_OPS`) replaced by ``:``."""
    lines = []
    for line in text.splitlines():
        segments = line.split(" && ")
        kept = [":" if _is_no_op(s) else s for s in segments]
        lines.append(" && ".join(kept))
    return "\n".join(lines) + "\n"


def _environment(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPFUSE_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    env["VIRTUAL_ENV"] = str(BIN.parent)
    env["XDG_STATE_HOME"] = str(workdir / ".state")
    env["NO_COLOR"] = "1"
    return env


def _run(argv: list[str], workdir: Path, stdin: str | None = None) -> tuple[int, str]:
    done = subprocess.run(
        argv,
        cwd=workdir,
        env=_environment(workdir),
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_SECONDS,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def stable_words(line: str) -> str:
    """The words ``line`` starts with, up to the first that differs from run to run."""
    kept = []
    for word in line.split():
        if any(c.isdigit() for c in word) or "…" in word or "/" in word:
            break
        kept.append(word)
    return " ".join(kept)


def run_block(block: Block, workdir: Path) -> list[str]:
    """Run ``block`` in ``workdir``; what went wrong (empty: it ran as documented)."""
    if block.lang == "python":
        script = workdir / f"block_{block.line}.py"
        script.write_text(block.text, encoding="utf-8")
        status, output = _run([sys.executable, script.name], workdir)
        return _problems(status, output)
    if block.lang == "toml":
        named = _FILE_COMMENT.match(block.text)
        assert named is not None
        tomllib.loads(block.text)
        (workdir / named.group(1)).write_text(block.text, encoding="utf-8")
        return []
    if block.lang == "sh":
        status, output = _run(["bash", "-e", "-c", shell_script(block.text)], workdir)
        return _problems(status, output)
    problems: list[str] = []
    for command, expected in _transcript(block.text):
        status, output = _run(["bash", "-c", shell_script(command)], workdir)
        if _TRACEBACK in output:
            problems.append(f"$ {command}: a traceback:\n{output[-3000:]}")
        words = stable_words(expected[0]) if expected else ""
        if words and words not in output:
            problems.append(f"$ {command}: output lacks {words!r}:\n{output[-3000:]}")
    return problems


def _problems(status: int, output: str) -> list[str]:
    problems = []
    if status != 0:
        problems.append(f"exit status {status}")
    if _TRACEBACK in output:
        problems.append("a traceback")
    return [f"{', '.join(problems)}:\n{output[-3000:]}"] if problems else []


def _transcript(text: str) -> Iterator[tuple[str, list[str]]]:
    """``(command, expected output lines)`` of each ``$ `` line of a transcript."""
    command: str | None = None
    expected: list[str] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            if command is not None:
                yield command, expected
            command, expected = line[2:], []
        elif line.strip():
            expected.append(line)
    if command is not None:
        yield command, expected


def _xfail_of(block: Block) -> str | None:
    page = str(block.page.relative_to(REPO))
    for (where, text), why in XFAIL.items():
        if where == page and text in block.text:
            return why
    return None


RUN_PAGES: Final = [page for page in PAGES if any(b.page == page for b in RUN)]


@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(REPO)) for p in RUN_PAGES])
def test_documented_blocks_run(page: Path, tmp_path: Path) -> None:
    """The page's blocks run in order in one directory, as a reader runs them: one test per
    page, so a later block never lands on another worker than the block it builds on."""
    # the example files a clone has, at the paths the pages name (docs/examples/...)
    shutil.copytree(REPO / "docs" / "examples", tmp_path / "docs" / "examples")
    failures = []
    for block in (b for b in RUN if b.page == page):
        if block.skip is not None:
            print(f"{block.name}: docs-test: skip reason={block.skip!r}")
            continue
        problems = run_block(block, tmp_path)
        known = _xfail_of(block)
        if known is not None:
            if not problems:
                failures.append(f"{block.name} runs now: remove its XFAIL entry ({known})")
            continue
        if problems:
            failures.append(f"{block.name} ({block.lang or 'transcript'}):\n" + "\n".join(problems))
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "toml"], ids=lambda b: b.name)
def test_documented_toml_parses(block: Block) -> None:
    if block.skip is None:
        tomllib.loads(block.text)


def test_skip_marks_are_counted() -> None:
    marked = [b for b in BLOCKS if b.skip is not None]
    for b in marked:
        print(f"docs-test skip: {b.name} ({b.lang}): {b.skip}")
    stray = [  # every mark, wherever it is (in a code span, it is text, not a mark)
        f"{page.relative_to(REPO)}: {match}"
        for page in PAGES
        for token in _tokens(page)
        if token.type == "html_block"
        for match in _SKIP_MARK.findall(token.content)
    ]
    assert len(stray) == len(marked), "a skip mark not right before a fenced block"
    assert len(marked) == SKIPS_EXPECTED, [f"{b.name}: {b.skip}" for b in marked]


def test_every_xfail_entry_names_a_block() -> None:
    for (page, text), why in XFAIL.items():
        assert any(_xfail_of(b) == why for b in RUN), (page, text)


def test_a_command_block_is_tagged_sh() -> None:
    """An untagged block is not run, so a command a reader would type is tagged ``sh``
    (synopses with ``[OPTIONS]`` and ``$`` transcripts aside)."""
    commands = re.compile(
        r"^(pip install|python3? -m|curl"
        r"|loopfuse (--config|demo|run|serve|report|runs|watch|sim|scenarios)) "
    )
    untagged = [
        b.name
        for b in BLOCKS
        if not b.lang
        and commands.match(b.text)
        and not re.search(r"\[-|\|", b.text)
        and not b.text.startswith("$ ")
    ]
    assert untagged == []


# --------------------------------------------------------------------------- links


_HTML_ANCHOR: Final = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    tokens = _tokens(page)
    seen: dict[str, int] = {}
    anchors = set()
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            slug = _slug(tokens[index + 1].content.replace("`", ""))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    # an explicit anchor (<a id="..."></a>), which GitHub also links to
    anchors.update(_HTML_ANCHOR.findall(page.read_text(encoding="utf-8")))
    return anchors


def _links(page: Path) -> Iterator[str]:
    for token in _tokens(page):
        for child in token.children or ():
            if child.type == "link_open":
                yield str(child.attrs.get("href", ""))


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for href in _links(page):
            if re.match(r"^[a-z]+:", href) or href.startswith("//"):
                continue  # http:, https:, mailto:
            path, _, anchor = href.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists() or REPO not in (target, *target.parents):
                broken.append(f"{page.relative_to(REPO)}: {href} (no such file in the repo)")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{page.relative_to(REPO)}: {href} (no such heading)")
    assert broken == []


_REPO_PATH: Final = re.compile(
    r"(?:orchestrator|actors|bus|tests|bench|docs|scripts|deploy|\.ci)/[\w./*-]*"
)


def test_every_file_named_in_the_prose_is_in_the_repository() -> None:
    """A path in a code span (``orchestrator/sim/inprocess.py``, ``tests/test_*.py``, a
    module path without ``.py``) names something in the repository."""
    missing = []
    for page in PAGES:
        for token in _tokens(page):
            for child in token.children or ():
                words = child.content.split()
                if child.type != "code_inline" or not words:
                    continue
                path = words[0].split(":")[0].rstrip(".,")
                if not _REPO_PATH.fullmatch(path):
                    continue
                found = (
                    any(REPO.glob(path))
                    if "*" in path
                    else (REPO / path).exists() or (REPO / f"{path}.py").exists()
                )
                if not found:
                    missing.append(f"{page.relative_to(REPO)}: {path}")
    assert missing == []
