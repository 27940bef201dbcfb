// The token page came in the answer to a POST: a reload lists the tokens, it does not add one again.
(() => {
  "use strict";
  const url = document.currentScript && document.currentScript.dataset.listUrl;
  if (url && window.history.replaceState) window.history.replaceState(null, "", url);
})();
