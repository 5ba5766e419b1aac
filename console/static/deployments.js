// gpuflow console, a deployment's page: a form with data-go="URL" goes there once its action is
// done (a deleted deployment's page has nothing left to show). console.js sends the action.
"use strict";

document.addEventListener("gpuflow:done", ev => {
  const form = ev.target;
  if (form instanceof HTMLFormElement && form.dataset.go) setTimeout(() => location.assign(form.dataset.go), 600);
});
