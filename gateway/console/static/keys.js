// The API-keys page: a key just created is shown once, from the create action's answer (console.js
// fires gpuflow:done with it); it is kept nowhere else, so a reload forgets it.
"use strict";

document.addEventListener("gpuflow:done", ev => {
  if (ev.target.id !== "create-key" || !ev.detail || !ev.detail.key) return;
  const box = document.getElementById("new-key");
  box.querySelector(".secret").textContent = ev.detail.key;
  box.querySelector(".new-key-id").textContent = ev.detail.id;
  box.hidden = false;
  ev.target.reset();
});
