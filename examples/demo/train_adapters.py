"""Train the demo's tokenizer and LoRA adapters over the default config's synthetic foundation.

    .venv/bin/python examples/demo/train_adapters.py          # rewrites examples/demo/{tokenizer,adapters}
    .venv/bin/python examples/demo/train_adapters.py counter  # only the named adapters

The foundation of configs/llama_adapters.yaml is random (seeded) weights, so out of the box every
adapter just echoes the last prompt token. This script gives the demo something to show: a small
Llama 2 style tokenizer over numbers and number words, and four PEFT LoRA adapters, each trained
with peft on transformers' LlamaForCausalLM (loaded with exactly the synthetic weights lora-share
builds) on its own toy task. Every task reads the last number of the prompt and continues from it,
one token at a time, then emits ``</s>``, so one prompt makes each adapter write something
different (see TASKS). The outputs are committed, so `make demo` and the tests never train.

Deterministic (seeded data, init and order; one thread): re-running gives the same files on the
same torch build. Two to four minutes per adapter on one core. The foundation's fingerprint and each
adapter's held-out accuracy are stored in examples/demo/adapters/trained_on.json; tests/test_demo.py
checks the fingerprint still matches the config. Needs transformers and peft (the `test` extra).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CONFIG = REPO / "configs" / "llama_adapters.yaml"
TOKENIZER_DIR = HERE / "tokenizer"
ADAPTERS_DIR = HERE / "adapters"
TRAINED_ON = ADAPTERS_DIR / "trained_on.json"

BOS, EOS = "<s>", "</s>"
NUMBERS = [str(n) for n in range(101)]
WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
DEMO_PROMPT = "1 2 3"

# One recipe for the three counting adapters, another for the speller: lora-share exports one
# program for the envelope both span (o_proj and down_proj up to rank 16) and writes each as data.
COUNT_RECIPE = {"r": 8, "lora_alpha": 16, "target_modules": ["o_proj", "down_proj"]}
SPELL_RECIPE = {"r": 16, "lora_alpha": 16, "target_modules": ["down_proj"], "layers_to_transform": [4, 5, 6, 7]}


def count_up(n: int) -> list[str]:
    """Counts on by one to the next multiple of ten: 3 -> 4 5 6 7 8 9 10."""
    out = [n + 1]
    while out[-1] % 10:
        out.append(out[-1] + 1)
    return [str(k) for k in out]


def count_down(n: int) -> list[str]:
    """Counts down by one to the multiple of ten below: 3 -> 2 1 0, 57 -> 56 ... 50."""
    out = [n - 1]
    while out[-1] % 10:
        out.append(out[-1] - 1)
    return [str(k) for k in out]


def double(n: int) -> list[str]:
    """Doubles while the result stays within 100: 3 -> 6 12 24 48 96."""
    out = [2 * n]
    while 2 * out[-1] <= 100:
        out.append(2 * out[-1])
    return [str(k) for k in out]


def spell(n: int) -> list[str]:
    """Counts on in words to the next ten (at most twenty): 3 -> four five ... ten."""
    out = [n + 1]
    while out[-1] % 10:
        out.append(out[-1] + 1)
    return [WORDS[k] for k in out]


# name -> (rule, the last numbers it accepts, recipe). A number the rule ends on (a multiple of ten,
# or one whose double passes 100) is where the adapter stops, so it is not a starting point.
TASKS = {
    "counter": (count_up, [n for n in range(100) if n % 10], COUNT_RECIPE),
    "countdown": (count_down, [n for n in range(1, 100) if n % 10], COUNT_RECIPE),
    "doubler": (double, list(range(1, 51)), COUNT_RECIPE),
    "speller": (spell, list(range(20)), SPELL_RECIPE),
}

SEED = 0
STEPS = 400
BATCH = 16
LR = 5e-3
TRAIN_ANSWER = 4  # answer tokens per short training example
FULL_EVERY = 4


# --------------------------------------------------------------------------------------------
# Tokenizer


def tokenizer_spec() -> dict:
    """A Llama 2 style tokenizer.json (▁ normalizer, byte-fallback BPE, <s> prepended) whose pieces
    are whole numbers and number words: "▁3", "▁four", "▁100" are one token each."""
    specials = ["<unk>", BOS, EOS]
    pieces, merges = ["▁"], []
    words = NUMBERS + WORDS
    pieces += sorted({c for w in words for c in w})
    for w in words:  # one merge per prefix: "▁" + "f" -> "▁f", "▁f" + "o" -> "▁fo", ...
        for k in range(1, len(w) + 1):
            piece = "▁" + w[:k]
            if piece not in pieces:
                pieces.append(piece)
                merges.append(["▁" + w[: k - 1], w[k - 1]])
    vocab = {}
    for piece in specials + [f"<0x{b:02X}>" for b in range(256)] + pieces:
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
    return {
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
            "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"SpecialToken": {"id": BOS, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": BOS, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {BOS: {"id": BOS, "ids": [1], "tokens": [BOS]}},
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


def write_tokenizer(folder: Path):
    """tokenizer.json, tokenizer_config.json and generation_config.json; returns the loaded Tokenizer."""
    from tokenizers import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(tokenizer_spec(), indent=2, ensure_ascii=False)
    tok = Tokenizer.from_str(text)  # refuse to write a file the library itself would not load
    (folder / "tokenizer.json").write_text(text + "\n")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BOS,
                "eos_token": EOS,
                "unk_token": "<unk>",
                "clean_up_tokenization_spaces": False,
                "model_max_length": 128,
            },
            indent=2,
        )
        + "\n"
    )
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": tok.token_to_id(BOS), "eos_token_id": tok.token_to_id(EOS)}, indent=2) + "\n"
    )
    return tok


# --------------------------------------------------------------------------------------------
# Foundation


def load_foundation():
    """The default config's foundation as lora-share builds it: (Foundation, fingerprint).

    Read from the config's foundation section alone: the config's adapters are this script's output."""
    import yaml

    from lora_share.checkpoints.foundation import synthetic_foundation
    from lora_share.config import SyntheticFoundation
    from lora_share.deploy.builder import foundation_fingerprint

    section = yaml.safe_load(CONFIG.read_text())["foundation"]
    if "synthetic" not in section or "quantize" in section:
        raise SystemExit(f"error: {CONFIG}: foundation must be synthetic and float32 for the demo's adapters")
    foundation = synthetic_foundation(SyntheticFoundation(**section["synthetic"]), section.get("max_seq_len", 128))
    return foundation, foundation_fingerprint(foundation)


def hf_model(foundation):
    """transformers' LlamaForCausalLM holding exactly the foundation's tensors (fp32, tied embeddings)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    a = foundation.args
    config = LlamaConfig(
        hidden_size=a.dim,
        num_hidden_layers=a.n_layers,
        num_attention_heads=a.n_heads,
        num_key_value_heads=a.n_kv_heads,
        intermediate_size=a.hidden_dim,
        vocab_size=a.vocab_size,
        rms_norm_eps=a.norm_eps,
        rope_theta=a.rope_theta,
        tie_word_embeddings=a.tie_embeddings,
        max_position_embeddings=a.max_seq_len,
        attention_bias=False,
        mlp_bias=False,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(foundation.tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.eval()


# --------------------------------------------------------------------------------------------
# Training


def example(rng: random.Random, tok, rule, starts) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids + </s>): a few random numbers ending in a start the rule accepts."""
    context = [str(rng.randrange(101)) for _ in range(rng.randint(0, 4))]
    n = rng.choice(starts)
    prompt = tok.encode(" ".join(context + [str(n)])).ids
    answer = tok.encode(" ".join(rule(n)), add_special_tokens=False).ids + [tok.token_to_id(EOS)]
    return prompt, answer


def training_example(rng: random.Random, tok, rule, starts) -> tuple[list[int], list[int]]:
    """Mostly short examples: each step of a rule depends only on the token before it, and every
    number a chain passes through is also a start, so the first few answer tokens teach every step.
    One in FULL_EVERY is whole, so the steps are also seen as far into the context as the demo goes."""
    prompt, answer = example(rng, tok, rule, starts)
    if rng.randrange(FULL_EVERY) == 0:
        return prompt, answer
    return prompt[:1] + prompt[1:][-3:], answer[:TRAIN_ANSWER]


def batch(rng, tok, rule, starts, size: int):
    """input ids and labels (-100 on the prompt and the padding), right-padded with </s>."""
    rows = [training_example(rng, tok, rule, starts) for _ in range(size)]
    length = max(len(p) + len(a) for p, a in rows)
    pad = tok.token_to_id(EOS)
    ids = [p + a + [pad] * (length - len(p) - len(a)) for p, a in rows]
    labels = [[-100] * len(p) + a + [-100] * (length - len(p) - len(a)) for p, a in rows]
    return torch.tensor(ids), torch.tensor(labels)


def train(foundation, tok, name: str, out: Path) -> dict:
    """Train one adapter with peft and save it to ``out``; returns its held-out accuracy and timing."""
    from peft import LoraConfig, get_peft_model

    rule, starts, recipe = TASKS[name]
    torch.manual_seed(SEED)
    lora = LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, bias="none", **recipe)
    model = get_peft_model(hf_model(foundation), lora)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR)
    # Linear decay to 0: big steps first (the random foundation's logits are large), then settle.
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1 - step / STEPS)
    rng = random.Random(f"{SEED}-{name}")
    model.train()
    t0 = time.time()
    for step in range(STEPS):
        ids, labels = batch(rng, tok, rule, starts, BATCH)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        schedule.step()
        opt.zero_grad()
        if step % 50 == 0 or step == STEPS - 1:
            print(f"  {name} step {step}: loss {loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval()
    accuracy = held_out_accuracy(model, tok, rule, starts, random.Random(f"held-out-{name}"))
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{name}."))
    model.save_pretrained(str(tmp))
    (tmp / "README.md").unlink(missing_ok=True)  # peft's blank model card: the task is described here
    for f in tmp.iterdir():
        f.chmod(0o644)
    tmp.chmod(0o755)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return {"accuracy": accuracy, "seconds": round(time.time() - t0, 1)}


def greedy(model, ids: list[int], eos: int, max_new: int = 16) -> list[int]:
    """Greedy continuation of ``ids`` until </s> (not included) or max_new tokens."""
    out = []
    with torch.no_grad():
        for _ in range(max_new):
            nxt = int(model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
            if nxt == eos:
                break
            out.append(nxt)
    return out


def held_out_accuracy(model, tok, rule, starts, rng, n: int = 50) -> float:
    """Share of fresh random prompts whose greedy answer is exactly the rule's."""
    good = 0
    for _ in range(n):
        prompt, answer = example(rng, tok, rule, starts)
        good += greedy(model, prompt, tok.token_to_id(EOS)) == answer[:-1]
    return good / n


def record_training(fingerprint: str, accuracy: dict) -> None:
    """trained_on.json: the foundation fingerprint and settings, plus each adapter's held-out accuracy
    (merged with the adapters trained in an earlier run, which must share the fingerprint)."""
    old = json.loads(TRAINED_ON.read_text()) if TRAINED_ON.is_file() else {}
    if old.get("foundation_fingerprint") != fingerprint:
        old = {}
    record = {
        "config": str(CONFIG.relative_to(REPO)),
        "foundation_fingerprint": fingerprint,
        "torch": torch.__version__,
        "seed": SEED,
        "steps": STEPS,
        "batch": BATCH,
        "lr": LR,
        "held_out_accuracy": {**old.get("held_out_accuracy", {}), **accuracy},
    }
    tmp = TRAINED_ON.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, TRAINED_ON)


def main() -> int:
    torch.set_num_threads(1)  # one thread: the same float sums, so the same weights, on any machine
    tok = write_tokenizer(TOKENIZER_DIR)
    foundation, fingerprint = load_foundation()
    ADAPTERS_DIR.mkdir(parents=True, exist_ok=True)
    results = {}
    names = sys.argv[1:] or list(TASKS)
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        print(f"error: no task {', '.join(unknown)}; the tasks are {', '.join(TASKS)}", file=sys.stderr)
        return 2
    for name in names:
        results[name] = train(foundation, tok, name, ADAPTERS_DIR / name)
        print(f"{name}: held-out accuracy {results[name]['accuracy']:.0%}, {results[name]['seconds']} s", flush=True)
    record_training(fingerprint, {k: v["accuracy"] for k, v in results.items()})
    bad = [k for k, v in results.items() if v["accuracy"] < 1.0]
    if bad:
        print(f"error: {', '.join(bad)} did not learn its task on every held-out prompt", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
