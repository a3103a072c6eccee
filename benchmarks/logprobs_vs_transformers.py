"""The server's log-probabilities against an independent reference, on the real model (issue 59): the first
token's top_logprobs (5) against transformers' log-softmax of the same GGUF loaded in float32, and each
chosen token against its step's top-1 under greedy decoding, through the official openai client.

    make demo-outputs
    .venv/bin/python benchmarks/logprobs_vs_transformers.py . out/smollm2 models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

(the first argument is the checkout whose build/lora-share-server runs).
"""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
from openai import OpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

wt, out, gguf = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
proc = subprocess.Popen(
    [str(wt / "build/lora-share-server"), "--dir", str(out), "--port", str(port), "--parallel", "1"],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
for _ in range(300):
    try:
        client.models.list()
        break
    except Exception:
        time.sleep(0.2)
tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
worst, top1_ok, n = 0.0, 0, 0
for prompt in ["The capital of France is", "Water boils at", "def fibonacci(n):", "Once upon a time"]:
    r = client.completions.create(model="base", prompt=prompt, max_tokens=6, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    ids = tok(prompt, return_tensors="pt").input_ids
    assert ids.shape[1] == r.usage.prompt_tokens, (ids.shape, r.usage.prompt_tokens)
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits[0, -1].double(), -1)
    top = torch.topk(ref, 5)
    ref_top = {tok.decode([int(i)]): float(v) for i, v in zip(top.indices, top.values)}
    got = lp.top_logprobs[0]
    for text, value in got.items():
        worst = max(worst, abs(value - ref_top.get(text, float("nan"))) if text in ref_top else float("inf"))
    # each chosen token is its own step's top-1
    for chosen, tops in zip(lp.tokens, lp.top_logprobs):
        n += 1
        top1_ok += int(max(tops, key=tops.get) == chosen)
    print(json.dumps({"prompt": prompt, "server": got, "transformers": ref_top}))
print(
    f"first-token top_logprobs(5): worst |server - transformers| = {worst:.2e} (bound 2e-3); "
    f"chosen == top-1: {top1_ok}/{n}"
)
proc.terminate()
proc.wait()
