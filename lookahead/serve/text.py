"""A reply's text as its tokens arrive: decoded incrementally (never half a character), cut at the
first stop string, and never showing text that may yet turn out to be the start of one.

``IncrementalDecoder`` decodes a window of tokens that ends at the newest ones and reads the text
the newest tokens added (the way text-generation-inference and vLLM do it): a token that ends
inside a multi-byte character decodes to U+FFFD, so text is held back while the window's text
ends in one. ``StopScanner`` finds the first stop string in the text so far and holds back the
longest tail that is the start of a stop string. ``ReplyText`` chains the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"  # what a tokenizer decodes an incomplete UTF-8 sequence to
PROMPT_CONTEXT = 5  # prompt tokens decoded before the reply's first: its leading space is then kept as text has it


class IncrementalDecoder:
    """The text of a growing list of tokens, piece by piece, each piece ending on a whole character.

    ``prompt``'s last few tokens are decoded as context (not returned), so a reply's first token reads
    as it does after its prompt (SentencePiece drops a leading space from a text's first token).
    Special tokens (EOS, template markers) are skipped.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = [int(t) for t in list(prompt)[-PROMPT_CONTEXT:]]
        self.prefix = 0  # the window's start: text before read is already returned
        self.read = len(self.ids)  # tokens up to here are returned as text

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))

    def push(self, tokens: Sequence[int]) -> str:
        """The text ``tokens`` add ("" while it would end inside a character, or they add no text yet)."""
        if not len(tokens):
            return ""
        self.ids.extend(int(t) for t in tokens)
        before = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        if len(text) <= len(before) or text.endswith(REPLACEMENT) or not text.startswith(before):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before):]

    def flush(self) -> str:
        """The text not returned yet (at the end of the reply: an unfinished character shows as U+FFFD)."""
        before = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(before):]  # (a tokenizer whose text is not prefix-stable: its best guess)


def partial_tail(text: str, tag: str) -> int:
    """The length of the longest tail of ``text`` that ``tag`` starts with (shorter than ``tag``).

    Only the tails that begin with the tag's first character are compared: text "ab<st", tag "<stop>" -> 3
    ("<st"); text "ab", tag "<stop>" -> 0."""
    tail = text[len(text) - min(len(tag) - 1, len(text)):]
    at = tail.find(tag[0]) if tag else -1
    while at >= 0:
        if tag.startswith(tail[at:]):
            return len(tail) - at
        at = tail.find(tag[0], at + 1)
    return 0


class StopScanner:
    """Cuts text at the first of ``stops``; until it is found, holds back a tail that may start one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.held = ""  # text not returned yet: the start of some stop string
        self.stopped = False

    def feed(self, text: str) -> tuple[str, bool]:
        """(text that can be shown now, whether a stop string was found: the text ends before it)."""
        if self.stopped:
            return "", True
        buffer = self.held + text
        found = [at for at in (buffer.find(stop) for stop in self.stops) if at >= 0]
        if found:
            self.stopped, self.held = True, ""
            return buffer[:min(found)], True
        keep = self._partial(buffer)
        self.held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[:len(buffer) - keep], False

    def _partial(self, text: str) -> int:
        """The length of the longest tail of ``text`` that a stop string starts with (shorter than it)."""
        return max((partial_tail(text, stop) for stop in self.stops), default=0)

    def finish(self) -> str:
        """The held-back tail, at the end of a reply that met no stop string."""
        held, self.held = self.held, ""
        return "" if self.stopped else held


class ReplyText:
    """A reply's visible text from its tokens: decoded incrementally and cut at the first stop string."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt: Sequence[int] = (),
                 stops: Sequence[str] = ()) -> None:
        self.decoder = IncrementalDecoder(tokenizer, prompt)
        self.scanner = StopScanner(stops)

    @property
    def stopped(self) -> bool:
        """Whether a stop string was found (nothing after it is ever returned)."""
        return self.scanner.stopped

    def push(self, tokens: Sequence[int]) -> tuple[str, bool]:
        """(the text ``tokens`` make visible, whether the reply met a stop string)."""
        return self.scanner.feed(self.decoder.push(tokens))

    def finish(self) -> tuple[str, bool]:
        """At the end of the reply: (the rest of its text, whether that met a stop string)."""
        text, stopped = self.scanner.feed(self.decoder.flush())
        return text + self.scanner.finish(), stopped
