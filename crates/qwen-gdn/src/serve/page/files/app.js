// The chat page: wires the settings, the conversation list, the composer and the streamed
// replies together. State lives in store.js (localStorage), requests in request.js and
// stream.js, the DOM in view.js.

import * as store from "./store.js";
import { SAMPLING, chatRequest, requestOptions } from "./request.js";
import { streamChat } from "./stream.js";
import { fillMessage, messageElement, renderConversationList } from "./view.js";

const $ = (id) => document.getElementById(id);
const SETTING_IDS = ["api-key", ...SAMPLING.map((s) => s.id), "thinking", "tools"];

let settings = store.loadSettings();
let conversations = store.loadConversations();
let current = conversations.find((c) => c.id === store.loadCurrentId()) ?? store.newConversation();
// The reply being streamed: {controller, reply, node}, or null.
let busy = null;
let lastSave = 0;

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = text === "";
}

function save() {
  lastSave = Date.now();
  current.updated = Date.now();
  current.title = store.titleOf(current);
  if (current.messages.length > 0 && !conversations.includes(current)) {
    conversations.unshift(current);
  }
  conversations.sort((a, b) => b.updated - a.updated);
  try {
    store.saveConversations(conversations);
    store.saveCurrentId(current.id);
  } catch (e) {
    showError(`Could not save the conversation (${e.message}): delete old conversations.`);
  }
}

function renderList() {
  renderConversationList($("conversations"), conversations, current.id, {
    open(id) {
      if (busy) return;
      current = conversations.find((c) => c.id === id) ?? current;
      store.saveCurrentId(current.id);
      render();
    },
    remove(id) {
      if (busy && current.id === id) return;
      conversations = conversations.filter((c) => c.id !== id);
      if (current.id === id) current = store.newConversation(current.system);
      save();
      render();
    },
  });
}

// The messages of the current conversation, rebuilt whole (on a switch, a send, an end).
function render() {
  renderList();
  $("system").value = current.system;
  const nodes = current.messages.map((message, i) => {
    const node = messageElement(message);
    fillMessage(node, message, {
      streaming: busy?.reply === message,
      last: i === current.messages.length - 1,
      handlers,
    });
    if (busy?.reply === message) busy.node = node;
    return node;
  });
  $("messages").replaceChildren(...nodes);
  document.body.dataset.busy = busy ? "true" : "false";
  $("status").textContent = busy ? "Generating…" : "";
  $("send").hidden = Boolean(busy);
  $("stop").hidden = !busy;
  scrollToEnd(true);
}

function scrollToEnd(always) {
  const box = $("messages");
  const nearEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  if (always || nearEnd) box.scrollTop = box.scrollHeight;
}

// Streams a reply to the conversation as it is. `undo` puts things back as they were when
// the server refuses the request before any reply (a wrong key, say).
async function generate(undo) {
  let request;
  try {
    request = chatRequest(current, settings);
  } catch (e) {
    undo();
    render();
    openSettings(e.message);
    return;
  }
  showError("");
  const reply = { role: "assistant", content: "", reasoning: "", toolCalls: [], finish: null };
  current.messages.push(reply);
  busy = { controller: new AbortController(), reply, node: null };
  save();
  render();
  let firstPiece = null;
  try {
    await streamChat(request, settings["api-key"], busy.controller.signal, reply, () => {
      firstPiece ??= performance.now();
      fillMessage(busy.node, reply, { streaming: true, last: true, handlers });
      scrollToEnd(false);
      if (Date.now() - lastSave > 1000) save();
    });
  } catch (e) {
    if (e.name === "AbortError") {
      reply.stopped = true;
    } else if (e.started === false) {
      current.messages.pop();
      undo();
      showError(e.message);
    } else {
      reply.error = e.message;
    }
  }
  // Decode speed: from the first piece on (the prompt's prefill is not in it).
  reply.seconds = firstPiece === null ? 0 : (performance.now() - firstPiece) / 1000;
  busy = null;
  save();
  render();
}

async function send() {
  const text = $("input").value;
  if (busy || text.trim() === "") return;
  $("input").value = "";
  current.messages.push({ role: "user", content: text });
  await generate(() => {
    current.messages.pop();
    $("input").value = text;
  });
}

function regenerate() {
  if (busy) return;
  const previous = current.messages.at(-1)?.role === "assistant" ? current.messages.pop() : null;
  generate(() => previous && current.messages.push(previous));
}

// The user's answers to the last reply's tool calls, sent back as tool messages.
function answerTools(results) {
  const reply = current.messages.at(-1);
  if (busy || reply?.role !== "assistant") return;
  const answers = reply.toolCalls.map((call, i) => ({
    role: "tool",
    toolCallId: call.id,
    name: call.name,
    content: results[i] ?? "",
  }));
  current.messages.push(...answers);
  generate(() => current.messages.splice(-answers.length));
}

const handlers = { regenerate, answerTools };

function openSettings(problem) {
  $("settings").hidden = false;
  $("settings-toggle").setAttribute("aria-expanded", "true");
  $("settings-error").textContent = problem ?? "";
}

function readSettings() {
  for (const id of SETTING_IDS) settings[id] = $(id).value;
  store.saveSettings(settings);
  try {
    requestOptions(settings);
    $("settings-error").textContent = "";
  } catch (e) {
    $("settings-error").textContent = e.message;
  }
}

// The served model's name, which also tells whether the key is right.
async function showModel() {
  const headers = settings["api-key"] ? { Authorization: `Bearer ${settings["api-key"]}` } : {};
  try {
    const response = await fetch("v1/models", { headers });
    if (response.status === 401) {
      $("model-name").textContent = "qwen-gdn (set the API key in Settings)";
      return;
    }
    const models = await response.json();
    $("model-name").textContent = models.data?.[0]?.id ?? "qwen-gdn";
    document.title = `${$("model-name").textContent} · qwen-gdn`;
  } catch {
    $("model-name").textContent = "qwen-gdn (the server does not answer)";
  }
}

for (const id of SETTING_IDS) {
  $(id).value = settings[id] ?? "";
  // A select may fire only `change`.
  $(id).addEventListener("input", readSettings);
  $(id).addEventListener("change", readSettings);
}
$("api-key").addEventListener("change", showModel);
$("settings").addEventListener("submit", (e) => e.preventDefault());
$("settings-toggle").addEventListener("click", () => {
  const open = $("settings").hidden;
  $("settings").hidden = !open;
  $("settings-toggle").setAttribute("aria-expanded", String(open));
});
$("system").addEventListener("input", () => {
  current.system = $("system").value;
  if (current.messages.length > 0) save();
});
$("new-chat").addEventListener("click", () => {
  if (busy) return;
  current = store.newConversation(current.system);
  render();
  $("input").focus();
});
$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  }
});
$("stop").addEventListener("click", () => busy?.controller.abort());
store.onConversationsChanged(() => {
  const stored = store.loadConversations();
  if (busy) {
    // This tab's reply is still streaming: its conversation stays as it is here.
    conversations = [...stored.filter((c) => c.id !== current.id), current];
    renderList();
  } else {
    conversations = stored;
    current = stored.find((c) => c.id === current.id) ?? store.newConversation(current.system);
    render();
  }
});

render();
showModel();
