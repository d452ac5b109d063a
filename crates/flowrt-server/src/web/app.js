// flowrt's chat page: plain JavaScript, no dependencies, talks only to the server it came
// from (/v1/models, /v1/chat/completions with SSE streaming).
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "flowrt.apiKey";

// The conversation sent with every request: {role, content} without the system prompt.
let history = [];
// The request in flight, if any.
let controller = null;

function setState(state) {
  document.body.dataset.state = state;
  const busy = state === "streaming";
  $("send").disabled = busy || state === "loading";
  $("stop").disabled = !busy;
  $("new-chat").disabled = busy;
}

function status(text) {
  $("status").textContent = text || "";
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// The error message of a non-2xx answer (OpenAI's {"error": {"message"}} shape).
async function errorText(resp) {
  const body = await resp.text();
  try {
    const e = JSON.parse(body).error;
    return typeof e === "string" ? e : e.message;
  } catch (_) {
    return body || resp.statusText;
  }
}

// ---- Models ---------------------------------------------------------------------------

let models = [];

async function loadModels() {
  setState("loading");
  const select = $("model");
  const previous = select.value;
  select.replaceChildren();
  let resp;
  try {
    resp = await fetch("/v1/models", { headers: headers() });
  } catch (e) {
    status("Cannot reach the server: " + e.message);
    return;
  }
  if (resp.status === 401) {
    status("This server needs an API key: enter it on the left.");
    return;
  }
  if (!resp.ok) {
    status("Listing models failed: " + (await errorText(resp)));
    return;
  }
  models = (await resp.json()).data || [];
  for (const m of models) {
    const opt = document.createElement("option");
    opt.value = m.id;
    const sha = m.sha256 ? m.sha256.slice(0, 12) : "no sha256";
    const chat = m.generates !== false;
    opt.textContent = m.id + " · " + sha + (chat ? "" : " · embedding only");
    opt.disabled = !chat;
    select.append(opt);
  }
  const usable = models.filter((m) => m.generates !== false).map((m) => m.id);
  if (usable.length === 0) {
    status(models.length ? "No served model can chat (they only embed)." : "The server serves no model.");
    setState("idle");
    $("send").disabled = true;
    return;
  }
  select.value = usable.includes(previous) ? previous : usable[0];
  status("");
  showModelInfo();
  setState("idle");
}

function showModelInfo() {
  const m = models.find((x) => x.id === $("model").value);
  $("model-info").textContent = m
    ? [m.architecture, m.quantization, m.parameter_count ? (m.parameter_count / 1e6).toFixed(0) + "M params" : "",
       "ctx " + m.context_length, "sha256 " + m.sha256].filter(Boolean).join(" · ")
    : "";
}

// ---- Markdown -------------------------------------------------------------------------
// Model text is escaped first; the renderer then only wraps escaped text in a fixed set of
// tags, so nothing the model writes becomes markup.

function escapeHtml(s) {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}

// Inline spans of one escaped line: `code`, **bold**, *italic* / _italic_.
function inline(s) {
  return s.split(/(`[^`]+`)/).map((part, i) => {
    if (i % 2 === 1) return "<code>" + part.slice(1, -1) + "</code>";
    return part
      .replace(/\*\*(?=\S)(.+?)\*\*/g, "<strong>$1</strong>")
      .replace(/__(?=\S)(.+?)__/g, "<strong>$1</strong>")
      .replace(/(^|[^*\w])\*(?=\S)([^*]+?)\*(?!\w)/g, "$1<em>$2</em>")
      .replace(/(^|[^_\w])_(?=\S)([^_]+?)_(?!\w)/g, "$1<em>$2</em>");
  }).join("");
}

function renderMarkdown(text) {
  const lines = escapeHtml(text).split("\n");
  const out = [];
  let para = [];
  let list = null; // {tag, items}
  const flushPara = () => {
    if (para.length) out.push("<p>" + para.map(inline).join("<br>") + "</p>");
    para = [];
  };
  const flushList = () => {
    if (list) out.push("<" + list.tag + ">" + list.items.map((x) => "<li>" + inline(x) + "</li>").join("") + "</" + list.tag + ">");
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```/);
    if (fence) {
      flushPara();
      flushList();
      const code = [];
      i++;
      // An unclosed fence (an answer still streaming) runs to the end.
      while (i < lines.length && !/^\s*```/.test(lines[i])) code.push(lines[i++]);
      out.push("<pre><code>" + code.join("\n") + "</code></pre>");
      continue;
    }
    const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
    const numbered = line.match(/^\s*\d+[.)]\s+(.*)$/);
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (bullet || numbered) {
      flushPara();
      const tag = bullet ? "ul" : "ol";
      if (list && list.tag !== tag) flushList();
      if (!list) list = { tag, items: [] };
      list.items.push((bullet || numbered)[1]);
    } else if (heading) {
      flushPara();
      flushList();
      const level = Math.min(heading[1].length + 1, 4);
      out.push("<h" + level + ">" + inline(heading[2]) + "</h" + level + ">");
    } else if (line.trim() === "") {
      flushPara();
      flushList();
    } else if (list && /^\s+\S/.test(line)) {
      list.items[list.items.length - 1] += " " + line.trim();
    } else {
      flushList();
      para.push(line);
    }
  }
  flushPara();
  flushList();
  return out.join("");
}

// ---- Conversation ---------------------------------------------------------------------

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const label = document.createElement("div");
  label.className = "role";
  label.textContent = role;
  const content = document.createElement("div");
  content.className = "content";
  if (role === "assistant") content.innerHTML = renderMarkdown(text);
  else content.textContent = text;
  div.append(label, content);
  $("messages").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function fmt(x, digits) {
  return Number.isFinite(x) ? x.toFixed(digits) : "–";
}

// Sampling settings the user filled in; empty fields are left to the server.
function sampling() {
  const body = {};
  for (const [id, parse] of [["temperature", parseFloat], ["top_p", parseFloat], ["max_tokens", (v) => parseInt(v, 10)], ["seed", (v) => parseInt(v, 10)]]) {
    const v = $(id).value.trim();
    if (v !== "") body[id] = parse(v);
  }
  return body;
}

async function send(text) {
  const model = $("model").value;
  if (!model || controller) return;
  status("");
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...history);
  const body = { model, messages, stream: true, stream_options: { include_usage: true }, ...sampling() };

  const div = addMessage("assistant", "");
  const content = div.querySelector(".content");
  const stats = document.createElement("div");
  stats.className = "stats";
  div.append(stats);
  let answer = "";
  let reasoning = "";
  let usage = null;
  let finish = null;
  let firstAt = null;
  let failed = null;
  const started = performance.now();
  controller = new AbortController();
  setState("streaming");
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!resp.ok) throw new Error(await errorText(resp));
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    let done = false;
    while (!done) {
      const r = await reader.read();
      if (r.done) break;
      buf += decoder.decode(r.value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") { done = true; break; }
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
          if (chunk.usage) usage = chunk.usage;
          const choice = (chunk.choices || [])[0];
          if (!choice) continue;
          if (choice.finish_reason) finish = choice.finish_reason;
          const d = choice.delta || {};
          if (d.reasoning_content) reasoning += d.reasoning_content;
          if (d.content) {
            if (firstAt === null) firstAt = performance.now();
            answer += d.content;
          }
          content.innerHTML = (reasoning ? "<p class=\"hint\">" + escapeHtml(reasoning) + "</p>" : "") + renderMarkdown(answer);
        }
      }
      div.scrollIntoView({ block: "end" });
    }
  } catch (e) {
    failed = e;
  }
  const ended = performance.now();
  const stopped = failed && failed.name === "AbortError";
  controller = null;
  const ttft = firstAt === null ? NaN : firstAt - started;
  const parts = ["TTFT " + fmt(ttft, 0) + " ms"];
  if (usage) {
    const n = usage.completion_tokens;
    // Decode rate: the tokens after the first over the time after the first.
    const rate = n > 1 && firstAt !== null ? (n - 1) / ((ended - firstAt) / 1000) : NaN;
    parts.push(n + " tokens", fmt(rate, 1) + " tok/s", "prompt " + usage.prompt_tokens + " tokens");
  }
  parts.push("total " + fmt((ended - started) / 1000, 2) + " s");
  if (finish) parts.push("finish: " + finish);
  if (stopped) parts.push("stopped (the server reports no token count for a stopped answer)");
  stats.textContent = parts.join(" · ");
  if (failed && !stopped) {
    div.classList.add("error");
    status("Error: " + failed.message);
    if (!answer) {
      content.textContent = failed.message;
      history.pop(); // the question stays on screen but is not resent
      setState("idle");
      return;
    }
  }
  // A stopped answer stays in the conversation as far as it got.
  history.push({ role: "assistant", content: answer });
  setState("idle");
}

// ---- Wiring ---------------------------------------------------------------------------

function init() {
  $("api-key").value = localStorage.getItem(KEY_STORE) || "";
  $("api-key").addEventListener("change", () => {
    localStorage.setItem(KEY_STORE, $("api-key").value.trim());
    loadModels();
  });
  $("model").addEventListener("change", showModelInfo);
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  $("new-chat").addEventListener("click", () => {
    history = [];
    $("messages").replaceChildren();
    status("");
  });
  loadModels();
}

init();
