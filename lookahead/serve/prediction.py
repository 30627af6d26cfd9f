"""The ``prediction`` field of both completion endpoints (OpenAI's Predicted Outputs): read, checked and
tokenized, each bad value a 400 naming the field and the fix. The engine proposes the predicted tokens as
candidates (lookahead/proposers/prediction.py); the answer is what it would have been without them."""

from __future__ import annotations

from typing import Any

from .schemas import bad_request

FIELD = "prediction"
SHAPE = '{"type": "content", "content": "the predicted text"}'


def prediction_text(value: Any) -> str | None:
    """The predicted text of ``prediction`` (None: left out): ``{"type": "content", "content": ...}`` whose
    content is a string or a list of text parts (``{"type": "text", "text": ...}``, joined as they are)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request(f"'{FIELD}' must be an object {SHAPE}", FIELD, "invalid_value")
    extra = sorted(set(value) - {"type", "content"})
    if extra:
        raise bad_request(f"'{FIELD}.{extra[0]}' is not a field of a prediction: send {SHAPE}", f"{FIELD}.{extra[0]}",
                          "invalid_value")
    if value.get("type") != "content":
        raise bad_request(f"'{FIELD}.type' must be \"content\", got {value.get('type')!r}: send {SHAPE}",
                          f"{FIELD}.type", "invalid_value")
    text = _content_text(value.get("content"))
    if not text:
        raise bad_request(f"'{FIELD}.content' is empty: send the predicted text, or leave '{FIELD}' out",
                          f"{FIELD}.content", "invalid_value")
    return text


def _content_text(content: Any) -> str:
    """``prediction.content``: a string, or a non-empty list of text parts, as one string."""
    where = f"{FIELD}.content"
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{where}' must be a string or a list of text parts, got "
                          f"{'nothing' if content is None else type(content).__name__}", where, "invalid_value")
    if not content:
        raise bad_request(f"'{where}' is an empty list: send the predicted text, or leave '{FIELD}' out", where,
                          "invalid_value")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"'{at}' must be a text part {{\"type\": \"text\", \"text\": ...}}", at,
                              "invalid_value")
        texts.append(part["text"])
    return "".join(texts)


def prediction_ids(tokenizer: Any, text: str, prompt_tokens: int, context: int | None) -> tuple[int, ...]:
    """The predicted text's token ids (no special tokens added); a 400 when the prompt and the prediction do
    not fit the model's context (the answer could never reach the prediction's end)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    ids = [int(t) for t in (ids[0] if ids and isinstance(ids[0], list) else ids)]
    if not ids:
        raise bad_request(f"'{FIELD}.content' makes no tokens: send the predicted text, or leave '{FIELD}' out",
                          f"{FIELD}.content", "invalid_value")
    if context is not None and prompt_tokens + len(ids) > context:
        raise bad_request(f"the prompt ({prompt_tokens} tokens) and '{FIELD}' ({len(ids)} tokens) come to "
                          f"{prompt_tokens + len(ids)} tokens, past the model's context of {context}: shorten the "
                          f"prediction to at most {max(context - prompt_tokens, 0)} tokens", FIELD,
                          "context_length_exceeded")
    return tuple(ids)
