/*
 * pikku_django: the admin dashboard refreshes itself.
 *
 * Every data-refresh seconds the page fetches its panel again (data-panel-url,
 * rendered by the server) and swaps it in. When a fetch fails the old figures
 * stay and a note says so. data-state: off, live or stale; data-updates counts
 * the panels swapped in.
 */
(function () {
  "use strict";

  function ready() {
    var root = document.getElementById("pikku-dashboard-live");
    if (!root || typeof window.fetch !== "function") {
      return;
    }
    var url = root.getAttribute("data-panel-url");
    var seconds = Math.max(1, parseInt(root.getAttribute("data-refresh"), 10) || 10);
    var panel = document.getElementById("pikku-dashboard-panel");
    var note = document.getElementById("pikku-dashboard-note");
    var initial = note ? note.textContent : "";
    var updates = 0;
    root.setAttribute("data-state", "live");

    function refresh() {
      window
        .fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (response) {
          if (!response.ok) {
            throw new Error("HTTP " + response.status);
          }
          return response.text();
        })
        .then(function (html) {
          panel.innerHTML = html; // the server's own template, escaped there
          updates += 1;
          root.setAttribute("data-updates", String(updates));
          root.setAttribute("data-state", "live");
          if (note) {
            note.textContent = initial;
          }
        })
        .catch(function () {
          root.setAttribute("data-state", "stale");
          var time = document.getElementById("pikku-dashboard-time");
          if (note) {
            note.textContent =
              root.getAttribute("data-text-stale") + " " + (time ? time.textContent : "");
          }
        })
        .then(function () {
          window.setTimeout(refresh, seconds * 1000);
        });
    }

    window.setTimeout(refresh, seconds * 1000);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", ready);
  } else {
    ready();
  }
})();
