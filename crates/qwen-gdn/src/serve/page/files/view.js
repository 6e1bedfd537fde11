// The page's DOM: the conversation list and the messages. Everything a user or the model
// wrote is put in with textContent, never parsed as HTML, so a reply holding markup or
// script shows as the text it is.

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, className, onClick) {
  const node = element("button", className, label);
  node.type = "button";
  node.addEventListener("click", onClick);
  return node;
}

// navigator.clipboard exists only in secure contexts (https, localhost, 127.0.0.1); a page
// reached over plain http elsewhere copies through a selected text area instead.
async function copyText(text, node) {
  try {
    if (navigator.clipboard) {
      await navigator.clipboard.writeText(text);
    } else {
      const area = element("textarea", "offscreen");
      area.value = text;
      document.body.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    node.textContent = "Copied";
  } catch {
    node.textContent = "Copy failed";
  }
  setTimeout(() => (node.textContent = "Copy"), 1200);
}

export function renderConversationList(list, conversations, currentId, handlers) {
  list.replaceChildren(
    ...conversations.map((c) => {
      const item = element("li", c.id === currentId ? "current" : "");
      item.dataset.id = c.id;
      const open = button(c.title || "New chat", "open", () => handlers.open(c.id));
      open.title = c.title;
      item.append(open, button("×", "delete", () => handlers.remove(c.id)));
      item.lastChild.setAttribute("aria-label", "Delete this conversation");
      return item;
    }),
  );
}

// Arguments as indented JSON when they parse, else as they came.
function prettyArguments(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

function metaText(message) {
  const parts = [];
  if (message.stopped) parts.push("stopped");
  else if (message.finish) parts.push(`finish: ${message.finish}`);
  const tokens = message.usage?.completion_tokens;
  if (tokens !== undefined) {
    parts.push(`${tokens} tokens`);
    if (message.seconds > 0) parts.push(`${(tokens / message.seconds).toFixed(1)} tokens/s`);
  }
  if (message.error) parts.push(`error: ${message.error}`);
  return parts.join(" · ");
}

const ROLE_LABEL = { user: "You", assistant: "Model" };

// A message's element, built once; fillMessage brings it up to date as the reply streams
// (the thinking block keeps whatever open or folded state the user gave it).
export function messageElement(message) {
  const node = element("article", `message ${message.role}`);
  const label = ROLE_LABEL[message.role] ?? `Tool result: ${message.name}`;
  node.append(element("div", "role", label));
  if (message.role === "assistant") {
    const thinking = element("details", "thinking");
    thinking.append(element("summary", "", "Thinking"), element("div", "thinking-text"));
    node.append(thinking);
  }
  node.append(element("div", "content"));
  if (message.role === "assistant") {
    node.append(element("div", "tool-calls"), element("p", "meta"));
  }
  node.append(element("div", "actions"));
  return node;
}

// Under the last reply's tool calls: one field per call for its result, and a button that
// sends them all back (the page runs no tool; the user answers for it).
function toolResultsForm(calls, answerTools) {
  const form = element("form", "tool-results");
  const fields = calls.map((call) => {
    const field = element("textarea", "tool-result");
    field.rows = 2;
    field.placeholder = `The result of ${call.name}, to send back to the model`;
    return field;
  });
  const submit = element("button", "send-results", "Send the results");
  submit.type = "submit";
  form.append(...fields, submit);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    answerTools(fields.map((f) => f.value));
  });
  return form;
}

// `handlers`: regenerate() and answerTools(results), offered on the last reply once it ends.
export function fillMessage(node, message, { streaming, last, handlers }) {
  node.querySelector(".content").textContent = message.content;
  node.classList.toggle("streaming", streaming);
  const actions = node.querySelector(".actions");
  const copy = button("Copy", "copy", () => copyText(message.content, copy));
  actions.replaceChildren(copy);
  if (message.role !== "assistant") return;

  const thinking = node.querySelector(".thinking");
  thinking.hidden = message.reasoning === "";
  thinking.querySelector("summary").textContent =
    streaming && message.content === "" && message.toolCalls.length === 0
      ? "Thinking…"
      : `Thinking (${message.reasoning.length} characters)`;
  thinking.querySelector(".thinking-text").textContent = message.reasoning;

  node.querySelector(".tool-calls").replaceChildren(
    ...message.toolCalls.map((call) => {
      const box = element("div", "tool-call");
      const args = prettyArguments(call.arguments);
      const copyCall = button("Copy", "copy", () => copyText(args, copyCall));
      box.append(
        element("div", "tool-name", `Tool call: ${call.name}`),
        element("pre", "tool-arguments", args),
        copyCall,
      );
      return box;
    }),
  );
  if (last && !streaming && message.toolCalls.length > 0) {
    node.querySelector(".tool-calls").append(toolResultsForm(message.toolCalls, handlers.answerTools));
  }
  node.querySelector(".meta").textContent = metaText(message);
  if (last && !streaming) actions.append(button("Regenerate", "regenerate", handlers.regenerate));
}
