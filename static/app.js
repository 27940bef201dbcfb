// Progressive enhancement only: every page works without this file (it refreshes instead).
"use strict";

// Documents still being processed: poll their state, update it, reload the page when done.
function pollDocumentStates() {
  document.querySelectorAll("[data-poll]").forEach((el) => {
    const tick = async () => {
      try {
        const response = await fetch(el.dataset.poll, { headers: { Accept: "application/json" } });
        if (response.ok) {
          const state = await response.json();
          el.textContent = state.pages_total && !state.finished
            ? `${state.state_label} (${state.pages_done}/${state.pages_total} pages)`
            : state.state_label;
          el.className = `state state-${state.state}`;
          if (state.finished) {
            window.location.reload();
            return;
          }
        }
      } catch (err) { /* the server is restarting: try again */ }
      setTimeout(tick, 1500);
    };
    setTimeout(tick, 1000);
  });
}

// A running job: stream its text with server-sent events. EventSource reconnects by itself and
// sends Last-Event-ID, so the server resumes after the last delta this page already shows.
function streamJob() {
  const output = document.getElementById("job-output");
  if (!output || !output.dataset.events) return;
  const stateEl = document.getElementById("job-state");
  const errorEl = document.getElementById("job-error");
  const noteEl = document.getElementById("job-note");
  const metricsEl = document.getElementById("job-metrics");
  const cancelForm = document.getElementById("cancel-form");
  const queueEl = document.getElementById("job-queue");
  const showQueue = (text) => { queueEl.textContent = text; queueEl.hidden = !text; };
  const WAITING = {
    kv_budget: "Waiting for room in the engine's memory",
    prefill_lane: "Waiting while drafting requests use the engine",
    engine_unavailable: "The engine is restarting; the job will continue when it is back",
    engine_restarting: "The engine stopped while working on this job and is starting again; the job will continue where it was",
    worker_lost: "The worker running this job stopped; another one will take it",
  };
  const source = new EventSource(output.dataset.events);
  let started = false;

  const setState = (name, label) => {
    stateEl.textContent = label;
    stateEl.className = `state state-${name}`;
  };
  const finish = () => {
    source.close();
    if (cancelForm) cancelForm.hidden = true;
  };

  source.addEventListener("queue", (e) => {
    const q = JSON.parse(e.data);
    const eta = q.eta_s ? `, done in about ${Math.round(q.eta_s)} s` : "";
    showQueue(q.position ? `Position ${q.position} in the queue${eta}.` : "");
  });
  source.addEventListener("waiting", (e) => {
    const w = JSON.parse(e.data);
    const place = w.position ? ` (${w.position} ahead or waiting)` : "";
    showQueue(`${WAITING[w.reason] || "Waiting"}${place}.`);
  });
  source.addEventListener("progress", (e) => {
    const p = JSON.parse(e.data);
    if (!started) setState("running", "Running");
    if (p.step) showQueue(`${p.step}…`);
    else if (p.prompt_tokens) showQueue(`Reading: ${Math.round((100 * p.prompt_tokens_done) / p.prompt_tokens)} % of ${p.prompt_tokens} tokens.`);
  });
  source.addEventListener("delta", (e) => {
    if (!started) { output.textContent = ""; started = true; setState("running", "Running"); showQueue(""); }
    output.textContent += JSON.parse(e.data).text;
  });
  source.addEventListener("restart", () => { output.textContent = ""; started = false; });
  source.addEventListener("snapshot", (e) => { output.textContent = JSON.parse(e.data).text; });
  source.addEventListener("done", (e) => {
    const data = JSON.parse(e.data);
    if (output.dataset.reloadOnDone) { finish(); window.location.reload(); return; }  // results are laid out by the server
    setState("succeeded", "Done");
    // Sanitised on the server (appliance/rendering.py): Markdown as HTML, nothing that runs.
    if (data.html !== undefined) { output.innerHTML = data.html; output.classList.add("rendered"); }
    if (data.note) { noteEl.textContent = data.note; noteEl.hidden = false; }
    if (data.statements) showSources(data.statements);
    if (data.ttft_ms !== undefined) {
      metricsEl.querySelector('[data-metric="ttft_ms"]').textContent = `${Math.round(data.ttft_ms)} ms`;
      metricsEl.querySelector('[data-metric="decode_tokens_per_s"]').textContent = data.decode_tokens_per_s ?? "";
      metricsEl.querySelector('[data-metric="queue_wait_ms"]').textContent = `${Math.round(data.queue_wait_ms)} ms`;
      metricsEl.querySelector('[data-metric="tokens"]').textContent = `${data.prompt_tokens} / ${data.output_tokens}`;
      metricsEl.hidden = false;
    }
    finish();
  });
  source.addEventListener("failed", (e) => {
    setState("failed", "Failed");
    errorEl.textContent = JSON.parse(e.data).detail;
    errorEl.hidden = false;
    finish();
  });
  source.addEventListener("cancelled", () => { setState("cancelled", "Cancelled"); finish(); });
}

// A finished summary: each statement with the page it comes from (text only, never HTML).
function showSources(statements) {
  const section = document.getElementById("job-sources");
  if (!section) return;
  const list = section.querySelector("ol");
  list.replaceChildren(...statements.map((s) => {
    const item = document.createElement("li");
    item.append(`${s.text} `);
    if (s.page) {
      const link = document.createElement("a");
      link.href = `${section.dataset.documentUrl}#page-${s.page}`;
      link.textContent = `p. ${s.page}`;
      item.append(link);
      if (s.source === "matched") {
        const tag = document.createElement("span");
        tag.className = "tag";
        tag.textContent = "page found by the appliance";
        item.append(" ", tag);
      }
    } else {
      const flag = document.createElement("span");
      flag.className = "flag";
      const wrong = (s.missing_facts || []).join("; ");
      flag.textContent = "no page of the document says this" + (wrong ? ` (the closest passage does not say: ${wrong})` : "");
      item.append(flag);
    }
    return item;
  }));
  section.hidden = false;
}

// Upload by dropping files onto the upload box (choosing them works without this).
function dropToUpload() {
  const zone = document.querySelector("[data-dropzone]");
  if (!zone) return;
  const input = zone.querySelector('input[type="file"]');
  const over = (e) => { e.preventDefault(); zone.classList.add("dragging"); };
  const away = () => zone.classList.remove("dragging");
  zone.addEventListener("dragenter", over);
  zone.addEventListener("dragover", over);
  zone.addEventListener("dragleave", away);
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    away();
    if (!e.dataTransfer || !e.dataTransfer.files.length) return;
    input.files = e.dataTransfer.files;
    zone.requestSubmit();
  });
}

// An edited draft being checked: reload to show the result, unless the person is typing a new edit.
function awaitDraftCheck() {
  if (!document.querySelector("[data-checking]")) return;
  const tick = () => {
    const text = document.getElementById("id_text");
    if (text && text.value !== text.defaultValue) return;  // keep what they are typing
    window.location.reload();
  };
  setTimeout(tick, 3000);
}

document.addEventListener("DOMContentLoaded", () => {
  awaitDraftCheck();
  dropToUpload();
  pollDocumentStates();
  streamJob();
});
