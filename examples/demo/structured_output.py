"""Structured output on the `make demo` deployment, with the official `openai` client (issue 59):

    .venv/bin/python examples/demo/structured_output.py out/smollm2 [--server build/lora-share-server]

Starts build/lora-share-server on the deployment (a free port, --parallel 4) and asks 12 questions:

- `response_format` json_schema (strict) on base and on every adapter, each answer validated by the
  `jsonschema` library;
- `response_format` json_object on the json adapter: each answer parsed as a JSON object;
- the same schema asked for in words only (no response_format), on the json adapter and on base.

Prints valid counts per line and one answer of each.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import jsonschema
from openai import OpenAI

QUESTIONS = [
    "Why is the sky blue?",
    "How do plants make food?",
    "What is a prime number?",
    "Why do we have seasons?",
    "How does a rainbow form?",
    "What causes tides?",
    "How do bees make honey?",
    "Why does ice float on water?",
    "What is gravity?",
    "How do vaccines work?",
    "Why do cats purr?",
    "What makes thunder?",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 300},
        "topic": {"type": "string", "maxLength": 40},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["answer", "topic", "confidence"],
    "additionalProperties": False,
}
IN_WORDS = (
    'Answer as a JSON object with exactly three keys: "answer" (a string), "topic" (a string) and '
    '"confidence" (a number from 0 to 1). '
)
STRICT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
MAX_TOKENS = 256


def validates(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("deployment")
    parser.add_argument("--server", default="build/lora-share-server")
    args = parser.parse_args()
    server = subprocess.Popen(
        [args.server, "--dir", args.deployment, "--port", "0", "--parallel", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stderr.readline()
        if not line.startswith("listening on http://"):
            raise SystemExit(f"the server did not start: {line}{server.stderr.read()}")
        client = OpenAI(base_url=f"http://{line.split('http://', 1)[1].split()[0]}/v1", api_key="unused", max_retries=0)

        def answers(model: str, prefix: str = "", **fields) -> list[str]:
            def ask(question: str) -> str:
                messages = [{"role": "user", "content": prefix + question}]
                r = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS, **fields)
                return r.choices[0].message.content

            with ThreadPoolExecutor(4) as pool:
                return list(pool.map(ask, QUESTIONS))

        def report(what: str, texts: list[str], schema: dict) -> None:
            valid = sum(validates(t, schema) for t in texts)
            print(f"{what}: {valid}/{len(texts)} valid; e.g. {texts[0][:120]!r}", flush=True)

        models = [m.id for m in client.models.list()]
        for model in models:
            report(f"json_schema strict, {model}", answers(model, response_format=STRICT), SCHEMA)
        report("json_object, json", answers("json", response_format={"type": "json_object"}), {"type": "object"})
        for model in ("json", "base"):
            report(f"the schema asked in words only, {model}", answers(model, IN_WORDS), SCHEMA)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
