"""lora_share/tokenizer/chat_format.py: a chat template resolved into plain text pieces reproduces
transformers' apply_chat_template on conversations it was not read from, or is refused.

Templates are the shapes real checkpoints ship (ChatML as Qwen/SmolLM write it, Llama 3's with
`| trim`, Llama 2's with the system prompt folded into the first turn), set on the test tokenizer, and one
that numbers the turns, which no fixed pieces can write.
"""

from __future__ import annotations

import json

import pytest
from tokenizer_files import byte_level_bpe

from lora_share.tokenizer.chat_format import apply, resolve_chat_format

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_DEFAULT_SYSTEM = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    + CHATML[len("{% for message in messages %}") :]
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set system = '<<SYS>>\\n' + messages[0]['content'] + "
    "'\\n<</SYS>>\\n\\n' %}{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
    "(system if loop.first else '') + message['content'] + ' [/INST]' }}{% else %}{{ ' ' + "
    "message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"
)

CONVERSATIONS = [
    [("user", "What is 2 + 2?")],
    [("system", "Be brief."), ("user", "Hi")],
    [("system", "You count."), ("user", " 1 2 3 \n"), ("assistant", "4 5 6"), ("user", "more")],
    [("user", "a"), ("assistant", "b"), ("user", "c")],
]


def tokenizer_with(tmp_path, template: str):
    from transformers import AutoTokenizer

    folder = byte_level_bpe(tmp_path / "tok", vocab_size=400)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder, AutoTokenizer.from_pretrained(str(folder))


def render(tokenizer, messages):
    return tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in messages], tokenize=False, add_generation_prompt=True
    )


@pytest.mark.parametrize(
    "template, roles, trim",
    [
        (CHATML, {"system", "user", "assistant"}, False),
        (LLAMA3, {"system", "user", "assistant"}, True),
        # A default system prompt when the first message is not one (SmolLM2's, Qwen 2's): kept as
        # default_system, so a system message of one's own replaces it.
        (CHATML_DEFAULT_SYSTEM, {"system", "user", "assistant"}, False),
        # The system prompt folded into the first user turn: likewise left out; the turns are fixed text.
        (LLAMA2, {"user", "assistant"}, False),
    ],
    ids=["chatml", "llama3", "chatml-default-system", "llama2"],
)
def test_pieces_reproduce_the_template(tmp_path, template, roles, trim):
    folder, tokenizer = tokenizer_with(tmp_path, template)
    fmt = resolve_chat_format(folder)
    assert fmt is not None and set(fmt["roles"]) == roles and fmt["trim_content"] is trim
    for messages in CONVERSATIONS:
        if all(r in roles for r, _ in messages):
            assert apply(fmt, messages) == render(tokenizer, messages)


def test_a_template_that_depends_on_more_than_the_role_is_refused(tmp_path):
    numbered = (
        "{% for message in messages %}{{ loop.index ~ '. ' + message['role'] + ': ' + message['content'] "
        "+ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    folder, _ = tokenizer_with(tmp_path, numbered)
    assert resolve_chat_format(folder) is None


def test_no_template_no_format(tmp_path):
    folder = byte_level_bpe(tmp_path / "tok", vocab_size=400)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert resolve_chat_format(folder) is None
