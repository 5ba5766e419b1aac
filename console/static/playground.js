// gpuflow console: the playground. Sends the conversation to /console/playground/chat (the gateway's own
// /v1/chat/completions, with the signed-in key), reads the answer as a stream (SSE "data:" lines), appends
// its text as it arrives (textContent only, never markup) and shows, per answer, what the browser measured:
// TTFT (sent -> first content) and tokens/s (tokens after the first / time from first to last content:
// the decode rate, 1/TPOT). Stop aborts the request (AbortController); what arrived stays in the chat.
// An answer that streamed no text is shown as a failure, with the engine's finish_reason.
"use strict";

(() => {
  const form = document.getElementById("chat");
  if (!form) return;
  const $ = id => document.getElementById(id);
  const conversation = $("conversation"), message = $("message"), send = $("send"), stop = $("stop");
  let turns = [], controller = null;

  function turn(role, text) {
    const li = document.createElement("li");
    li.className = "turn " + role;
    const who = document.createElement("span");
    who.className = "role";
    who.textContent = role;
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    li.append(who, body);
    conversation.append(li);
    return li;
  }

  function figures(li, f) {
    const p = document.createElement("div");
    p.className = "figures";
    const part = (cls, text) => { const s = document.createElement("span"); s.className = cls; s.textContent = text; return s; };
    p.append(part("ttft", "TTFT " + (f.ttft == null ? "-" : Math.round(f.ttft) + " ms")), " · ",
             part("tokens", f.tokens + " tokens"), " · ",
             part("tps", (f.tps == null ? "-" : f.tps.toFixed(1)) + " tokens/s"));
    if (f.note) p.append(" · ", part("note", f.note));
    li.append(p);
  }

  function errorOf(answer, status) {
    const e = answer && answer.error;
    if (typeof e === "string") return e;
    if (e && typeof e.message === "string") return e.message;
    return "failed: HTTP " + status;
  }

  // each complete "data: ..." line's payload, the rest kept for the next read
  function lines(buffer, onData) {
    let i;
    while ((i = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, i).replace(/\r$/, "");
      buffer = buffer.slice(i + 1);
      if (line.startsWith("data:")) onData(line.slice(5).trim());
    }
    return buffer;
  }

  async function ask(text) {
    turns.push({role: "user", content: text});
    turn("user", text);
    const li = turn("assistant", "");
    const out = li.querySelector(".text");
    const body = {model: $("model").value, messages: turns, stream: true, stream_options: {include_usage: true}};
    const max = parseInt($("max-tokens").value, 10);
    if (max > 0) body.max_tokens = max;
    controller = new AbortController();
    send.disabled = true;
    stop.disabled = false;
    const t0 = performance.now();
    let first = null, last = null, chunks = 0, usage = null, note = "", finish = null;
    try {
      const r = await fetch("/console/playground/chat", {
        method: "POST", credentials: "same-origin", signal: controller.signal,
        headers: {"content-type": "application/json", "accept": "text/event-stream", "x-gpuflow-console": "1"},
        body: JSON.stringify(body)});
      if (!r.ok) {
        const answer = await r.json().catch(() => null);
        li.classList.add("failed");
        out.textContent = errorOf(answer, r.status);
        turns.pop();
        return;
      }
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      const onData = data => {
        if (data === "[DONE]") return;
        let event;
        try { event = JSON.parse(data); } catch (e) { return; }
        if (event.error) { note = errorOf(event, r.status); return; }
        if (event.usage) usage = event.usage;
        const choice = event.choices && event.choices[0];
        if (choice && choice.finish_reason) finish = choice.finish_reason;
        const delta = choice && choice.delta;
        if (delta && typeof delta.content === "string" && delta.content) {
          const now = performance.now();
          if (first === null) first = now;
          last = now;
          chunks += 1;
          out.textContent += delta.content;
        }
      };
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer = lines(buffer + value, onData);
      }
      lines(buffer + "\n", onData);
    } catch (e) {
      note = e.name === "AbortError" ? "stopped" : "failed: " + e.message;
    } finally {
      controller = null;
      send.disabled = false;
      stop.disabled = true;
    }
    if (li.classList.contains("failed")) return;
    if (chunks === 0 && note === "") {  // an answer with no text is no answer: said so, never a blank turn
      li.classList.add("failed");
      out.textContent = "The model answered with no text (finish_reason: " + (finish || "none") + ")" +
        (finish === "length" ? ": max tokens reached before any text" : "") + ". Try again, or another model.";
      turns.pop();
      return;
    }
    const tokens = usage && Number.isInteger(usage.completion_tokens) && note === "" ? usage.completion_tokens : chunks;
    const tps = first !== null && last > first && tokens > 1 ? (tokens - 1) / ((last - first) / 1000) : null;
    figures(li, {ttft: first === null ? null : first - t0, tokens, tps, note});
    turns.push({role: "assistant", content: out.textContent});
  }

  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const text = message.value.trim();
    if (!text || controller) return;
    message.value = "";
    ask(text);
  });
  message.addEventListener("keydown", ev => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); form.requestSubmit(); }
  });
  stop.addEventListener("click", () => { if (controller) controller.abort(); });
  $("reset").addEventListener("click", () => {
    if (controller) controller.abort();
    turns = [];
    conversation.replaceChildren();
  });
  $("model").addEventListener("change", () => {
    const u = new URL(location.href);
    u.searchParams.set("model", $("model").value);
    window.history.replaceState(null, "", u);
  });
})();
