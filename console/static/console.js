// gpuflow console: the live parts, in plain JavaScript (no framework, nothing fetched from the network).
// - an element with id and data-refresh="MS" is re-read from the same page every MS milliseconds
//   (while the tab is visible) and replaced by its new copy; elements with the same MS are read
//   from one fetch, so what they show agrees (a summary's counts and the table they count);
// - a form with data-action="URL" is sent as a JSON POST with the console's action header, its
//   answer shown in #notice, which moves to just after that form: the result is shown where the
//   action was taken, not at the foot of the page; data-confirm asks first; data-then="reload"
//   reloads the page after.
"use strict";

function notice(text, ok, form) {
  const n = document.getElementById("notice");
  if (!n) return;
  if (form && n.previousElementSibling !== form) form.after(n);
  n.textContent = text;
  n.className = ok ? "ok" : "bad";
}

async function refresh(els) {
  if (document.hidden) return;
  try {
    const r = await fetch(location.href, {headers: {"accept": "text/html"}, credentials: "same-origin"});
    if (!r.ok) return;
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    for (const el of els) {
      const fresh = doc.getElementById(el.id);
      if (fresh) el.replaceChildren(...fresh.childNodes);
    }
  } catch (e) { /* the next tick tries again */ }
}

async function act(form) {
  if (form.dataset.confirm && !confirm(form.dataset.confirm)) return;
  const body = Object.fromEntries(new FormData(form).entries());
  const buttons = form.querySelectorAll("button");
  buttons.forEach(b => b.disabled = true);
  try {
    const r = await fetch(form.dataset.action, {
      method: "POST", credentials: "same-origin",
      headers: {"content-type": "application/json", "x-gpuflow-console": "1"},
      body: JSON.stringify(body)});
    const answer = await r.json().catch(() => ({error: r.statusText}));
    if (!r.ok) { notice(answer.error || ("failed: " + r.status), false, form); return; }
    notice(answer.message || "done", true, form);
    form.dispatchEvent(new CustomEvent("gpuflow:done", {detail: answer, bubbles: true}));
    if (form.dataset.then === "reload") setTimeout(() => location.reload(), 600);
  } catch (e) {
    notice("failed: " + e, false, form);
  } finally {
    buttons.forEach(b => b.disabled = false);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const byPace = new Map();
  document.querySelectorAll("[data-refresh][id]").forEach(el => {
    const ms = Math.max(1000, parseInt(el.dataset.refresh, 10) || 3000);
    byPace.set(ms, [...(byPace.get(ms) || []), el]);
  });
  byPace.forEach((els, ms) => setInterval(() => refresh(els), ms));
  document.querySelectorAll("form[data-action]").forEach(form => {
    form.addEventListener("submit", ev => { ev.preventDefault(); act(form); });
  });
});
