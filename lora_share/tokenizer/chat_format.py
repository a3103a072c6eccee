"""A chat template resolved into plain text pieces, so that runtimes without Jinja (the C++ server)
can turn chat messages into a prompt exactly as transformers' ``apply_chat_template`` does.

Most chat templates wrap each message in fixed text that depends only on its role:

    prompt = prefix + Σ (roles[role][0] + content + roles[role][1]) + generation_prompt

(each content stripped of surrounding whitespace first when ``trim_content``, as Llama 3's does).

``resolve_chat_format`` renders a few conversations whose contents are sentinels, reads the pieces
off them, and keeps the result only if it reproduces the template on other conversations (several
turns, every role, an assistant answer last). A default system prompt the template adds
when there is none (SmolLM2's, Qwen 2's) is kept as ``default_system``: the runtimes put it first as
a system message when the conversation does not start with one. Templates whose text depends on more
than the role (a system prompt folded into the first user turn, as Llama 2's) are not resolved:
those builds serve chat from Python only.
"""

from __future__ import annotations

import os
from pathlib import Path

# Sentinel contents: text no template writes itself, and that survives any whitespace trimming.
_S, _U, _A, _U2 = "\u27e6sys\u27e7", "\u27e6user\u27e7", "\u27e6assistant\u27e7", "\u27e6user2\u27e7"

# Conversations the pieces must reproduce before they are trusted.
_CHECKS = [
    [("user", "Hi")],
    [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "Bye")],
    [("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"), ("user", "e")],
    [("system", "s"), ("user", "u")],
]


def _render(tokenizer, messages, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in messages], tokenize=False, add_generation_prompt=generation_prompt
    )


def _split(text: str, *sentinels: str) -> list[str] | None:
    """``text`` cut around each sentinel in turn: n sentinels give n + 1 pieces; None if one is missing."""
    pieces = []
    for s in sentinels:
        head, found, text = text.partition(s)
        if not found:
            return None
        pieces.append(head)
    return pieces + [text]


def _cut(text: str, head: str = "", tail: str = "") -> str | None:
    """``text`` without ``head`` at its start and ``tail`` at its end; None if it lacks either."""
    if not text.startswith(head) or not text.endswith(tail) or len(head) + len(tail) > len(text):
        return None
    return text[len(head) : len(text) - len(tail)]


def _pieces(tokenizer) -> dict | None:
    """The pieces read off sentinel conversations (checked by the caller): each role's text before
    and after its content from where it sits between other messages, the prefix from what is left."""
    plain, with_gen = (_render(tokenizer, [("user", _U)], g) for g in (False, True))
    user = _split(plain, _U)
    turns = _split(_render(tokenizer, [("user", _U), ("assistant", _A), ("user", _U2)], False), _U, _A, _U2)
    last = _split(_render(tokenizer, [("user", _U), ("assistant", _A)], False), _U, _A)
    if user is None or turns is None or last is None or not with_gen.startswith(plain):
        return None
    before_user, post_user = user
    post_assistant = last[2]
    pre_assistant = _cut(turns[1], head=post_user)
    pre_user = _cut(turns[2], head=post_assistant)
    prefix = None if pre_user is None else _cut(before_user, tail=pre_user)
    if pre_assistant is None or prefix is None or turns[3] != post_user:
        return None
    roles = {"user": [pre_user, post_user], "assistant": [pre_assistant, post_assistant]}
    try:
        system = _split(_render(tokenizer, [("system", _S), ("user", _U)], False), _S, _U)
    except Exception:  # templates that refuse a system message (Gemma's raise an exception)
        system = None
    format_ = {"prefix": prefix, "roles": roles, "generation_prompt": with_gen[len(plain) :]}
    if system is not None:
        pre_system, post_system = _cut(system[0], head=prefix), _cut(system[1], tail=pre_user)
        if pre_system is not None and post_system is not None:
            roles["system"] = [pre_system, post_system]
        elif post_system is not None:
            # A default system prompt written when the conversation has none (SmolLM2's, Qwen 2's): what
            # precedes the first user turn is then the system role's pieces around that default text.
            default = _cut(prefix, head=system[0], tail=post_system)
            if default is not None:
                roles["system"] = [system[0], post_system]
                format_.update(prefix="", default_system=default)
    return format_


def apply(format_: dict, messages) -> str:
    """The prompt text ``format_`` gives for ``messages`` [(role, content)], with the generation prompt."""
    roles, trim = format_["roles"], format_.get("trim_content", False)
    turns = [(r, c.strip() if trim else c) for r, c in messages]
    if "default_system" in format_ and (not turns or turns[0][0] != "system"):
        turns.insert(0, ("system", format_["default_system"]))
    return format_["prefix"] + "".join(roles[r][0] + c + roles[r][1] for r, c in turns) + format_["generation_prompt"]


def resolve_chat_format(folder: Path) -> dict | None:
    """``{"prefix", "roles": {role: [before, after]}, "generation_prompt", "trim_content"}`` for the chat template of
    the tokenizer in ``folder``, or None when it has none or it cannot be written this way."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        if not getattr(tokenizer, "chat_template", None):
            return None
        format_ = _pieces(tokenizer)
        if format_ is None:
            return None
        # Templates that strip each message (Llama 3's `| trim`) are followed; others must keep it as is.
        padded = [("user", " Hi there \n")]
        format_["trim_content"] = apply({**format_, "trim_content": True}, padded) == _render(tokenizer, padded, True)
        for messages in _CHECKS + [padded]:
            if any(r not in format_["roles"] for r, _ in messages):
                continue
            if apply(format_, messages) != _render(tokenizer, messages, True):
                return None
    except Exception:  # a template that fails to render any of these has no fixed pieces either
        return None
    return format_
