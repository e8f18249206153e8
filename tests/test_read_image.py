"""read_image without a model: the tool and its errors, image headers and token prices, the
wire format of images, the vision flag in the config, and old transcripts still decoding."""

from __future__ import annotations

import base64
import os
import struct
from pathlib import Path

import msgspec
import pytest

from actors.context import Estimator
from actors.context.images import (
    BASE_TOKENS,
    MAX_IMAGE_TOKENS,
    ImageInfo,
    image_tokens,
    part_tokens,
    sniff_image,
)
from actors.llm.wire import prompt_chars, wire_messages
from actors.tools import (
    PATH_ERROR,
    ToolContext,
    ToolError,
    ToolExecutorSettings,
    ToolLimits,
    cap_text,
    default_registry,
    invoke,
)
from actors.tools.fs_image import load_image
from bus import (
    ChatMessage,
    ImagePart,
    ImageURL,
    TextPart,
    ToolCall,
    image_attachment,
    message_images,
    message_text,
)
from orchestrator.conductor.inputs import RunCheckpoint
from orchestrator.config import load_config, model_reads_images
from orchestrator.daemon.recovery import CHECKPOINT_DECODER
from orchestrator.errors import ConfigError
from orchestrator.pipeline import Probes
from orchestrator.report import SAMPLE_FOLDER, ReportOptions
from orchestrator.report.workflow import report_pipeline

PHOTO = SAMPLE_FOLDER / "plate_photo.png"
PHOTO_BYTES = PHOTO.read_bytes()
LIMITS = ToolLimits()


def _load(
    root: Path | None, path: str, *, limits: ToolLimits = LIMITS, detail: str = "auto"
) -> str:
    return load_image(root, path, detail, limits)  # type: ignore[arg-type]


def _error(root: Path | None, path: str, **kwargs: object) -> ToolError:
    with pytest.raises(ToolError) as caught:
        _load(root, path, **kwargs)  # type: ignore[arg-type]
    return caught.value


# ------------------------------------------------------------------------------- the tool


def test_the_sample_photo_comes_back_as_text_and_an_attached_png() -> None:
    result = _load(SAMPLE_FOLDER, "plate_photo.png", detail="low")
    first, _, attachment = result.partition("\n")
    assert first == (
        "read_image: plate_photo.png (PNG, 32×16 px, 1,240 bytes, about 85 tokens at detail "
        "low). The image is attached below."
    )
    text, parts = message_images(ChatMessage(role="tool", tool_call_id="c", content=result))
    assert text == first
    assert parts == (
        ImagePart(
            image_url=ImageURL(
                url="data:image/png;base64," + base64.b64encode(PHOTO_BYTES).decode(),
                detail="low",
            )
        ),
    )
    assert attachment == image_attachment(parts[0].image_url.url, "low")


def test_the_type_is_told_by_magic_bytes_not_by_the_name(tmp_path: Path) -> None:
    (tmp_path / "photo.dat").write_bytes(PHOTO_BYTES)
    (tmp_path / "fake.png").write_text("time,od\n0,0.05\n")
    (tmp_path / "gif.png").write_bytes(b"GIF89a" + struct.pack("<HH", 7, 9) + b"\x00" * 20)
    assert "(PNG, 32×16 px" in _load(tmp_path, "photo.dat")
    assert "(GIF, 7×9 px" in _load(tmp_path, "gif.png")
    error = _error(tmp_path, "fake.png")
    assert error.kind == "not_image"
    assert "fake.png is not a PNG, JPEG, GIF or WebP image" in error.message
    (tmp_path / "empty.png").write_bytes(b"")
    assert _error(tmp_path, "empty.png").kind == "not_image"


def test_paths_outside_the_folder_get_the_one_path_answer(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.png").write_bytes(PHOTO_BYTES)
    os.symlink(tmp_path / "secret.png", root / "link.png")
    for path in ("../secret.png", str(tmp_path / "secret.png"), "link.png", "missing.png"):
        error = _error(root, path)
        assert (error.kind, error.message) == ("path", PATH_ERROR), path
    (root / "sub").mkdir()
    assert "is a directory; use list_dir" in _error(root, "sub").message
    assert _error(None, "plate_photo.png").kind == "path"


def test_a_file_over_the_cap_is_refused_with_a_hint(tmp_path: Path) -> None:
    (tmp_path / "big.png").write_bytes(PHOTO_BYTES)
    error = _error(tmp_path, "big.png", limits=ToolLimits(image_max_bytes=1000))
    assert error.kind == "too_large"
    assert "big.png is 1,240 bytes; read_image takes images up to 1,000 bytes" in error.message
    assert "Hint:" in error.message
    assert "image_max_bytes" in error.message
    at_the_cap = _load(tmp_path, "big.png", limits=ToolLimits(image_max_bytes=1240))
    assert at_the_cap.startswith("read_image: big.png (PNG, 32×16 px, 1,240 bytes")


def test_the_cap_must_fit_in_a_tool_result() -> None:
    with pytest.raises(
        msgspec.ValidationError, match=r"limits\.image_max_bytes: .* max_result_chars"
    ):
        msgspec.convert({"limits": {"image_max_bytes": 5_000_000}}, ToolExecutorSettings)
    raised = msgspec.convert(
        {"max_result_chars": 7_000_000, "limits": {"image_max_bytes": 5_000_000}},
        ToolExecutorSettings,
    )
    assert raised.limits.image_max_bytes == 5_000_000
    # the default cap's largest image still fits whole in the default result cap
    default = ToolExecutorSettings()
    assert 4 * -(-default.limits.image_max_bytes // 3) < default.max_result_chars
    # a small result cap with the default image cap is allowed (images then get cut) …
    assert ToolExecutorSettings(max_result_chars=100).max_result_chars == 100


def test_a_cut_result_is_text_never_a_broken_image() -> None:
    result = _load(SAMPLE_FOLDER, "plate_photo.png")
    cut = cap_text(result, len(result) - 10)  # as the executor cuts a long result
    text, parts = message_images(ChatMessage(role="tool", tool_call_id="c", content=cut))
    assert parts == ()
    assert text == cut
    assert text.endswith(
        "[result cut: 10 of 1,825 characters left out]".replace("1,825", str(len(result)))
    )


@pytest.mark.asyncio
async def test_the_registered_tool_checks_its_arguments_and_reads_through_the_executor_path() -> (
    None
):
    tool = default_registry().get("read_image")
    assert tool is not None
    assert tool.idempotent
    ctx = ToolContext("r", SAMPLE_FOLDER)
    bad = await invoke(
        tool,
        '{"path": "plate_photo.png", "detail": "medium"}',
        ctx,
        max_chars=100_000,
    )
    assert (bad.is_error, bad.error_kind) == (True, "invalid_arguments")
    assert "detail" in bad.content
    good = await invoke(tool, '{"path": "plate_photo.png"}', ctx, max_chars=100_000)
    assert not good.is_error
    assert len(message_images(ChatMessage(role="tool", content=good.content))[1]) == 1


# ------------------------------------------------------------------- headers and tokens


def _jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
    sof = b"\xff\xc0" + struct.pack(">HBHH", 11, 8, height, width) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def _webp(chunk: bytes, body: bytes) -> bytes:
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(body))
        + b"WEBP"
        + chunk
        + struct.pack("<I", len(body))
        + body
    )


def test_headers_give_type_and_size_without_an_imaging_library() -> None:
    vp8l = bytes([0x2F]) + struct.pack("<I", (300 - 1) | ((200 - 1) << 14))
    vp8x = b"\x00" * 4 + (640 - 1).to_bytes(3, "little") + (480 - 1).to_bytes(3, "little")
    vp8 = b"\x00" * 3 + b"\x9d\x01\x2a" + struct.pack("<HH", 1024, 768)
    assert sniff_image(PHOTO_BYTES) == ImageInfo("image/png", 32, 16)
    assert sniff_image(_jpeg(4032, 3024)) == ImageInfo("image/jpeg", 4032, 3024)
    assert sniff_image(b"GIF87a" + struct.pack("<HH", 5, 6)) == ImageInfo("image/gif", 5, 6)
    assert sniff_image(_webp(b"VP8L", vp8l)) == ImageInfo("image/webp", 300, 200)
    assert sniff_image(_webp(b"VP8X", vp8x)) == ImageInfo("image/webp", 640, 480)
    assert sniff_image(_webp(b"VP8 ", vp8)) == ImageInfo("image/webp", 1024, 768)
    assert sniff_image(PHOTO_BYTES[:10]) == ImageInfo("image/png", 0, 0)
    assert sniff_image(b"%PDF-1.7") is None
    assert sniff_image(b"") is None


@pytest.mark.parametrize(
    ("width", "height", "detail", "tokens"),
    [
        (32, 16, "high", 85 + 170),  # one tile, never scaled up
        (32, 16, "low", 85),
        (1024, 1024, "high", 765),  # OpenAI's example: 768 × 768, 4 tiles
        (2048, 4096, "high", 1105),  # OpenAI's example: 768 × 1536, 6 tiles
        (4032, 3024, "auto", 765),  # auto counted as high
        (0, 0, "high", MAX_IMAGE_TOKENS),  # size unknown: the largest price
    ],
)
def test_the_tile_formula(width: int, height: int, detail: str, tokens: int) -> None:
    assert image_tokens(width, height, detail) == tokens  # type: ignore[arg-type]


def _tool_message(detail: str = "high") -> ChatMessage:
    return ChatMessage(
        role="tool",
        tool_call_id="c1",
        content=_load(SAMPLE_FOLDER, "plate_photo.png", detail=detail),
    )


def test_the_context_estimate_prices_the_image_not_its_base64() -> None:
    estimator = Estimator("gpt-4o")
    for detail, price in (("high", 255), ("low", BASE_TOKENS)):
        message = _tool_message(detail)
        text_only = ChatMessage(role="tool", tool_call_id="c1", content=message_text(message))
        extra = estimator.message(message).tokens - estimator.message(text_only).tokens
        assert extra == price
    url = message_images(_tool_message())[1][0].image_url.url  # type: ignore[union-attr]
    assert len(url) > 1600  # the base64 alone would be ~400 tokens as text
    assert (
        part_tokens(ImagePart(image_url=ImageURL(url="data:image/png;base64,!!", detail="high")))
        == MAX_IMAGE_TOKENS
    )


def test_the_fallback_estimate_does_not_count_the_data_url() -> None:
    message = _tool_message("low")
    assert prompt_chars([message]) == len(message_text(message)) + 4 * BASE_TOKENS
    # a large image: 1,105 tokens (2048 × 4096), whatever its 80,000 base64 characters
    header = PHOTO_BYTES[:16] + struct.pack(">II", 2048, 4096) + bytes(60_000)
    url = "data:image/png;base64," + base64.b64encode(header).decode()
    big = ChatMessage(role="tool", tool_call_id="c", content="seen\n" + image_attachment(url))
    assert len(big.content or "") > 80_000
    assert prompt_chars([big]) == len("seen") + 4 * 1105


# ------------------------------------------------------------------------------ the wire


def test_a_tool_results_image_goes_out_as_a_user_message_after_the_tool_messages() -> None:
    calls = (
        ToolCall(id="c1", name="read_image", arguments='{"path": "plate_photo.png"}'),
        ToolCall(id="c2", name="read_file", arguments='{"path": "notes.txt"}'),
    )
    image = _tool_message("low")
    url = message_images(image)[1][0].image_url.url  # type: ignore[union-attr]
    wired = wire_messages(
        [
            ChatMessage(role="user", content="task"),
            ChatMessage(role="assistant", tool_calls=calls),
            image,
            ChatMessage(role="tool", tool_call_id="c2", content="notes"),
            ChatMessage(role="user", content="[loopfuse:nudge kind=x] go"),
        ]
    )
    assert [m["role"] for m in wired] == ["user", "assistant", "tool", "tool", "user", "user"]
    assert wired[2] == {"role": "tool", "content": message_text(image), "tool_call_id": "c1"}
    assert "base64" not in wired[2]["content"]
    assert wired[4] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "The image(s) returned by tool call c1:"},
            {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
        ],
    }
    # a transcript that ends with the tool results still sends the image
    assert (
        wire_messages([ChatMessage(role="assistant", tool_calls=calls[:1]), image])[-1]["role"]
        == "user"
    )


def test_a_user_message_with_parts_goes_out_as_a_content_parts_array() -> None:
    part = ImagePart(image_url=ImageURL(url="data:image/png;base64,iVBORw0K", detail="high"))
    message = ChatMessage(
        role="user", content="What does this show?", parts=(part, TextPart(text="Be brief."))
    )
    assert wire_messages([message]) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What does this show?"},
                {"type": "image_url", "image_url": {"url": part.image_url.url, "detail": "high"}},
                {"type": "text", "text": "Be brief."},
            ],
        }
    ]
    plain = ChatMessage(role="user", content="hi")
    assert wire_messages([plain]) == [{"role": "user", "content": "hi"}]


def test_only_well_formed_attachment_lines_are_images() -> None:
    for content in (
        "[loopfuse:image detail=low]https://example.com/x.png",  # not a data URL
        "[loopfuse:image detail=huge]data:image/png;base64,AAAA",  # unknown detail
        "text [loopfuse:image detail=low]data:image/png;base64,AAAA",  # not its own line
    ):
        message = ChatMessage(role="tool", tool_call_id="c", content=content)
        assert message_images(message) == (content, ())


# --------------------------------------------------------------- config and the pipeline


def test_the_vision_flag_is_per_model_and_off_by_default(tmp_path: Path) -> None:
    path = tmp_path / "loopfuse.toml"
    path.write_text('[models."gpt-4o"]\nvision = true\n[models."deepseek-chat"]\n')
    config = load_config(path, environ={})
    assert model_reads_images(config, "gpt-4o")
    assert not model_reads_images(config, "deepseek-chat")
    assert not model_reads_images(config, "gpt-4o-mini")  # names match exactly
    path.write_text('[models."gpt-4o"]\nvision = "yes"\n')
    with pytest.raises(ConfigError, match=r"""models\."gpt-4o"\.vision': Expected `bool`"""):
        load_config(path, environ={})
    path.write_text('[models."gpt-4o"]\nvison = true\n')
    with pytest.raises(ConfigError, match=r"""models\."gpt-4o"\.vison': unknown key"""):
        load_config(path, environ={})


def test_read_image_is_offered_to_explore_only_with_vision_and_the_plan_is_the_same() -> None:
    def explore_tools(vision: bool | None) -> list[str]:
        options = ReportOptions(goal="g", out="r.md", explore_vision=vision)
        config = report_pipeline(options, Probes())
        stages = {stage.name: stage for stage in config.stages}
        return list(stages["explore"].overrides["tools"])  # type: ignore[union-attr]

    assert explore_tools(True) == ["list_dir", "read_file", "read_image", "finish_exploration"]
    assert explore_tools(False) == ["list_dir", "read_file", "finish_exploration"]
    assert explore_tools(None) == explore_tools(False)
    plans = {
        tuple(
            s.name
            for s in report_pipeline(
                ReportOptions(goal="g", out="r", explore_vision=v), Probes()
            ).stages
        )
        for v in (True, False)
    }
    assert len(plans) == 1


# ------------------------------------------------------------------ stored transcripts


def test_transcripts_stored_before_images_existed_still_decode() -> None:
    old = (
        b'{"run_id":"r1","trace_id":"t","turn":1,"elapsed_seconds":0.5,"transcript":['
        b'{"role":"user","content":"task"},'
        b'{"role":"assistant","tool_calls":[{"id":"c","name":"read_file","arguments":"{}"}]},'
        b'{"role":"tool","content":"text","tool_call_id":"c"}],'
        b'"llm_requests":1,"tool_calls":1,"usage":{"prompt_tokens":5,"completion_tokens":2,'
        b'"estimated":false},"nudges":0,"injected":[],"truncations":0,"output":"",'
        b'"trace":[],"call_log":[]}'
    )
    checkpoint = CHECKPOINT_DECODER.decode(old)
    assert [m.parts for m in checkpoint.transcript] == [(), (), ()]
    assert checkpoint.transcript[2] == ChatMessage(role="tool", tool_call_id="c", content="text")
    # a message without parts encodes exactly as before (old readers read new rows) …
    assert msgspec.json.encode(checkpoint.transcript[0]) == b'{"role":"user","content":"task"}'
    # … and a transcript with an image round-trips through the store's decoder
    part = ImagePart(image_url=ImageURL(url="data:image/png;base64,iVBORw0K", detail="low"))
    with_image = msgspec.structs.replace(
        checkpoint,
        transcript=(
            *checkpoint.transcript,
            _tool_message(),
            ChatMessage(role="user", content="x", parts=(part,)),
        ),
    )
    assert isinstance(with_image, RunCheckpoint)
    assert CHECKPOINT_DECODER.decode(msgspec.json.encode(with_image)) == with_image
