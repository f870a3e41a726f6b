// htmx and failed requests. htmx swaps 4xx answers too (the htmx-config meta in base.html), so a form shows its own
// error where its result would go: the import's error table, "your role may not …". A whole error page (error.html,
// answered for a fragment) is cut down to its message. A 5xx, or no answer at all, leaves the fragment as it was and
// says so in the page's alert line instead.
(function () {
  function alertLine(message) {
    const line = document.getElementById("request-error");
    if (!line) return;
    line.textContent = message;
    line.hidden = !message;
  }

  document.addEventListener("htmx:beforeSwap", (event) => {
    const detail = event.detail;
    const status = detail.xhr.status;
    if (status < 400) return;
    alertLine("");
    const type = detail.xhr.getResponseHeader("Content-Type") || "";
    const body = typeof detail.serverResponse === "string" ? detail.serverResponse : "";
    if (/<html[\s>]/i.test(body)) {
      const page = new DOMParser().parseFromString(body, "text/html");
      const card = page.querySelector("main .card.error") || page.querySelector("main") || page.body;
      detail.serverResponse = card ? card.outerHTML : "";
    } else if (!type.startsWith("text/html")) {
      const p = document.createElement("p");
      p.className = "error-text";
      p.textContent = body.trim() || `The request failed (HTTP ${status}).`;
      detail.serverResponse = p.outerHTML;
    }
  });

  document.addEventListener("htmx:afterRequest", (event) => {
    const xhr = event.detail.xhr;
    if (xhr && xhr.status >= 200 && xhr.status < 400) alertLine("");
  });
  document.addEventListener("htmx:responseError", (event) => {
    const status = event.detail.xhr.status;
    if (status >= 500) alertLine(`The server failed to answer that request (HTTP ${status}); try again in a moment.`);
  });
  document.addEventListener("htmx:sendError", () => {
    alertLine("The server could not be reached; check your connection and try again.");
  });
})();
