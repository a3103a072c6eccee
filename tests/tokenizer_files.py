"""Writers for Hugging Face tokenizer folders, trained with the `tokenizers` library (no downloads).

Two styles real checkpoints ship:

* `byte_level_bpe`: Llama 3 / Qwen / SmolLM — a regex `Split` then `ByteLevel`, byte-level BPE,
  a post-processor that prepends `<|begin_of_text|>`.
* `sentencepiece_bpe`: Llama 2 / Mistral / Gemma as converted to tokenizer.json — `▁` for spaces
  via the normalizer, BPE with `byte_fallback` over `<0x00>`..`<0xFF>`, a post-processor adding `<s>`.

Each writes tokenizer.json, tokenizer_config.json (bos/eos, a Jinja chat template) and
generation_config.json into a folder that `transformers.AutoTokenizer.from_pretrained` loads.
Training is deterministic: same corpus and vocab size -> same files.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

# A small multilingual corpus: enough repeated words for real merges, plus the scripts,
# digits, punctuation and whitespace the parity tests throw at the tokenizers.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.",
    "We're sure they'll say it's fine, but I'd rather you've checked what we've done.",
    "Numbers like 12345, 3.14159 and 2026-11-23 appear in logs: error 404, code 500.",
    "def forward(self, tokens):\n    return self.model(tokens)  # the model's logits\n",
    "Hello, world! How are you today? I am fine, thank you very much.",
    "LoRA adapters share one foundation: every tensor stored once, every adapter small.",
    "Le café est très bon à Paris; l'été dernier, nous avons mangé des crêpes.",
    "Ελληνικά: η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "Русский текст: быстрая коричневая лиса прыгает через ленивую собаку.",
    "中文文本：快速的棕色狐狸跳过了懒狗。日本語のテキストも少しあります。",
    "العربية: الثعلب البني السريع يقفز فوق الكلب الكسول.",
    "Emoji time 😀 👍🏽 👨‍👩‍👧 🎉 and symbols © ® ™ € £ ¥ — “quotes” ‘single’ …",
    "Tabs\tand  double  spaces,\r\nwindows lines,\nunix lines\n\n and trailing   ",
    "The the the and and and of of of to to to in in in is is is that that that.",
    "token tokens tokenizer tokenizers tokenize tokenized tokenizing detokenize",
    "running runner runs ran run; generate generation generator generated.",
]


def _write_configs(out_dir: Path, tokenizer_config: dict, generation_config: dict) -> None:
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False))
    (out_dir / "generation_config.json").write_text(json.dumps(generation_config, indent=2))


def byte_level_bpe(out_dir: Path, vocab_size: int = 400, ignore_merges: bool = True) -> Path:
    """A Llama 3 style tokenizer folder (regex Split + ByteLevel BPE, BOS prepended); returns out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    bos = tok.token_to_id(specials[0])
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{specials[0]} $A",
                pair=f"{specials[0]} $A {specials[0]} $B",
                special_tokens=[(specials[0], bos)],
            ),
        ]
    )
    tok.save(str(out_dir / "tokenizer.json"))
    eos = [tok.token_to_id(specials[1]), tok.token_to_id(specials[2])]
    _write_configs(
        out_dir,
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": specials[0],
            "eos_token": specials[1],
            "clean_up_tokenization_spaces": False,
            "model_max_length": 2048,
            "chat_template": CHAT_TEMPLATE,
        },
        {"bos_token_id": bos, "eos_token_id": eos},
    )
    return out_dir


def _trained_pieces(vocab_size: int) -> tuple[list[str], list[list[str]]]:
    """Pieces and merges of a ▁-style BPE trained on CORPUS (special tokens excluded), in rank order."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    # Training only: split at ▁ so no learned piece spans two words, as sentencepiece's pieces don't.
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    # The trainer's own limit_alphabet breaks count ties in hash order (not deterministic), so pick
    # the alphabet here: the most frequent characters, ties by code point. The rest byte-fall back.
    counts = Counter("".join(CORPUS).replace(" ", "▁"))
    keep = {c for c, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: max(vocab_size // 2, 32)]}
    corpus = ["".join(c for c in line if c in keep or c == " ") for line in CORPUS]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    pieces = [p for p, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    return pieces, model["merges"]


def sentencepiece_bpe(out_dir: Path, vocab_size: int = 400) -> Path:
    """A Llama 2 style tokenizer.json folder (▁ normalizer, byte-fallback BPE, <s> added); returns out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    pieces, merges = _trained_pieces(max(vocab_size - len(specials) - len(byte_tokens), 64))
    vocab = {}
    for piece in specials + byte_tokens + pieces:
        vocab.setdefault(piece, len(vocab))
    added = [
        {
            "id": i,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, s in enumerate(specials)
    ]
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<s>", "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    text = json.dumps(spec, indent=2, ensure_ascii=False)
    Tokenizer.from_str(text)  # refuse to write a file the library itself would not load
    (out_dir / "tokenizer.json").write_text(text)
    _write_configs(
        out_dir,
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "clean_up_tokenization_spaces": False,
            "model_max_length": 2048,
            "chat_template": CHAT_TEMPLATE,
        },
        {"bos_token_id": 1, "eos_token_id": 2},
    )
    return out_dir
