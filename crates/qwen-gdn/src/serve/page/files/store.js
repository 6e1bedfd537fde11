// What the page keeps in the browser's localStorage: the settings (the API key among them,
// so it never leaves this browser but for this server) and the conversations.
//
// A conversation: {id, title, system, messages: [message], updated}. A message:
// {role: "user", content}, {role: "tool", toolCallId, name, content} (the user's answer to a
// call), or {role: "assistant", content, reasoning, toolCalls: [{id, name, arguments}],
// finish, usage, seconds, stopped, error}.

const SETTINGS = "qwen-gdn.settings";
const CONVERSATIONS = "qwen-gdn.conversations";
const CURRENT = "qwen-gdn.current";

function read(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

// Throws when the browser's quota is full; the caller says so.
function write(key, value) {
  localStorage.setItem(key, JSON.stringify(value));
}

export function loadSettings() {
  return read(SETTINGS, {});
}

export function saveSettings(settings) {
  write(SETTINGS, settings);
}

export function loadConversations() {
  const list = read(CONVERSATIONS, []);
  return Array.isArray(list) ? list.filter((c) => c && Array.isArray(c.messages)) : [];
}

export function saveConversations(conversations) {
  write(CONVERSATIONS, conversations);
}

export function loadCurrentId() {
  return read(CURRENT, null);
}

export function saveCurrentId(id) {
  write(CURRENT, id);
}

// Calls `callback` when another tab of this page changes the saved conversations, so that
// this one does not write back a list without them.
export function onConversationsChanged(callback) {
  window.addEventListener("storage", (e) => {
    if (e.key === CONVERSATIONS || e.key === null) callback();
  });
}

export function newConversation(system) {
  const id = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
  return { id, title: "", system: system ?? "", messages: [], updated: Date.now() };
}

// The first user message, shortened: what the conversation list shows.
export function titleOf(conversation) {
  const first = conversation.messages.find((m) => m.role === "user");
  const text = (first?.content ?? "").replace(/\s+/g, " ").trim();
  return text.length > 48 ? `${text.slice(0, 47)}…` : text || "New chat";
}
