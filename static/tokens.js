// Progressive enhancement: the page works without it (select the token and copy it by hand).
(() => {
  "use strict";
  const input = document.getElementById("raw-token");
  const copy = document.getElementById("copy-token");
  // The new token came in the answer to a POST: make reloading this page a GET, so that it does
  // not create a second token (without this script the browser asks before sending the form again).
  if (input && window.history.replaceState) window.history.replaceState(null, "", window.location.href);
  if (input && copy) {
    const status = document.getElementById("copy-status");
    input.addEventListener("focus", () => input.select());
    copy.hidden = false;
    copy.addEventListener("click", async () => {
      let copied = false;
      if (navigator.clipboard && window.isSecureContext) {
        try { await navigator.clipboard.writeText(input.value); copied = true; } catch (err) { /* fall back */ }
      }
      if (!copied) {
        input.select();
        try { copied = document.execCommand("copy"); } catch (err) { copied = false; }
      }
      status.textContent = copied ? "Copied." : "Select the token and copy it with Ctrl+C.";
    });
  }
  const expires = document.getElementById("id_expires");
  const onDate = document.getElementById("expires-on-field");
  const dateInput = document.getElementById("id_expires_on");
  const sync = () => { onDate.hidden = expires.value !== "date" && !dateInput.value; };
  expires.addEventListener("change", sync);
  sync();
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });
})();
