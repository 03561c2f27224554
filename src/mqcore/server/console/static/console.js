// The mqcore console's script (docs/console.md): loads the message browser's rows in chunks,
// with progress, cancel and paging links, and copies IDs. Plain JavaScript, no dependencies.
// Message data never goes through innerHTML here except as the server's escaped row fragment;
// everything else is set with textContent or as attributes.
"use strict";

(function () {
  const PAGE_TIMEOUT_MS = 30000; // a page's scan stops here (reason "timeout", next goes on)

  function byId(id) { return document.getElementById(id); }

  function setText(id, text) {
    const el = byId(id);
    if (el) el.textContent = String(text);
  }

  function enableLink(a, href) {
    a.setAttribute("href", href);
    a.removeAttribute("aria-disabled");
  }

  function disableLink(a) {
    a.removeAttribute("href");
    a.setAttribute("aria-disabled", "true");
  }

  function showError(message) {
    let box = byId("error");
    if (!box) {
      box = document.createElement("div");
      box.id = "error";
      box.className = "error";
      box.setAttribute("role", "alert");
      const main = document.querySelector("main");
      main.insertBefore(box, main.firstChild);
    }
    box.textContent = message;
  }

  // -- the message browser ------------------------------------------------------------------

  async function browse(table) {
    const rowsUrl = table.dataset.rowsUrl;
    if (!rowsUrl) return;
    const body = table.tBodies[0];
    const limit = parseInt(table.dataset.limit, 10);
    const maxScan = parseInt(table.dataset.maxScan, 10);
    const progress = byId("progress");
    const cancel = byId("cancel");
    const next = byId("next");
    const controller = new AbortController();
    let cancelled = false;
    cancel.disabled = false;
    cancel.addEventListener("click", function () {
      cancelled = true;
      controller.abort();
    });
    progress.hidden = false;
    table.dataset.state = "running";

    const url = new URL(rowsUrl, window.location.href);
    let cursor = url.searchParams.get("cursor");
    let count = 0, scannedRecords = 0, scannedBytes = 0, reason = null;
    const started = Date.now();
    try {
      for (;;) {
        if (cursor) url.searchParams.set("cursor", cursor); else url.searchParams.delete("cursor");
        url.searchParams.set("page_left", String(limit - count));
        url.searchParams.set("scan_left", String(Math.max(1, maxScan - scannedRecords)));
        const response = await fetch(url, { signal: controller.signal, headers: { Accept: "application/json" } });
        const answer = await response.json();
        if (!response.ok) {
          showError(answer.message || ("HTTP " + response.status));
          reason = "error";
          break;
        }
        // the server rendered and escaped these rows (templates/rows.html)
        body.insertAdjacentHTML("beforeend", answer.html);
        count += answer.count;
        scannedRecords += answer.scanned_records;
        scannedBytes += answer.scanned_bytes;
        reason = answer.reason;
        cursor = answer.cursor;
        setText("count", count);
        setText("scanned-records", scannedRecords);
        setText("scanned-bytes", scannedBytes);
        setText("reason", reason);
        if (reason !== "timeout" || answer.indexed) break;
        if (count >= limit) { reason = "limit"; break; }
        if (scannedRecords >= maxScan) { reason = "max_scan"; break; }
        if (Date.now() - started > PAGE_TIMEOUT_MS) break; // reason stays "timeout"
      }
    } catch (e) {
      if (!cancelled) { showError("the query failed: " + e); reason = "error"; }
    }
    if (cancelled) reason = "cancelled";
    setText("reason", reason);
    progress.hidden = true;
    cancel.disabled = true;
    if (cursor && reason !== "exhausted" && reason !== "error") {
      // the next page starts at this cursor; this page's own cursor goes on the back stack
      // the form as the server checked it (from=end carries the time it was resolved to)
      const page = new URL(table.dataset.pageUrl, window.location.href);
      new URL(rowsUrl, window.location.href).searchParams.forEach(function (value, name) {
        if (name !== "cursor") page.searchParams.set(name, value);
      });
      page.searchParams.set("cursor", cursor);
      const hist = table.dataset.hist ? table.dataset.hist.split(",") : [];
      hist.push(table.dataset.cursor || "-");
      page.searchParams.set("hist", hist.join(","));
      enableLink(next, page.pathname + page.search);
    } else {
      disableLink(next);
    }
    table.dataset.state = cancelled ? "cancelled" : "done";
  }

  // -- copy buttons -------------------------------------------------------------------------

  function copyButtons() {
    document.querySelectorAll("button.copy").forEach(function (button) {
      button.addEventListener("click", function () {
        const text = button.dataset.copy;
        const done = function () { button.textContent = "copied"; };
        if (navigator.clipboard && window.isSecureContext) {
          navigator.clipboard.writeText(text).then(done, function () { fallbackCopy(text); done(); });
        } else {
          fallbackCopy(text);
          done();
        }
      });
    });
  }

  function fallbackCopy(text) {
    const area = document.createElement("textarea");
    area.value = text;
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); } catch (e) { /* nothing to copy with */ }
    area.remove();
  }

  document.addEventListener("DOMContentLoaded", function () {
    const table = byId("results");
    if (table && table.dataset.rowsUrl) browse(table);
    copyButtons();
  });
})();
