// The API-keys page: a key just created is shown once, from the create action's answer (console.js
// fires gpuflow:done with it); it is kept nowhere else, so a reload forgets it. The list is read
// again so that it holds the new key; after the first key (the open console's form says so with
// data-first) nothing is open any more: the page says so and offers to sign in with the new key,
// instead of showing it beside "no API key exists".
"use strict";

document.addEventListener("gpuflow:done", ev => {
  if (ev.target.id !== "create-key" || !ev.detail || !ev.detail.key) return;
  const box = document.getElementById("new-key");
  box.querySelector(".secret").textContent = ev.detail.key;
  box.querySelector(".new-key-id").textContent = ev.detail.id;
  box.hidden = false;
  const first = ev.target.dataset.first === "1";
  ev.target.reset();
  if (first) return closed(ev.target);
  const list = document.getElementById("key-list");
  if (list) refresh(list);  // console.js: the page's own copy of it, read again
});

function closed(form) {
  const say = (el, text) => { if (el) el.textContent = text; };
  say(document.querySelector("header .who"), "the gateway now needs an API key");
  const warning = document.getElementById("first-key");
  if (warning) warning.remove();
  form.remove();
  const list = document.getElementById("key-list");
  if (!list) return;
  const p = document.createElement("p");
  p.append("The gateway is closed: every request and every console page needs a key now. Copy the key above, then ");
  const a = document.createElement("a");
  a.href = "/console/login?next=/console/keys";
  a.textContent = "sign in with it";
  p.append(a, " to see the keys.");
  list.replaceChildren(p);
}
