// The server's public HTTP API, called as any client calls it: the page has no other door.

export class ApiError extends Error {}

async function errorOf(res) {
  const body = await res.json().catch(() => null);
  return new ApiError(body?.error?.message ?? `HTTP ${res.status}`);
}

export async function getJson(path) {
  const res = await fetch(path, { cache: "no-store" });
  if (!res.ok) throw await errorOf(res);
  return res.json();
}

export async function sendJson(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!res.ok) throw await errorOf(res);
  return res.json();
}

// One streamed chat completion. `onText(piece, progress)` runs for every piece of text as it arrives.
// Resolves with the whole answer, its `tokens` and `promptTokens` (usage) and its timing: `startAt`,
// `firstAt` (first token) and `lastAt` (last token), in performance.now() milliseconds.
export async function streamChat(body, onText, signal) {
  const progress = {
    text: "",
    tokens: 0,
    promptTokens: null,
    startAt: performance.now(),
    firstAt: null,
    lastAt: null,
    finish: null,
  };
  const res = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!res.ok) throw await errorOf(res);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new ApiError("the server closed the stream before its end");
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      if (!event.startsWith("data: ")) continue;
      const data = event.slice("data: ".length);
      if (data === "[DONE]") return progress;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(chunk.error.message);
      if (chunk.usage) {
        progress.tokens = chunk.usage.completion_tokens;
        progress.promptTokens = chunk.usage.prompt_tokens;
      }
      const choice = chunk.choices?.[0];
      if (!choice) continue;
      if (choice.tokens?.length) {
        const now = performance.now();
        progress.firstAt ??= now;
        progress.lastAt = now;
        progress.tokens += choice.tokens.length;
      }
      if (choice.finish_reason) progress.finish = choice.finish_reason;
      const piece = choice.delta?.content ?? "";
      if (piece) {
        progress.text += piece;
        onText(piece, progress);
      }
    }
  }
}

// Generation speed: the tokens after the first over the time from the first to the last, as
// llama-server reports it (the wait for the first token, the prompt's and the queue's, is shown apart).
// When every token came in one read of the stream (a tiny model), over the whole request instead.
// Null until a token has arrived.
export function tokensPerSecond(progress) {
  const { tokens, startAt, firstAt, lastAt } = progress;
  if (tokens === 0 || lastAt === null) return null;
  if (tokens >= 2 && lastAt > firstAt) return (tokens - 1) / ((lastAt - firstAt) / 1000);
  return lastAt > startAt ? tokens / ((lastAt - startAt) / 1000) : null;
}

export function formatRate(rate) {
  return rate.toFixed(rate < 100 ? 1 : 0);
}

// What ended an answer, in a word or two.
export function finishLabel(finish) {
  return finish === "length" ? "max tokens" : "ended";
}
