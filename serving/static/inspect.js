// The ragpress inspector: compress, explain, answer. Plain browser JavaScript, no build step, no other origin.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { config: null, examples: [] };

function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function setStatus(text, isError) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", !!isError);
  el.setAttribute("role", isError ? "alert" : "status");
}

// Every call to this proxy: the key typed into the page as a Bearer key, else what the browser holds (a Basic
// login for this page is accepted by the API too). A 401 shows the key field.
async function api(path, body) {
  const headers = {};
  const key = $("key").value || sessionStorage.getItem("ragpress-key");
  if (key) headers.Authorization = "Bearer " + key;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method: body === undefined ? "GET" : "POST", headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await resp.json(); } catch (e) { data = null; }
  if (resp.status === 401) { $("key-row").hidden = false; }
  if (!resp.ok) {
    const msg = data && data.error ? data.error.message : resp.status + " " + resp.statusText;
    throw new Error(msg);
  }
  if (key) sessionStorage.setItem("ragpress-key", key);
  return data;
}

// Passages: blocks separated by a blank line; a first line "# Title" is the block's title.
function parsePassages(text) {
  return text.split(/\n[ \t]*\n/).map((b) => b.replace(/^\s*\n|\s+$/g, "")).filter((b) => b.trim()).map((b) => {
    const lines = b.split("\n");
    if (lines.length > 1 && lines[0].startsWith("# ")) {
      return { title: lines[0].slice(2).trim(), text: lines.slice(1).join("\n").trim() };
    }
    return { text: b.trim() };
  });
}

function formatPassages(docs) {
  return docs.map((d) => (d.title ? "# " + d.title + "\n" : "") + d.text).join("\n\n");
}

function fmt(x, digits) { return x === null || x === undefined ? "-" : Number(x).toFixed(digits); }

// Score buckets k0..k4 over the kept sentences' range in this request (classes, not inline styles: the page's
// content security policy allows none).
function bucketer(explanation) {
  const scores = [];
  for (const p of explanation.passages) for (const s of p.sentences) if (s.score !== null) scores.push(s.score);
  if (!scores.length) return () => "k-";
  let lo = Infinity, hi = -Infinity;
  for (const x of scores) { if (x < lo) lo = x; if (x > hi) hi = x; }
  return (score) => {
    if (score === null) return "k-";
    if (hi <= lo) return "k4";
    return "k" + Math.min(4, Math.floor(((score - lo) / (hi - lo)) * 5));
  };
}

function sentenceTitle(s) {
  const score = s.score === null ? "no score" : "score " + fmt(s.score, 3);
  const cov = s.coverage < 1 && s.kept ? ", " + Math.round(s.coverage * 100) + "% kept" : "";
  return score + " · " + (s.kept ? "kept" : "dropped") + " (" + s.reason.replace("_", " ") + cov + ") · " +
    s.tokens + " tokens";
}

function renderPassage(p, doc, bucket, parts) {
  const kept = p.sentences.filter((s) => s.kept).length;
  const slots = p.slots !== null ? p.slots + " slots, " : "";
  const dup = p.duplicate_of !== null ? " · repeat of passage " + (p.duplicate_of + 1) : "";
  const ratio = p.ratio === null ? "nothing kept" : fmt(p.ratio, 1) + "x";
  parts.push('<article class="passage' + (kept ? "" : " none-kept") + '" tabindex="0" data-p="' + p.index +
    '" aria-label="Passage ' + (p.index + 1) + ": " + kept + " of " + p.sentences.length + ' sentences kept">');
  parts.push("<h3>" + (p.index + 1) + ". " + escapeHtml(p.title || "(untitled)") + '<span class="stats">' +
    kept + "/" + p.sentences.length + " sentences · " + p.tokens_in + " → " + p.tokens_out + " tokens (" + slots +
    ratio + ")" + dup + "</span></h3><p>");
  let at = 0;
  const text = doc.text;
  for (const s of p.sentences) {
    const [a, b] = s.span;
    if (a > at) parts.push(escapeHtml(text.slice(at, a)));
    const cls = p.slots !== null && s.kept ? "soft" : s.kept ? "kept " + bucket(s.score) : "dropped";
    parts.push('<span class="s ' + cls + '" data-p="' + p.index + '" data-s="' + s.sentence + '" data-kept="' +
      (s.kept ? 1 : 0) + '" title="' + escapeHtml(sentenceTitle(s)) + '">' + escapeHtml(text.slice(a, b)) +
      "</span>");
    at = b;
  }
  if (at < text.length) parts.push(escapeHtml(text.slice(at)));
  parts.push("</p></article>");
}

function renderExplanation(block, docs) {
  const t0 = performance.now();
  const ex = block.explanation && block.explanation[0];
  const view = $("view");
  if (!ex) { view.textContent = "Nothing to explain: compression was off or there were no passages."; return 0; }
  const bucket = bucketer(ex);
  const parts = [];
  for (const p of ex.passages) renderPassage(p, docs[p.index], bucket, parts);
  view.innerHTML = parts.join("");
  const kept = ex.passages.reduce((n, p) => n + p.sentences.filter((s) => s.kept).length, 0);
  const total = ex.passages.reduce((n, p) => n + p.sentences.length, 0);
  const soft = block.kind === "soft" ? " soft slots" : " tokens";
  $("summary").textContent = block.method + ": " + block.tokens_before + " → " + block.tokens_after + soft +
    " (" + (block.ratio === null ? "nothing kept" : fmt(block.ratio, 2) + "x") + "; stopped by " +
    (block.stopped_by || "-") + "), " + kept + " of " + total + " sentences kept, compressed in " +
    fmt(block.compression_ms, 1) + " ms";
  const ms = performance.now() - t0;
  $("results").dataset.renderMs = ms.toFixed(1);
  $("results").dataset.sentences = String(total);
  return ms;
}

async function answer(question, docs, compression, which) {
  const t0 = performance.now();
  const out = await api("/v1/chat/completions", {
    model: state.config.model, messages: [{ role: "user", content: question }], documents: docs,
    max_tokens: 64, temperature: 0, compression,
  });
  const ms = performance.now() - t0;
  const c = out.compression || {};
  $("answer-" + which).textContent = (out.choices[0].message.content || "").trim() || "(empty answer)";
  $("meta-" + which).textContent = fmt(ms, 0) + " ms end to end" + (c.enabled ? ", " + fmt(c.compression_ms, 1) +
    " ms compressing" : "") + " · " + (out.usage ? out.usage.prompt_tokens + " prompt tokens" : "");
}

async function run(ev) {
  ev.preventDefault();
  const question = $("question").value.trim();
  const docs = parsePassages($("passages").value);
  if (!question || !docs.length) { setStatus("Give a question and at least one passage.", true); return; }
  const ratio = parseFloat($("ratio").value);
  const compression = { method: $("method").value };
  if (!Number.isNaN(ratio)) compression.ratio = ratio;
  $("run").disabled = true;
  $("results").dataset.done = "";
  try {
    if (!state.config && !(await loadSettings())) return;
    setStatus("Compressing…");
    const res = await api("/inspect/compress", { question, documents: docs, compression });
    $("results").hidden = false;
    const ms = renderExplanation(res.compression, docs);
    if ($("answer").checked) {
      $("answers").hidden = false;
      $("answer-full").textContent = $("answer-compressed").textContent = "…";
      $("meta-full").textContent = $("meta-compressed").textContent = "";
      setStatus("Answering from the compressed context…");
      await answer(question, docs, compression, "compressed");
      setStatus("Answering from the full context…");
      await answer(question, docs, { enabled: false }, "full");
    } else {
      $("answers").hidden = true;
    }
    setStatus("Done (page rendered in " + fmt(ms, 0) + " ms).");
    $("results").dataset.done = "1";
  } catch (e) {
    setStatus(e.message, true);
  } finally {
    $("run").disabled = false;
  }
}

function loadExample() {
  const ex = state.examples[Number($("example").value)];
  if (!ex) return;
  $("question").value = ex.question;
  $("passages").value = formatPassages(ex.documents);
}

async function loadSettings() {
  try {
    state.config = await api("/inspect/config");
    for (const m of state.config.methods) {
      const o = document.createElement("option");
      o.value = o.textContent = m;
      if (m === state.config.method) o.selected = true;
      $("method").appendChild(o);
    }
    if (state.config.ratio) $("ratio").value = state.config.ratio;
    state.examples = (await api("/inspect/examples")).examples;
    state.examples.forEach((ex, i) => {
      const o = document.createElement("option");
      o.value = String(i);
      o.textContent = ex.name;
      $("example").appendChild(o);
    });
    document.body.dataset.ready = "1";
    setStatus("");
    return true;
  } catch (e) {
    state.config = null;
    setStatus("Could not load the inspector's settings: " + e.message, true);
    return false;
  }
}

function init() {
  $("form").addEventListener("submit", run);
  $("example").addEventListener("change", loadExample);
  $("passages").addEventListener("keydown", (e) => {  // Ctrl/Cmd+Enter submits from the passages box
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("form").requestSubmit();
  });
  $("key").addEventListener("change", () => { if (!state.config) loadSettings(); });
  loadSettings();
}

init();
