"""Is the estimate for an unknown tokenizer a true upper bound? ``python -m bench.token_bound``.

Counts the same texts, and the same whole prompts, four ways and prints them side by side:

* the **server**: a llama-cpp-python server (``.venv-llama``, the interop tier's tiny GGUF
  model: a SentencePiece-style vocabulary of control tokens, the 256 byte tokens, ``▁``
  and printable ASCII, so every character is a token: the most tokens any byte-fallback
  tokenizer makes of ASCII text). Texts through ``POST /extras/tokenize``; whole prompts
  (messages and tool schemas, in both chat formats) as ``usage.prompt_tokens`` of a
  non-streamed request with ``max_tokens = 1``;
* ``cl100k_base`` and ``o200k_base`` (``bpe-openai``, exact);
* loopfuse's estimate for a model whose tokenizer it does not know: ``typical`` (digit-split
  cl100k × 1.1, what calibration scales) and ``bound`` (UTF-8 bytes, framing at its
  largest: what is used until the server's usage or tokenizer calibrates).

``bound / server`` must be at least 1 on every row; the figures go into docs/context.md.
Options: ``--python PATH`` (the llama venv's python), ``--json``. Writes the model into a
temporary folder with ``tests/interop/model_writer.py``; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from actors.context import Estimator, PromptLedger, bpe_counter
from actors.tools.builtin import default_registry
from bus import ChatMessage, ToolCall

REPO = Path(__file__).resolve().parent.parent
MODEL_ID = "models/short.gguf"


def corpus() -> dict[str, str]:
    """Deterministic texts of the kinds prompts are made of (about 1-2 KB each)."""
    prose = (
        "The team followed the standard operating procedure and recorded every deviation "
        "in the shared notebook. Each replicate was handled by the same person at the same "
        "bench, so the comparison between strains stays fair. "
    ) * 5
    code = (
        "def parse(line: str) -> dict[str, int]:\n"
        "    fields = [part.strip() for part in line.split(',') if part]\n"
        "    return {key: int(value) for key, value in zip(fields[::2], fields[1::2])}\n\n"
    ) * 6
    data = json.dumps(
        [
            {"id": 48213 + i, "status": "ok", "sku": f"A-{i}", "qty": i % 7, "price": 19.99 + i}
            for i in range(20)
        ]
    )
    csv = "name,region,revenue,units\n" + "".join(
        f"Company {i},EU-{i % 4},{1203344.50 + i * 977.25:.2f},{i * 31}\n" for i in range(40)
    )
    german = "Die Größe der Stichprobe wurde vor der Messung festgelegt, nicht danach. " * 12
    russian = "Размер выборки был определён до измерения, а не после него. " * 12
    chinese = "样本量在测量之前就已确定，而不是之后。每个重复由同一个人在同一个工作台上处理。" * 12
    digest = "".join(hashlib.sha256(str(i).encode()).hexdigest() + "\n" for i in range(16))
    b64 = base64.b64encode(bytes(range(256)) * 4).decode()
    emoji = "Status: ✅ passed 🚀 deployed 🔥 hot path 🙂 fine 🧪 tests 📦 package. " * 12
    numbers = " ".join(str(7919 * i % 1_000_003) for i in range(300))
    indented = "".join(
        f"{'    ' * (i % 6)}value_{i} = compute({i}, scale=0.5)\n" for i in range(40)
    )
    return {
        "prose": prose,
        "code": code,
        "json": data,
        "csv": csv,
        "german": german,
        "russian": russian,
        "chinese": chinese,
        "hex": digest,
        "base64": b64,
        "emoji": emoji,
        "numbers": numbers,
        "indented": indented,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


@contextmanager
def llama_server(python: str, root: Path, chat_format: str) -> Iterator[str]:
    """A llama-cpp-python server on loopback; yields its root URL (no ``/v1``)."""
    port = free_port()
    log = (root / f"server-{chat_format}.log").open("wb")
    process = subprocess.Popen(
        [
            python,
            "-m",
            "llama_cpp.server",
            "--model",
            MODEL_ID,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "8192",
            "--chat_format",
            chat_format,
            "--interrupt_requests",
            "False",
        ],
        cwd=root,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # waits on the server answering, not on a fixed time
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start; see {log.name}") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def text_rows(url: str) -> list[dict[str, Any]]:
    estimator = Estimator(MODEL_ID)
    cl100k, o200k = bpe_counter("cl100k_base"), bpe_counter("o200k_base")
    rows = []
    for name, text in corpus().items():
        answer = post(f"{url}/extras/tokenize", {"input": text, "model": MODEL_ID})
        estimate = estimator.text(text)
        rows.append(
            {
                "text": name,
                "bytes": len(text.encode()),
                "server": len(answer["tokens"]) - 1,  # /extras/tokenize adds BOS
                "cl100k": cl100k(text),
                "o200k": o200k(text),
                "typical": estimate.tokens,
                "bound": estimate.bound,
            }
        )
    return rows


def prompts() -> dict[str, tuple[list[ChatMessage], bool]]:
    texts = corpus()
    call = ToolCall(id="call_1", name="read_file", arguments='{"path": "notes.txt"}')
    system = ChatMessage(role="system", content="You are a careful assistant.")
    return {
        "say hello": ([ChatMessage(role="user", content="Say hello")], False),
        "say hello + tools": ([ChatMessage(role="user", content="Say hello")], True),
        "tool turn + tools": (
            [
                system,
                ChatMessage(role="user", content="Read notes.txt and summarise it."),
                ChatMessage(role="assistant", content="", tool_calls=(call,)),
                ChatMessage(role="tool", tool_call_id="call_1", content=texts["prose"]),
            ],
            True,
        ),
        **{
            f"{name} task": ([system, ChatMessage(role="user", content=texts[name])], False)
            for name in ("code", "json", "chinese", "emoji", "numbers")
        },
    }


def wire(message: ChatMessage) -> dict[str, Any]:
    body: dict[str, Any] = {"role": message.role, "content": message.content or ""}
    if message.tool_calls:
        body["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id:
        body["tool_call_id"] = message.tool_call_id
    return body


def prompt_rows(url: str, chat_format: str) -> list[dict[str, Any]]:
    specs = default_registry().specs()
    tools = [
        {
            "type": "function",
            "function": {
                "name": s.name,
                "description": s.description,
                "parameters": json.loads(s.parameters),
            },
        }
        for s in specs
    ]
    rows = []
    for name, (messages, with_tools) in prompts().items():
        body: dict[str, Any] = {
            "model": MODEL_ID,
            "messages": [wire(m) for m in messages],
            "max_tokens": 1,
        }
        if with_tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        answer = post(f"{url}/v1/chat/completions", body)
        ledger = PromptLedger(Estimator(MODEL_ID))
        ledger.extend(messages, 0)
        framing = ledger.estimator.tools(specs if with_tools else ())
        rows.append(
            {
                "prompt": name,
                "format": chat_format,
                "server": answer["usage"]["prompt_tokens"],
                "typical": ledger.tokens + framing.tokens,
                "bound": ledger.bound + framing.bound,
            }
        )
    return rows


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = [
        "| " + " | ".join(columns) + " | bound / server | typical / server |",
        "|" + " --- |" * (len(columns) + 2),
    ]
    for row in rows:
        cells = [f"{row[c]:,}" if isinstance(row[c], int) else str(row[c]) for c in columns]
        cells += [f"{row['bound'] / row['server']:.2f}", f"{row['typical'] / row['server']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(REPO / ".venv-llama" / "bin" / "python"))
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        subprocess.run(
            [
                options.python,
                str(REPO / "tests" / "interop" / "model_writer.py"),
                str(root / "models"),
            ],
            check=True,
            capture_output=True,
        )
        texts: list[dict[str, Any]] = []
        whole: list[dict[str, Any]] = []
        for chat_format in ("chatml", "chatml-function-calling"):
            print(f"server: {chat_format} ...", file=sys.stderr)
            with llama_server(options.python, root, chat_format) as url:
                if not texts:
                    texts = text_rows(url)
                whole += prompt_rows(url, chat_format)
    if options.json:
        print(json.dumps({"texts": texts, "prompts": whole}, indent=2))
        return
    print(table(texts, ["text", "bytes", "server", "cl100k", "o200k", "typical", "bound"]))
    print()
    print(table(whole, ["prompt", "format", "server", "typical", "bound"]))
    low = [r for r in texts + whole if r["bound"] < r["server"]]
    print(f"\nrows where the bound is below the server's count: {len(low)}")


if __name__ == "__main__":
    main()
