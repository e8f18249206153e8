"""Issue #32 items 1 and 2: a result normaliser that can't erase progress, and catches the
volatile tokens real tools print every call (property tests).

Generated results embed each volatile kind (UUIDs, ULIDs, digests, etags, timestamps in
every common format, float and integer epochs, elapsed timers, durations, pids, temp paths,
memory addresses, request ids, Kubernetes pod names, base64 nonces) and each progress kind
(``last_synced_id: 18234``, ``job 3 of 10``, ``valid: 1200``, ``paid 14``, a 10-digit byte
count, percentages, page numbers, JSON fields):

* a result sequence where any progress value changes is never "the same result";
* a result sequence where only volatile noise changes is "the same result".

Volatile tokens are drawn as real tools make them: from a seeded random source (a
"nonce" of sixteen zero bytes is not one any tool prints).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import random
import uuid
from collections.abc import Callable
from email.utils import format_datetime

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.fingerprint import fingerprint_result
from actors.loop import PRESETS, LoopConfig, LoopConfigError, LoopDetector, load_config
from actors.loop.config import ResultPattern
from actors.loop.normalise import EDGE_CHARS, MAX_TOKENS, Normaliser, is_progress_key

NORMALISER = Normaliser(LoopConfig())

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_POD = "bcdfghjklmnpqrstvwxz2456789"
_B62 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_EPOCH_MIN = 1_000_000_000  # 2001-09-09: 10-digit epochs
_EPOCH_MAX = 1_999_999_999  # 2033-05-18


def _when(rng: random.Random) -> dt.datetime:
    seconds = rng.randrange(_EPOCH_MIN, _EPOCH_MAX)
    return dt.datetime.fromtimestamp(seconds, dt.UTC).replace(microsecond=rng.randrange(10**6))


def _nonce(rng: random.Random) -> str:
    return base64.b64encode(rng.randbytes(rng.choice([16, 32]))).decode()


def _base62(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(_B62) for _ in range(size))


def _pod(deployment: str) -> Callable[[random.Random], str]:
    def render(r: random.Random) -> str:
        template = "".join(r.choice(_POD) for _ in range(r.choice([8, 9, 10])))
        suffix = "".join(r.choice(_POD) for _ in range(5))
        return f"pod {deployment}-{template}-{suffix} Pending"

    return render


def _formatted(label: str, form: str, zone: dt.tzinfo = dt.UTC) -> Callable[[random.Random], str]:
    return lambda r: f"{label} {_when(r).astimezone(zone).strftime(form)}"


VOLATILE: dict[str, Callable[[random.Random], str]] = {
    "uuid": lambda r: f"job {uuid.UUID(int=r.getrandbits(128), version=4)} queued",
    "ulid": lambda r: (
        "event " + r.choice("01234567") + "".join(r.choice(_CROCKFORD) for _ in range(25))
    ),
    "sha256": lambda r: f"digest sha256:{hashlib.sha256(r.randbytes(32)).hexdigest()}",
    "md5": lambda r: f"md5 {hashlib.md5(r.randbytes(32)).hexdigest()}  a.tar",
    "git": lambda r: f"HEAD detached at {hashlib.sha1(r.randbytes(32)).hexdigest()}",
    "etag_weak": lambda r: f'ETag: W/"{r.getrandbits(32):08x}-{r.getrandbits(16):x}"',
    "etag_strong": lambda r: f'etag: "{hashlib.md5(r.randbytes(8)).hexdigest()}"',
    "iso": lambda r: f"started {_when(r).isoformat()}",
    "iso_z": _formatted("started", "%Y-%m-%dT%H:%M:%SZ"),
    "iso_space": _formatted("started", "%Y-%m-%d %H:%M:%S"),
    "iso_offset": lambda r: (
        "started "
        + _when(r).astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat(timespec="milliseconds")
    ),
    "iso_date": _formatted("built", "%Y-%m-%d"),
    "iso_compact": _formatted("built", "%Y%m%dT%H%M%SZ"),
    "rfc2822": lambda r: f"Received: {format_datetime(_when(r))}",
    "http_date": lambda r: f"Date: {format_datetime(_when(r), usegmt=True)}",
    "ctime": _formatted("checked", "%a %b %d %H:%M:%S %Y"),
    "date1": _formatted("checked", "%a %b %d %H:%M:%S UTC %Y"),
    "syslog": _formatted("log", "%b %d %H:%M:%S"),
    "clf": _formatted("hit", "%d/%b/%Y:%H:%M:%S +0000"),
    "long_date": _formatted("generated", "%A, %d %B %Y %H:%M"),
    "epoch": lambda r: f'"ts": {r.randrange(_EPOCH_MIN, _EPOCH_MAX)}',
    "float_epoch": lambda r: f"at {r.randrange(_EPOCH_MIN, _EPOCH_MAX)}.{r.randrange(10**6):06d}",
    "ms_epoch": lambda r: f"stamp {r.randrange(_EPOCH_MIN, _EPOCH_MAX) * 1000 + r.randrange(1000)}",
    "timer": lambda r: f"elapsed {r.randrange(60)}:{r.randrange(60):02d}",
    "long_timer": lambda r: f"[{r.randrange(24)}:{r.randrange(60):02d}:{r.randrange(60):02d}]",
    "clock": lambda r: f"at {r.randrange(24):02d}:{r.randrange(60):02d}:{r.randrange(60):02d}",
    "duration_ms": lambda r: f"took {r.randrange(1, 5000)}ms",
    "duration_s": lambda r: f"in {r.randrange(1, 99)}.{r.randrange(10)} s",
    "duration_go": lambda r: f"uptime {r.randrange(1, 9)}h{r.randrange(60)}m{r.randrange(60)}s",
    "pid": lambda r: f"pid {r.randrange(2, 4_194_304)}",
    "pid_eq": lambda r: f"pid={r.randrange(2, 99999)}",
    "pid_syslog": lambda r: f"worker[{r.randrange(2, 99999)}]: alive",
    "tmp": lambda r: f"written to /tmp/tmp{_base62(r, 8).lower()}/out.log",
    "address": lambda r: f"<object at 0x7f{r.getrandbits(40):010x}>",
    "request_json": lambda r: f'"request_id": "req-{r.randrange(10**6)}"',
    "request_header": lambda r: f"X-Request-Id: {uuid.UUID(int=r.getrandbits(128))}",
    "trace": lambda r: f"trace_id={r.getrandbits(128):032x}",
    "session": lambda r: f"session {r.getrandbits(40):010x}",
    "traceparent": lambda r: (
        f"traceparent: 00-{r.getrandbits(128):032x}-{r.getrandbits(64):016x}-01"
    ),
    "short_sha_ref": lambda r: f"merge ref {r.getrandbits(40):010x}",  # all digits at times
    "pod_hex_template": lambda r: (
        f"pod etl-{r.getrandbits(40):010x}-" + "".join(r.choice(_POD) for _ in range(5))
    ),
    "pod": _pod("web"),
    "pod_long_name": _pod("api-gateway"),
    "job_pod": lambda r: "pod nightly-export-" + "".join(r.choice(_POD) for _ in range(5)),
    "nonce": lambda r: f'nonce="{_nonce(r)}"',
    "nonce_bare": lambda r: f"challenge {_nonce(r)}",
}
"""Each volatile kind, as a tool prints it (a neutral label before the token)."""

PROGRESS: dict[str, Callable[[int], str]] = {
    "cursor_id": lambda v: f"last_synced_id: {18000 + v}",
    "job_of": lambda v: f"job {v % 10 + 1} of {10 + v // 10}",
    "valid": lambda v: f"valid: {1200 + v}",
    "paid": lambda v: f"paid {14 + v}",
    "bytes": lambda v: f"downloaded {1_048_576_000 + v * 4096} bytes",
    "percent": lambda v: f"{v / 100:.2f}% done",
    "page": lambda v: f"page {v + 1}",
    "json": lambda v: json.dumps({"done": v, "total": 1000}),
    "json_status": lambda v: json.dumps(
        {"state": ["queued", "running", "uploading", "verifying"][v % 4], "step": v // 4}
    ),
    "json_offset": lambda v: json.dumps({"offset": 1_764_764_588_123 + v}),  # epoch-shaped
    "json_cursor": lambda v: json.dumps({"next_cursor": f"01HF3KQ8ZJ5X7N2M4P6R8T{v:04d}"}),
    "count": lambda v: f"count={v}",
    "remaining": lambda v: f"remaining: {v}",
}
"""Each progress kind: a value that is different for a different ``v``."""

_SEPARATORS = [" ", ", ", "\n", " | ", "; ", "\t"]


@st.composite
def results(draw: st.DrawFn) -> tuple[Callable[[random.Random, int], str], str]:
    """A result template: some volatile kinds and one progress kind in a random order,
    rendered with a random source (the noise) and a progress value."""
    volatile = draw(st.lists(st.sampled_from(sorted(VOLATILE)), min_size=1, max_size=4))
    progress = draw(st.sampled_from(sorted(PROGRESS)))
    order = draw(st.permutations([*volatile, progress]))
    separators = draw(
        st.lists(st.sampled_from(_SEPARATORS), min_size=len(order), max_size=len(order))
    )
    words = draw(st.sampled_from(["", "report\n", "deploy: "]))

    def render(rng: random.Random, value: int) -> str:
        parts = [
            PROGRESS[kind](value) if kind == progress else VOLATILE[kind](rng) for kind in order
        ]
        return words + "".join(p + s for p, s in zip(parts, separators, strict=True))

    return render, f"{order} (progress: {progress})"


def same(a: str, b: str) -> bool:
    """The detectors' notion: equal fingerprints of the normalised results."""
    return fingerprint_result(NORMALISER.normalise(a)) == fingerprint_result(
        NORMALISER.normalise(b)
    )


SEEDS = st.integers(min_value=0, max_value=2**64)


@settings(max_examples=400, deadline=None)
@given(results(), SEEDS, SEEDS, st.integers(0, 10_000), st.integers(1, 1_000))
def test_a_changed_progress_value_is_never_the_same_result(
    template: tuple[Callable[[random.Random, int], str], str],
    seed_a: int,
    seed_b: int,
    value: int,
    step: int,
) -> None:
    render, shape = template
    a = render(random.Random(seed_a), value)
    b = render(random.Random(seed_b), value + step)
    assert not same(a, b), (shape, a, b)
    # nor when the noise did not change at all
    assert not same(a, render(random.Random(seed_a), value + step)), (shape, a)


@settings(max_examples=400, deadline=None)
@given(results(), SEEDS, SEEDS, st.integers(0, 10_000))
def test_only_volatile_noise_changing_is_the_same_result(
    template: tuple[Callable[[random.Random, int], str], str],
    seed_a: int,
    seed_b: int,
    value: int,
) -> None:
    render, shape = template
    a = render(random.Random(seed_a), value)
    b = render(random.Random(seed_b), value)
    assert same(a, b), (shape, a, b, NORMALISER.normalise(a), NORMALISER.normalise(b))


@pytest.mark.parametrize("kind", sorted(VOLATILE))
def test_each_volatile_kind_alone_is_noise(kind: str) -> None:
    """Every kind on its own: 50 draws, one normalised result (so a tool printing only
    this kind, and a changing one, reads as the same result)."""
    rendered = {VOLATILE[kind](random.Random(seed)) for seed in range(50)}
    assert len(rendered) > 1
    assert len({NORMALISER.normalise(text) for text in rendered}) == 1, rendered


@pytest.mark.parametrize("kind", sorted(PROGRESS))
def test_each_progress_kind_alone_is_progress(kind: str) -> None:
    rendered = [PROGRESS[kind](value) for value in range(50)]
    assert len({NORMALISER.normalise(text) for text in rendered}) == len(set(rendered))


@settings(max_examples=60, deadline=None)
@given(results(), SEEDS, st.sampled_from(sorted(PRESETS)))
def test_a_poll_reporting_progress_is_never_stopped_as_a_repeat(
    template: tuple[Callable[[random.Random, int], str], str], seed: int, preset: str
) -> None:
    """Through the detector: 19 polls whose progress moves while the noise changes are
    never judged a repeat by any result-aware rule."""
    render, shape = template
    rng = random.Random(seed)
    detector = LoopDetector(PRESETS[preset])
    for value in range(19):
        decision = detector.propose("job_status", '{"job": "export"}')
        assert decision.detector not in ("poll_no_progress", "no_new_information"), shape
        if preset in ("strict", "openclaw"):  # result-aware repeat counting
            assert decision.level in ("none", "warning"), (shape, value, decision)
        detector.record_result(decision.call_id, render(rng, value))


@settings(max_examples=60, deadline=None)
@given(results(), SEEDS)
def test_a_stuck_poll_with_changing_noise_is_stopped_at_call_5_under_strict(
    template: tuple[Callable[[random.Random, int], str], str], seed: int
) -> None:
    render, shape = template
    rng = random.Random(seed)
    detector = LoopDetector(PRESETS["strict"])
    for call in range(1, 7):
        decision = detector.propose("job_status", '{"job": "export"}')
        if decision.level == "break":
            assert call == 5, shape
            return
        detector.record_result(decision.call_id, render(rng, 7))
    raise AssertionError(f"never stopped: {shape}")


# ------------------------------------------------------------------ named cases of the issue


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("last_synced_id: 18234", "last_synced_id: 18240"),
        ("job 3 of 10", "job 4 of 10"),
        ("valid: 1200", "valid: 1201"),
        ("paid 14", "paid 15"),
        ("transferred 1048576000 bytes", "transferred 1048580096 bytes"),
        ('{"lastSyncedId": 18234}', '{"lastSyncedId": 18240}'),
        ('{"cursor": "01HF3KQ8ZJ5X7N2M4P6R8T0VWY"}', '{"cursor": "01HF3KQ8ZJ5X7N2M4P6R8T0VWZ"}'),
        ('{"offset": 1764764588123}', '{"offset": 1764764588124}'),
        ("main.py:12:34: error", "main.py:13:34: error"),
        ("session expired", "session active"),
        ("this time 3 tests failed", "this time 2 tests failed"),
        ("2026-12-03 DONE", "2026-12-03 FAIL"),
        ("Marker 3", "Marker 4"),
        ("report_2024Q3Final.pdf", "report_2024Q4Final.pdf"),
        ("/home/me/ProjectFiles2024/a", "/home/me/ProjectFiles2024/b"),
    ],
)
def test_the_issues_progress_values_are_kept(a: str, b: str) -> None:
    assert not same(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("pod web-7d9f8c6b5-x2k4p Pending", "pod web-7d9f8c6b5-q9zrt Pending"),
        ("event 01HF3KQ8ZJ5X7N2M4P6R8T0VWY", "event 01HF3M1BQW8Z3N5K7P9R2T4VXY"),
        ('ETag: W/"5e15153d-120f"', 'ETag: W/"6a2b8c9d-1f3e"'),
        ("at 1764764588.123456", "at 1764764591.004211"),
        ("elapsed 0:31", "elapsed 0:42"),
        ("nonce kP9xQ2mZ7vR4tY1wL8nB3c==", "nonce Zq1vB7xR3mT9wY5kL2nP8d=="),
    ],
)
def test_the_issues_volatile_tokens_are_noise(a: str, b: str) -> None:
    assert same(a, b)


@pytest.mark.parametrize(
    "key",
    ["last_synced_id", "lastSyncedId", "nextPageToken", "offset", "page", "progress", "done",
     "status", "state", "total", "remaining", "cursor", "count", "job_id"],
)  # fmt: skip
def test_progress_names(key: str) -> None:
    assert is_progress_key(key)


@pytest.mark.parametrize(
    "key", ["request_id", "requestId", "trace_id", "session_id", "id", "ts", ""]
)
def test_names_that_are_not_progress(key: str) -> None:
    assert not is_progress_key(key)


# ------------------------------------------------------------------ linear time, bounded work


@pytest.mark.parametrize(
    "text",
    [
        "id" + " " * 50_000 + "!",
        "1." * 30_000 + "x",
        "pid:" * 20_000,
        "7" * 60_000 + "g",
        "a1" * 30_000,
        "(" * 50_000,
        "0x7f3a id=a1b2c3d4e5 2026-12-05T08:00:00Z request_id: " * 2_000,
    ],
)
def test_crafted_text_is_normalised_in_bounded_pieces(text: str) -> None:
    once = NORMALISER.normalise(text)
    assert NORMALISER.normalise(once) == once or len(text) > 2 * EDGE_CHARS
    assert once.count("<") <= 2 * MAX_TOKENS + text.count("<")


def test_operator_patterns_run_on_the_linear_engine() -> None:
    config = msgspec.structs.replace(
        LoopConfig(), result_patterns=(ResultPattern(pattern="(a|a)*b", replacement="<ab>"),)
    )
    normaliser = Normaliser(config)
    # exponential for a backtracking engine; RE2 answers at once
    assert normaliser.normalise("a" * 5_000) == "a" * 5_000
    assert normaliser.normalise("aaab") == "<ab>"


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [("(?<=x)y", "invalid perl operator"), (r"(a)\1", "invalid escape sequence"),
     ("(unclosed", "missing )")],
)  # fmt: skip
def test_a_pattern_re2_cannot_compile_is_a_config_error_naming_the_key(
    pattern: str, reason: str
) -> None:
    with pytest.raises(LoopConfigError, match=r"result_patterns\.0\.pattern: .*RE2") as caught:
        load_config({"result_patterns": [{"pattern": pattern}]})
    assert reason in str(caught.value)
