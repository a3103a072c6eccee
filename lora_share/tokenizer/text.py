"""Text in and out of ``lora-share run``: prompts encoded with the build's tokenizer, chat messages
rendered with the checkpoint's chat template, and generated ids decoded into text as they arrive.

Encoding is the Hugging Face ``tokenizers`` library on the shipped tokenizer.json with its special
tokens added (its post-processor adds BOS where the model's tokenizer does), the same ids as
transformers' ``AutoTokenizer(prompt)``. Decoding skips special tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from ..errors import UserError
from .files import TOKENIZER_CONFIG, BoundTokenizer

REPLACEMENT = "\ufffd"  # what a decoder yields for bytes that are not (yet) a whole UTF-8 character


def encode_prompt(bound: BoundTokenizer, text: str, flag: str = "--prompt") -> list[int]:
    """The ids of ``text`` with the tokenizer's special tokens added (BOS where the model has one)."""
    ids = bound.tokenizer.encode(text, add_special_tokens=True).ids
    if not ids:
        raise UserError(f"{flag}: the text encodes to no tokens: give some text")
    return ids


def chat_prompt(bound: BoundTokenizer, message: str) -> list[int]:
    """The ids of one user ``message`` in the checkpoint's chat template, ready for the reply.

    transformers renders the template (``apply_chat_template(..., add_generation_prompt=True)``:
    Jinja with its filters and the tokenizer's special tokens); the text is then encoded without
    adding special tokens, as transformers does, since the template writes them itself.
    """
    if not bound.chat_template:
        raise UserError(
            f"{bound.folder / TOKENIZER_CONFIG}: has no chat_template, so --chat cannot format a "
            "message: pass the text as the model expects it with --prompt"
        )
    try:  # only --chat needs transformers: imported here so everything else runs without it
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise UserError(
            "--chat renders the model's chat template with transformers, which is not installed: "
            "pip install 'lora-share[chat]', or pass the formatted text with --prompt"
        ) from None
    import jinja2

    hf = PreTrainedTokenizerFast.from_pretrained(str(bound.folder))
    try:
        rendered = hf.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
        )
    except jinja2.TemplateError as e:
        raise UserError(f"{bound.folder / TOKENIZER_CONFIG}: its chat_template failed on the message: {e}") from None
    ids = bound.tokenizer.encode(rendered, add_special_tokens=False).ids
    if not ids:
        raise UserError(f"{bound.folder / TOKENIZER_CONFIG}: its chat_template rendered no text for the message")
    return ids


class TextStream:
    """Decodes generated ids into text as they arrive and hands ``write`` each new piece.

    Each piece is the difference between the decode of every id so far and what was already
    written, so the pieces add up to exactly ``tokenizer.decode(ids, skip_special_tokens=True)``.
    A decode ending in U+FFFD (bytes of a character whose remaining bytes are in the next token) is
    held back until the character is whole, so no piece ever ends in half a UTF-8 character. Ids in
    ``stop_ids`` (end of sequence) are not text and are left out.
    """

    def __init__(self, tokenizer, write: Callable[[str], None] | None = None, stop_ids: Collection[int] = ()):
        self.tokenizer, self.write, self.stop_ids = tokenizer, write, frozenset(stop_ids)
        self.ids: list[int] = []
        self.written = ""

    def push(self, token_id: int) -> None:
        """Take one generated id; write the text it completes, if any."""
        if token_id in self.stop_ids:
            return
        self.ids.append(token_id)
        text = self._decode()
        if not text.endswith(REPLACEMENT):
            self._write_up_to(text)

    def finish(self) -> str:
        """Write what is still held back; the whole text."""
        text = self._decode()
        self._write_up_to(text)
        return text

    def _decode(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def _write_up_to(self, text: str) -> None:
        # A decoder may rewrite the end of what it decoded when more ids come (never the beginning,
        # for the decoders of causal LMs); only text that extends what was written goes out.
        if text.startswith(self.written) and len(text) > len(self.written):
            if self.write is not None:
                self.write(text[len(self.written) :])
            self.written = text
