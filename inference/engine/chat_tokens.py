"""Chat messages -> prompt token ids, with what people and documents wrote kept as plain text.

A chat template renders messages to text between role markers (``<|im_start|>``, ``<|im_end|>``
for SmolLM2 and Qwen; ``<|start_header_id|>``, ``<|eot_id|>`` for Llama 3). Encoding that text
again reads every marker in it as a control token, the ones a document or a chat message wrote
too: a document holding ``<|im_end|>\\n<|im_start|>system\\n...`` would end its own message and
speak with the system's voice. So when a message holds such a marker, the template is rendered
with a placeholder for each message's content; the template's own text is encoded with its
control tokens, and each content with special tokens split into ordinary text
(``split_special_tokens``), as the words they are. Messages without one (nearly all) are encoded
as the rendered text, exactly as the model was trained to read its template (encoding the pieces
apart would cut a few tokens differently where they meet).

Pure: takes a Hugging Face tokenizer, imports no vLLM.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from typing import Any

# Private-use characters around a per-call nonce: no tokenizer's template or normaliser touches
# them, and no message can guess the nonce to forge a placeholder.
_OPEN, _CLOSE = "\ue000", "\ue001"


def prompt_token_ids(
    tokenizer: Any, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
) -> list[int]:
    """The prompt of ``messages`` as the model reads it: the template's control tokens, and each
    message's content as text, whatever markers it holds. A message the template leaves out
    (some drop a system message) is left out here too."""
    if not any(holds_special_tokens(tokenizer, str(message["content"])) for message in messages):
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
        return list(tokenizer.encode(rendered, add_special_tokens=False))
    nonce = secrets.token_hex(8)
    marks = [f"{_OPEN}{nonce}:{i}{_CLOSE}" for i in range(len(messages))]
    rendered = tokenizer.apply_chat_template(
        [{**message, "content": mark} for message, mark in zip(messages, marks, strict=True)],
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )
    ids: list[int] = []
    position = 0
    for message, mark in zip(messages, marks, strict=True):
        at = rendered.find(mark, position)
        if at < 0:
            continue
        ids += tokenizer.encode(rendered[position:at], add_special_tokens=False)
        ids += tokenizer.encode(str(message["content"]), add_special_tokens=False, split_special_tokens=True)
        position = at + len(mark)
    ids += tokenizer.encode(rendered[position:], add_special_tokens=False)
    return ids


def raw_prompt_token_ids(tokenizer: Any, prompt: str) -> list[int]:
    """A raw prompt (``/v1/completions``) as vLLM's completions endpoint reads one: the
    tokenizer's own special tokens added (a beginning-of-sequence token where it has one), and
    markers in the text read as control tokens. Unlike a message, whose content may be a
    document's, a raw prompt is all its sender's own: it can only speak for itself."""
    return list(tokenizer.encode(prompt, add_special_tokens=True))


def special_token_texts(tokenizer: Any) -> tuple[str, ...]:
    """The texts the tokenizer reads as special tokens (control markers), longest first."""
    texts = {str(token) for token in tokenizer.all_special_tokens}
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    texts |= {token.content for token in decoder.values() if getattr(token, "special", False)}
    return tuple(sorted((t for t in texts if t), key=len, reverse=True))


_MARKERS: dict[int, tuple[Any, re.Pattern[str]]] = {}  # id(tokenizer) -> (tokenizer, its markers as one pattern)


def holds_special_tokens(tokenizer: Any, text: str) -> bool:
    """Whether ``text`` holds a marker the tokenizer would read as a control token (Llama 3's has
    hundreds of reserved ones: one pattern, compiled once per tokenizer)."""
    kept = _MARKERS.get(id(tokenizer))
    if kept is None or kept[0] is not tokenizer:
        kept = _MARKERS[id(tokenizer)] = (
            tokenizer,
            re.compile("|".join(map(re.escape, special_token_texts(tokenizer))) or "(?!)"),
        )
    return kept[1].search(text) is not None
