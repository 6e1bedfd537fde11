// The OpenAI chat request a conversation and the settings make, and the settings' checks.

// Sampling fields: the settings' input id, the request field, and how the text is read.
export const SAMPLING = [
  { id: "temperature", field: "temperature", integer: false },
  { id: "top-p", field: "top_p", integer: false },
  { id: "top-k", field: "top_k", integer: true },
  { id: "min-p", field: "min_p", integer: false },
  { id: "repetition-penalty", field: "repetition_penalty", integer: false },
  { id: "presence-penalty", field: "presence_penalty", integer: false },
  { id: "max-tokens", field: "max_tokens", integer: true },
  { id: "seed", field: "seed", integer: true },
];

// The request's settings part, or an Error naming the setting at fault. Empty fields are
// left out, so the server's defaults (the checkpoint's generation_config.json) apply; the
// server checks the ranges and its message is shown as it is.
export function requestOptions(settings) {
  const options = {};
  for (const { id, field, integer } of SAMPLING) {
    const text = (settings[id] ?? "").trim();
    if (text === "") continue;
    const value = Number(text);
    if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
      throw new Error(`${field}: "${text}" is not ${integer ? "an integer" : "a number"}`);
    }
    options[field] = value;
  }
  if (settings.thinking === "on" || settings.thinking === "off") {
    options.chat_template_kwargs = { enable_thinking: settings.thinking === "on" };
  }
  const tools = (settings.tools ?? "").trim();
  if (tools !== "") {
    let parsed;
    try {
      parsed = JSON.parse(tools);
    } catch (e) {
      throw new Error(`tools: not JSON (${e.message})`);
    }
    if (!Array.isArray(parsed)) throw new Error("tools: must be a JSON array");
    if (parsed.length > 0) options.tools = parsed;
  }
  return options;
}

// The messages the model sees: the system prompt, then every turn that has something to
// say, tool results included. Thinking is not sent back (the Qwen templates drop it from earlier turns); tool calls
// are, so the model sees what it called.
export function requestMessages(conversation) {
  const messages = [];
  if (conversation.system.trim() !== "") {
    messages.push({ role: "system", content: conversation.system });
  }
  for (const m of conversation.messages) {
    if (m.role === "user") {
      messages.push({ role: "user", content: m.content });
      continue;
    }
    if (m.role === "tool") {
      messages.push({ role: "tool", tool_call_id: m.toolCallId, content: m.content });
      continue;
    }
    const calls = m.toolCalls ?? [];
    if (m.content === "" && calls.length === 0) continue;
    const message = { role: "assistant", content: m.content };
    if (calls.length > 0) {
      message.tool_calls = calls.map((c) => ({
        id: c.id,
        type: "function",
        function: { name: c.name, arguments: c.arguments },
      }));
    }
    messages.push(message);
  }
  return messages;
}

export function chatRequest(conversation, settings) {
  return {
    messages: requestMessages(conversation),
    stream: true,
    stream_options: { include_usage: true },
    ...requestOptions(settings),
  };
}
