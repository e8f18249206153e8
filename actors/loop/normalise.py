"""Result normalisation: what makes two tool results "the same result".

A result is cut into tokens by one linear-time RE2 pattern (``google-re2``), and a token
is replaced by its kind only when **its shape is a known volatile kind** (ids, digests,
times, temp paths, pod suffixes, random-looking nonces, the value after a volatile key)
and **no progress name stands before it**; so two results are the same exactly when they
differ in volatile tokens only. Operators add patterns (``[loop] result_patterns``),
applied after these by the same engine. A :class:`Normaliser` is made once per config.

Cost is bounded per result: a result longer than ``2 × EDGE_CHARS`` is normalised in its
first and last ``EDGE_CHARS`` characters only, and at most ``MAX_TOKENS`` tokens are
replaced per piece. Every shape and progress name: ``docs/loop-detection.md`` (Result
normalisation).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

import re2

from actors.loop.config import LoopConfig, compile_pattern

if TYPE_CHECKING:
    from re2 import _Regexp

__all__ = ["EDGE_CHARS", "MAX_TOKENS", "Normaliser", "is_progress_key"]

EDGE_CHARS: Final = 4000
"""Characters normalised at each end of a long result."""

MAX_TOKENS: Final = 512
"""Volatile tokens replaced per normalised piece (the rest of it is kept as it is)."""

_MONTH: Final = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\b"
)
_DAY: Final = (
    r"(?:Mon(?:day)?|Tue(?:sday)?|Wed(?:nesday)?|Thu(?:rsday)?|Fri(?:day)?|Sat(?:urday)?"
    r"|Sun(?:day)?)\b"
)
_CLOCK_TAIL: Final = r"\d\d:\d\d(?::\d\d(?:[.,]\d{1,9})?)?"
_ZONE: Final = (
    r"(?:Z\b|\s?[+-]\d\d:?\d\d\b"
    r"|\s?(?:GMT|UTC|UT|[ECMP][SD]T|CES?T|BST|IST|JST|KST|AES?T|AEDT|MSK|HK?T|SGT)\b)?"
)
"""A time zone after a time: ``Z``, an offset, or a common abbreviation (not any word)."""
_POD_CHARS: Final = "[bcdfghjklmnpqrstvwxz2456789]"
"""The alphabet Kubernetes draws generated name suffixes from (no vowels, no 0/1/3)."""

_ID_KEYS: Final = (
    r"pid|ppid|tid|thread[_-]?id|x-request-id|request[_-]?id|req[_-]?id|trace[_-]?id"
    r"|span[_-]?id|correlation[_-]?id|session(?:[_-]?id)?|sha(?:1|256)?|digest|hash|ref"
)
"""Keys whose value is volatile, after ``:``, ``=``, ``#`` or spaces (``pid 4411``)."""
_TIME_KEYS: Final = (
    r"timestamp|ts|time|date|uptime|elapsed|took|duration|latency|now"
    r"|generated(?:[_-]?at)?|checked(?:[_-]?at)?|updated(?:[_-]?at)?|created(?:[_-]?at)?"
)
"""Keys whose value is volatile after ``:``, ``=`` or ``#`` only (prose says "this time 3
tests failed")."""
_NONCE_KEYS: Final = r"nonce|e-?tag"
"""Keys whose value is volatile whatever it holds (no digit needed)."""

_COLON: Final = r"[\"']?[ \t]{0,3}[:=#][ \t]{0,3}[\"']?"
_SPACES: Final = r"[\"']?[ \t]{1,3}"
_VALUE: Final = r"W/\"[^\"\n]*\d[^\"\n]*\"|\"[^\"\n]*\d[^\"\n]*\"|[\w.:+/=-]*\d[\w.:+/=-]*"
"""A key's value holding a digit (``session expired`` is kept)."""
_ANY_VALUE: Final = r"W/\"[^\"\n]+\"|\"[^\"\n]+\"|[\w.:+/=-]+"

_KINDS: Final = ("kv", "kn", "time", "v", "clock", "syslog", "hex", "pod", "nonce")
"""The pattern's groups, in order: one per kind of token (each alternative has one)."""

_SHAPES: Final = (
    # a volatile key and its separator (kept), then its value (replaced)
    rf"(?P<kv>\b(?i:{_ID_KEYS})\b(?:{_COLON}|{_SPACES})|\b(?i:{_TIME_KEYS})\b{_COLON})"
    rf"(?:{_VALUE})",
    rf"(?P<kn>\b(?i:{_NONCE_KEYS})\b(?:{_COLON}|{_SPACES}))(?:{_ANY_VALUE})",
    # dates: ISO-8601 (also with slashes, compact), RFC 2822 / HTTP, CLF, ctime, syslog;
    # float and 13/16/19-digit epochs; durations
    rf"(?P<time>\b\d{{4}}[-/]\d\d[-/]\d\d(?:[T ]{_CLOCK_TAIL})?{_ZONE}"
    rf"|\b\d{{8}}T\d{{6}}(?:Z|[+-]\d{{4}})?"
    rf"|\b(?:{_DAY},?\s+)?\d{{1,2}}[ /-]{_MONTH}[ /-]\d{{2,4}}(?:[ :T]{_CLOCK_TAIL})?{_ZONE}"
    rf"|\b(?:{_DAY},?\s+)?{_MONTH}\s+\d{{1,2}}(?:,?\s+\d{{4}})?(?:\s+{_CLOCK_TAIL}{_ZONE}"
    r"(?:\s+\d{4})?)?"
    r"|\b1\d{9}\.\d{1,9}\b|\b1\d{12}(?:\d{3}(?:\d{3})?)?\b"
    r"|\b(?:\d+h)?(?:\d+m)?\d+(?:\.\d+)?(?:ms|us|µs|ns|s)\b(?:\d+(?:\.\d+)?(?:ms|us|µs|ns))?"
    r"|\b\d+(?:\.\d+)?\s?(?:[nuµm]?s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?)\b)",
    # UUIDs, ULIDs, addresses, temp paths, weak etags
    r"(?P<v>\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
    r"|\b[0-7][0-9A-HJKMNP-TV-Z]{25}\b|\b0[xX][0-9a-fA-F]{4,}\b"
    r"|(?:/private)?(?:/tmp|/var/tmp|/var/folders|/dev/shm)(?:/[\w.@%+=:,~-]+)+"
    r"|W/\"[^\"\n]+\")",
    r"(?P<clock>\b\d{1,3}:[0-5]\d(?::[0-5]\d)?(?:[.,]\d{1,9})?\b)",
    r"(?P<syslog>\b[A-Za-z][\w.-]*\[\d+\]:)",
    r"(?P<hex>\b[0-9a-fA-F]{7,}\b)",
    rf"(?P<pod>\b[a-z0-9](?:[a-z0-9-]*?[a-z0-9])?-(?:{_POD_CHARS}{{6,10}}-)?{_POD_CHARS}{{5}}\b)",
    # base64 with its padding (``/`` allowed), or unpadded base64 / base64url
    r"(?P<nonce>[A-Za-z0-9+/]{16,}={1,2}|(?:\b|\+)[A-Za-z0-9+_-]{16,})",
)
TOKEN_PATTERN: Final = "|".join(_SHAPES)
"""Every volatile shape, one alternation (RE2: linear in the text, leftmost match first),
matched on the result's UTF-8 bytes."""
_INNER_PATTERN: Final = "|".join(_SHAPES[:-1])
"""Every shape but the nonce: what a dashed token that is no nonce is scanned for again
(``00-<32 hex>-<16 hex>-01``, a W3C traceparent, is one nonce-shaped token holding two
hex ids)."""

_PROGRESS_WORDS: Final = frozenset(
    {
        "progress", "offset", "page", "pages", "count", "counter", "done", "status", "state",
        "total", "remaining", "left", "cursor", "next", "since", "after", "before",
        "position", "pos", "index", "idx", "seq", "sequence", "version", "generation",
        "revision", "rev", "commit", "checkpoint", "watermark", "processed", "completed",
        "complete", "synced", "sync", "step", "stage", "phase", "percent", "pct", "bytes",
        "size", "length", "lines", "items", "rows", "records", "valid", "paid", "passed",
        "failed", "succeeded", "errors", "attempt", "batch", "marker", "continuation",
        "resume", "high", "low", "max", "min", "last", "latest", "head", "tail", "epoch",
    }
)  # fmt: skip
"""Words of a key that say its value is progress (``last_synced_id``, ``nextPageToken``)."""

_VOLATILE_ID_WORDS: Final = frozenset(
    {"request", "req", "trace", "span", "correlation", "session", "thread", "process", "nonce"}
)
"""Words of an ``*_id`` key that say its value is not a cursor (``request_id``)."""

_KEY_BEFORE: Final = 48
"""Bytes looked at before a token for its key."""

_SEPARATORS: Final = b" \t\"':=#"
"""What stands between a key and its value (``"key": "``, ``key=``, ``key #``)."""
_KEY_CHARS: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_CLASSES: Final = bytes.maketrans(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_-",
    b"AAAAAAAAAAAAAAAAAAAAAAAAAAaaaaaaaaaaaaaaaaaaaaaaaaaa0000000000+++++",
)
_POD_SET: Final = frozenset(b"bcdfghjklmnpqrstvwxz2456789")
_DIGITS: Final = frozenset(b"0123456789")
_LOWER_ALNUM: Final = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789")
_REPLACEMENTS: Final = {kind: f"<{kind}>".encode() for kind in _KINDS}


_ANCHOR: Final = getattr(re2, "_Anchor", None)
_UNANCHORED: Final = None if _ANCHOR is None else _ANCHOR.UNANCHORED
_TOKENS: Final = compile_pattern("TOKEN_PATTERN", TOKEN_PATTERN.encode())
_INNER: Final = compile_pattern("_INNER_PATTERN", _INNER_PATTERN.encode())
assert _TOKENS.groups == len(_KINDS)
assert _INNER.groups == len(_KINDS) - 1


def _words(key: str) -> list[str]:
    """A key's words, lower case: ``lastSyncedId`` / ``last-synced_id`` → last, synced, id."""
    spaced: list[str] = []
    previous = ""
    for char in key:
        if char in "_-.":
            spaced.append(" ")
        elif char.isupper() and previous.islower():
            spaced.append(" " + char)
        else:
            spaced.append(char)
        previous = char
    return "".join(spaced).lower().split()


def is_progress_key(key: str) -> bool:
    """Whether the value after ``key`` is progress (kept whatever its shape)."""
    words = _words(key)
    if not words:
        return False
    if any(word in _PROGRESS_WORDS for word in words):
        return True
    return words[-1] == "id" and len(words) > 1 and not _VOLATILE_ID_WORDS.intersection(words)


def _key_before(data: bytes, start: int) -> str:
    """The identifier just before ``start``, separators (``": "``, ``=``, ``#`` …) skipped."""
    head = data[max(0, start - _KEY_BEFORE) : start].rstrip(_SEPARATORS)
    begin = len(head)
    while begin > 0 and head[begin - 1] in _KEY_CHARS:
        begin -= 1
    return head[begin:].decode("ascii")


def _random_looking(token: bytes) -> bool:
    """A base64 nonce rather than a word or a CamelCase name: upper and lower case letters
    and, unless padded with ``=`` (which names never are), a digit, ``+`` or ``/`` and the
    kind of character (upper, lower, digit) changing at least every third character."""
    body = token.rstrip(b"=")
    if len(body) < 16:
        return False
    classes = body.translate(_CLASSES)
    if b"a" not in classes or b"A" not in classes:
        return False
    if body != token:
        return True
    if b"0" not in classes and b"+" not in body and b"/" not in body:
        return False
    kinds = classes.replace(b"+", b"")  # letters and digits: ``my_name_2`` is not random
    changes = sum(1 for a, b in itertools.pairwise(kinds) if a != b)
    return 3 * changes >= len(body)


def _template_hash(segment: bytes) -> bool:
    """A ReplicaSet's pod-template hash: Kubernetes' vowel-free alphabet, or (older
    versions, other controllers) lower-case letters and digits holding a digit (a decimal
    hash too)."""
    return _POD_SET.issuperset(segment) or (
        _LOWER_ALNUM.issuperset(segment) and not _DIGITS.isdisjoint(segment)
    )


def _pod_name(token: bytes) -> bytes:
    """``web-7d9f8c6b5-x2k4p`` → ``web``: the name before the generated suffixes."""
    name = token[:-6]
    dash = name.rfind(b"-")
    segment = name[dash + 1 :]
    if dash >= 0 and 6 <= len(segment) <= 10 and _template_hash(segment):
        name = name[:dash]
    return name


Spans = list[tuple[int, int]]
"""A token's spans: ``[0]`` the whole token, then one per group, ``(-1, -1)`` for a group
that took no part."""


def _scan(pattern: _Regexp[bytes], data: bytes, pos: int, endpos: int) -> Iterator[Spans]:
    """Each match of ``pattern`` in ``data[pos:endpos]``, in order, as its spans: from the
    C++ binding (``_regexp``) in one call when the build has it (docs/performance.md), else
    through the public API."""
    native = getattr(pattern, "_regexp", None)
    if native is None or _UNANCHORED is None:  # pragma: no cover - another google-re2 build
        for match in pattern.finditer(data, pos, endpos):
            yield [match.span(group) for group in range(pattern.groups + 1)]
        return
    while pos < endpos:
        spans: Spans = native.Match(_UNANCHORED, data, pos, endpos)
        start, end = spans[0]
        if start < 0:
            return
        yield spans
        pos = end if end > start else end + 1  # no shape matches empty, but never stall


def _replacement(data: bytes, spans: Spans) -> bytes | None:
    """What a token of :func:`_tokens` is replaced by, or ``None`` to keep it."""
    group = 1
    while spans[group][0] < 0:  # the alternative that matched: the one group that took part
        group += 1
    kind = _KINDS[group - 1]
    start, end = spans[0]
    if kind in ("kv", "kn"):
        return data[start : spans[group][1]] + b"<id>"
    if kind == "syslog":
        return data[start : data.rindex(b"[", start, end) + 1] + b"<id>]:"
    token = data[start:end]
    if kind == "clock":
        before = data[start - 1 : start] if start else b" "
        after = data[end : end + 2]
        if (
            before in (b":", b".")
            or before.isalnum()
            or (after[:1] == b":" and after[1:].isdigit())
        ):
            return None  # file.py:12:34, 1.2:30, a version
    elif kind == "hex" and (token.isdigit() or _DIGITS.isdisjoint(token)):
        return None  # a plain number, or a word (``deadbeef``)
    if is_progress_key(_key_before(data, start)):
        return None
    if kind == "pod":
        return _pod_name(token) + b"-<pod>"
    return _REPLACEMENTS[kind]


def _tokens(data: bytes) -> Iterator[Spans]:
    """Every token of ``data``, in order; a nonce-shaped token that does not look random
    (:func:`_random_looking`) gives the tokens of the other shapes inside it instead."""
    nonce = len(_KINDS)
    for spans in _scan(_TOKENS, data, 0, len(data)):
        start, end = spans[0]
        if spans[nonce][0] < 0 or _random_looking(data[start:end]):
            yield spans
        else:
            yield from _scan(_INNER, data, start, end)


def _normalise(text: str) -> str:
    """``text`` with its volatile tokens replaced (``text`` itself when none is)."""
    data = text.encode("utf-8", "surrogatepass")
    pieces: list[bytes] = []
    end = 0
    for spans in _tokens(data):
        replacement = _replacement(data, spans)
        if replacement is None:
            continue
        start, stop = spans[0]
        pieces.append(data[end:start])
        pieces.append(replacement)
        end = stop
        if len(pieces) >= 2 * MAX_TOKENS:
            break
    if not pieces:
        return text
    pieces.append(data[end:])
    return b"".join(pieces).decode("utf-8", "surrogatepass")


class Normaliser:
    """The built-in tokens and the operator's patterns of one config, compiled once.
    ``normalise(text)`` returns ``text`` itself (the same object) when nothing changed."""

    __slots__ = ("_builtin", "_extra")

    def __init__(self, config: LoopConfig) -> None:
        self._extra: tuple[tuple[_Regexp[str], str], ...] = tuple(
            (compile_pattern(f"result_patterns.{i}.pattern", item.pattern), item.replacement)
            for i, item in enumerate(config.result_patterns)
        )
        self._builtin = config.normalise_results

    def __bool__(self) -> bool:
        return self._builtin or bool(self._extra)

    def normalise(self, text: str) -> str:
        """``text`` with its volatile tokens replaced and the operator's patterns applied
        (a long text: at both ends)."""
        if len(text) > 2 * EDGE_CHARS:
            middle = text[EDGE_CHARS:-EDGE_CHARS]
            return f"{self._sub(text[:EDGE_CHARS])}\x00{middle}\x00{self._sub(text[-EDGE_CHARS:])}"
        return self._sub(text)

    def _sub(self, text: str) -> str:
        if self._builtin:
            text = _normalise(text)
        for pattern, replacement in self._extra:
            changed = pattern.sub(replacement, text)
            if changed != text:
                text = changed
        return text
