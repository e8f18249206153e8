"""Write a tiny deterministic GGUF model for the interop tier (nothing is downloaded).

Run with the llama venv's python (it has ``gguf`` and ``numpy``)::

    python tests/interop/model_writer.py OUT_DIR

writes ``OUT_DIR/short.gguf`` and ``OUT_DIR/long.gguf``.

The model is a llama-architecture transformer (f32, 64 channels, 2 blocks) whose attention
and feed-forward outputs are zero, so each block adds nothing to the residual stream and
the next token depends on the current token alone: a bigram model. Every token's embedding
is one channel set to 1; the output matrix maps the channel of each token of a chain to the
chain's next token, and every other token to the chain's first. The last token of a ChatML
prompt (the newline after ``<|im_start|>assistant``) is outside the chain, so the reply is
always the chain from its start:

- ``short``: :data:`SHORT_REPLY` (all characters distinct), then end of sequence;
- ``long``: the alphabet and a space, over and over, never an end of sequence.

The tests import the constants (:data:`SHORT_REPLY`, :data:`LONG_CYCLE`) without ``gguf``,
which only the writing needs.

The vocabulary is SentencePiece-style: control tokens, the 256 byte tokens, ``▁`` (a
space) and the printable ASCII characters, so every character is one token.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

SHORT_REPLY = "OK, done."
"""What the short model answers to any chat prompt (then it stops)."""
LONG_CYCLE = "abcdefghijklmnopqrstuvwxyz "
"""What the long model repeats until ``max_tokens``."""

N_EMBD = 64
N_HEAD = 4
N_FF = 128
N_LAYER = 2
CONTEXT = 8192
LOGIT = 32.0
"""The chosen next token's logit (every other is 0): far above sampling noise."""

SECOND_CHOICES = {'"': 24.0, "m": 18.0, "}": 14.0, "</s>": 10.0, "<": 6.0, "<|im_end|>": 6.0}
"""Logits every token gives these (the chosen next token's is :data:`LOGIT`), far enough
apart that sampling (temperature 0.2, repeat penalty 1.1) cannot swap neighbours."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _gguf() -> Any:
    import gguf  # type: ignore[import-not-found,unused-ignore]  # only in .venv-llama

    return gguf


def _vocabulary() -> tuple[list[str], list[int]]:
    gguf = _gguf()
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 4
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    tokens.append("▁")
    types.append(gguf.TokenType.NORMAL)
    tokens += [chr(code) for code in range(0x21, 0x7F)]
    types += [gguf.TokenType.NORMAL] * (0x7F - 0x21)
    return tokens, [int(t) for t in types]


def _chain(text: str, token_id: dict[str, int]) -> list[int]:
    return [token_id["▁" if char == " " else char] for char in text]


def write_model(path: Path, *, long: bool) -> None:
    """Write the short (answers :data:`SHORT_REPLY`) or long (never ends) model to ``path``."""
    gguf = _gguf()
    tokens, types = _vocabulary()
    token_id = {token: i for i, token in enumerate(tokens)}
    eos = token_id["</s>"]
    chain = _chain(LONG_CYCLE if long else SHORT_REPLY, token_id)
    successors = [*chain[1:], chain[0] if long else eos]
    assert len(set(chain)) == len(chain)
    assert len(chain) < N_EMBD

    n_vocab = len(tokens)
    embedding = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
    embedding[:, 0] = 1.0  # channel 0: every token outside the chain
    output = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
    output[chain[0], 0] = LOGIT
    for channel, (token, successor) in enumerate(zip(chain, successors, strict=True), 1):
        embedding[token, :] = 0.0
        embedding[token, channel] = 1.0
        output[successor, channel] = LOGIT
    # Second choices, for when a grammar masks the first (forced tool calls): close a
    # string, close the object, stop; "message:" over "functions." when tool_choice is auto.
    for second, logit in SECOND_CHOICES.items():
        row = token_id[second]
        output[row, :] = np.maximum(output[row, :], logit)
    # RMS norm turns a one-hot row of 1 into sqrt(N_EMBD) in that channel.
    output /= np.float32(np.sqrt(N_EMBD))

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("loopfuse-interop-long" if long else "loopfuse-interop-short")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_unk_token_id(token_id["<unk>"])
    writer.add_bos_token_id(token_id["<s>"])
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)

    ones = np.ones(N_EMBD, dtype=np.float32)
    square = np.zeros((N_EMBD, N_EMBD), dtype=np.float32)
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", output)
    for block in range(N_LAYER):
        prefix = f"blk.{block}."
        writer.add_tensor(prefix + "attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(prefix + name + ".weight", square)
        writer.add_tensor(prefix + "ffn_norm.weight", ones)
        writer.add_tensor(prefix + "ffn_gate.weight", np.zeros((N_FF, N_EMBD), np.float32))
        writer.add_tensor(prefix + "ffn_up.weight", np.zeros((N_FF, N_EMBD), np.float32))
        writer.add_tensor(prefix + "ffn_down.weight", np.zeros((N_EMBD, N_FF), np.float32))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    write_model(out / "short.gguf", long=False)
    write_model(out / "long.gguf", long=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
