// One streamed chat completion: POST /v1/chat/completions with "stream": true, its
// server-sent events read as they arrive and folded into the reply message.

// Relative, like every URL of the page, so that it also works behind a proxy under a path.
export const ENDPOINT = "v1/chat/completions";

// The `data:` payloads of a server-sent event stream, one per event.
async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""));
      if (data.length > 0) yield data.join("\n");
    }
  }
}

// The message of an error answer, whichever API shape it has.
async function errorText(response) {
  const text = await response.text();
  let message = text;
  try {
    const body = JSON.parse(text);
    message = body?.error?.message ?? body?.error ?? text;
  } catch {
    // Not JSON: the text as it came.
  }
  const hint = response.status === 401 ? " (set the API key in Settings)" : "";
  return `${response.status}: ${message}${hint}`;
}

// Adds one chunk's deltas to the reply.
export function apply(reply, chunk) {
  if (chunk.usage) reply.usage = chunk.usage;
  for (const choice of chunk.choices ?? []) {
    const delta = choice.delta ?? {};
    if (typeof delta.content === "string") reply.content += delta.content;
    if (typeof delta.reasoning_content === "string") reply.reasoning += delta.reasoning_content;
    for (const call of delta.tool_calls ?? []) {
      const index = call.index ?? reply.toolCalls.length;
      const known = (reply.toolCalls[index] ??= { id: "", name: "", arguments: "" });
      if (call.id) known.id = call.id;
      if (call.function?.name) known.name += call.function.name;
      if (call.function?.arguments) known.arguments += call.function.arguments;
    }
    if (choice.finish_reason) reply.finish = choice.finish_reason;
  }
}

function failure(message, started) {
  const error = new Error(message);
  error.started = started;
  return error;
}

// Streams the reply to `request` into `reply`, calling `onChange` after each event. A
// refusal before the stream starts (an HTTP error, no server) is thrown with `started` false;
// a failure inside it (an error event, a stream cut short) with `started` true. Aborting
// `signal` ends it with an AbortError.
export async function streamChat(request, apiKey, signal, reply, onChange) {
  const headers = { "Content-Type": "application/json" };
  if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
  let response;
  try {
    response = await fetch(ENDPOINT, {
      method: "POST",
      headers,
      body: JSON.stringify(request),
      signal,
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw failure(`the server does not answer (${e.message})`, false);
  }
  if (!response.ok) throw failure(await errorText(response), false);
  for await (const data of events(response.body)) {
    if (data === "[DONE]") return;
    const chunk = JSON.parse(data);
    if (chunk.error) throw failure(chunk.error.message ?? String(chunk.error), true);
    apply(reply, chunk);
    onChange();
  }
  throw failure("the stream ended before its end ([DONE])", true);
}
