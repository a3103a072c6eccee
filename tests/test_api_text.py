"""lora_share.run takes a text prompt, encoded with the build's tokenizer, or token ids; anything
else is a TypeError naming the argument and what it takes."""

from __future__ import annotations

import pytest

import lora_share


def test_a_text_prompt_is_the_tokenizers_ids(text_build):
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(text_build.build.out_dir / "tokenizer.json")).encode("1 2 3").ids
    by_text = lora_share.run(text_build.pte, text_build.build.ptd, "1 2 3", 4)
    assert by_text.tokens == lora_share.run(text_build.pte, text_build.build.ptd, ids, 4).tokens


@pytest.mark.parametrize("tokens", [123, ["a", "b"], None])
def test_other_prompts_are_a_type_error_naming_tokens(text_build, tokens):
    with pytest.raises(TypeError, match="tokens must be a text prompt \\(str\\) or a list of token ids"):
        lora_share.run(text_build.pte, text_build.build.ptd, tokens, 4)


def test_max_new_tokens_of_the_wrong_type(text_build):
    with pytest.raises(TypeError, match="max_new_tokens must be an int, got str"):
        lora_share.run(text_build.pte, text_build.build.ptd, [0, 5], "8")
