/*
 * pikku_django: follow a workflow run live on its admin page.
 *
 * Plain JavaScript, no build step. Reads the run's status stream
 * (GET <pikku urls>/runs/<id>/stream, server-sent events) named by the
 * panel's data-stream-url and keeps the panel up to date:
 *
 *   init, update  the run's status and its steps ({name, status, attempt})
 *   suspended     the reason the run waits for
 *   done          the final status, output and error; the stream is closed
 *
 * The run's status is the badge in the page's heading (#pikku-run-status); the
 * suspend reason, output and error rows below it are filled in when the run
 * reaches them after the page was drawn (what the server drew is kept).
 *
 * The parts of the page that follow the run's state (its Cancel, Resume and
 * Retry buttons, its Delete link, its tree of parent and child runs, its
 * timeline of steps) are drawn
 * by the server alone: after each frame the page fetches them again from the
 * panel's data-parts-url (the admin's <run>/live/, for this user) and swaps each
 * in by its id (a part that did not change is left alone; the timeline keeps
 * where it was scrolled to); data-parts counts the answers. While another run of the tree is unfinished (the tree's
 * data-live), whose changes the stream does not report, they are fetched every
 * data-family-refresh seconds (default 10) as well.
 *
 * Everything from the stream is written as text (textContent), never as markup;
 * the parts are the server's own templates, escaped there.
 *
 * When the stream drops, a quiet note says so and EventSource reconnects by
 * itself; the next frame clears the note. The panel's data-state says where
 * the stream is: off, connecting, live, paused, stopped or done.
 */
(function () {
  "use strict";

  var EMPTY = "-";

  function $(id) {
    return document.getElementById(id);
  }

  function show(element, visible) {
    if (element) {
      element.hidden = !visible;
    }
  }

  function text(element, value) {
    if (element) {
      element.textContent = value === undefined || value === null ? EMPTY : String(value);
    }
  }

  function statusClass(status) {
    return "pikku-badge pikku-badge-" + String(status).replace(/[^A-Za-z0-9_-]/g, "");
  }

  function pretty(value) {
    if (value === undefined || value === null) {
      return EMPTY;
    }
    try {
      return JSON.stringify(value, null, 2);
    } catch (e) {
      return String(value);
    }
  }

  function follow(panel) {
    var url = panel.getAttribute("data-stream-url");
    if (!url || typeof window.EventSource !== "function") {
      return;
    }
    var note = $("pikku-live-note");
    var statusEl = $("pikku-run-status");
    var reasonRow = $("pikku-run-reason-row");
    var reasonEl = $("pikku-run-reason");
    var outputRow = $("pikku-run-output-row");
    var outputEl = $("pikku-run-output");
    var errorRow = $("pikku-run-error-row");
    var errorEl = $("pikku-run-error");
    var tbody = panel.querySelector("#pikku-live-steps tbody");
    var finished = false;
    var partsUrl = panel.getAttribute("data-parts-url");
    var familySeconds = Math.max(1, parseInt(panel.getAttribute("data-family-refresh"), 10) || 10);
    var fetching = false;
    var again = false;
    var familyTimer = null;
    var swaps = 0;

    function swapItems(doc) {
      var items = doc.getElementById("pikku-operations");
      var tools = document.querySelector(".object-tools");
      if (!items || !tools) {
        return;
      }
      var old = tools.querySelectorAll("li.pikku-operation");
      var fresh = items.querySelectorAll("li.pikku-operation");
      if (markup(old) === markup(fresh)) {
        return; // unchanged: the buttons stay as they are (focus, a click on its way)
      }
      for (var i = 0; i < old.length; i++) {
        old[i].parentNode.removeChild(old[i]);
      }
      var first = tools.firstChild;
      for (var j = 0; j < fresh.length; j++) {
        tools.insertBefore(document.importNode(fresh[j], true), first);
      }
    }

    function markup(elements) {
      return Array.prototype.map
        .call(elements, function (element) {
          return element.outerHTML;
        })
        .join("");
    }

    function swapParts(html) {
      var doc = new window.DOMParser().parseFromString(html, "text/html");
      swapItems(doc);
      ["pikku-family", "pikku-run-timeline", "pikku-run-submit"].forEach(function (id) {
        var part = doc.getElementById(id);
        var here = $(id);
        if (part && here && part.outerHTML !== here.outerHTML) {
          var fresh = document.importNode(part, true);
          var scrolled = here.querySelector(".pikku-tl-scroll");
          var top = scrolled ? scrolled.scrollTop : 0;
          var left = scrolled ? scrolled.scrollLeft : 0;
          here.parentNode.replaceChild(fresh, here);
          var scroll = fresh.querySelector(".pikku-tl-scroll");
          if (scroll) {
            scroll.scrollTop = top;
            scroll.scrollLeft = left;
          }
        }
      });
      swaps += 1;
      panel.setAttribute("data-parts", String(swaps));
    }

    function followFamily() {
      if (familyTimer !== null) {
        window.clearTimeout(familyTimer);
        familyTimer = null;
      }
      var tree = $("pikku-family");
      if (tree && tree.getAttribute("data-live") === "true") {
        familyTimer = window.setTimeout(function () {
          familyTimer = null;
          refreshParts();
        }, familySeconds * 1000);
      }
    }

    function refreshParts() {
      if (!partsUrl || typeof window.fetch !== "function" || typeof window.DOMParser !== "function") {
        return;
      }
      if (fetching) {
        again = true; // fetched once more when this one is in: the newest state wins
        return;
      }
      fetching = true;
      again = false;
      window
        .fetch(partsUrl + window.location.search, {
          credentials: "same-origin",
          cache: "no-store",
          headers: { Accept: "text/html" },
        })
        .then(function (response) {
          if (!response.ok) {
            throw new Error("HTTP " + response.status);
          }
          return response.text();
        })
        .then(swapParts)
        .catch(function () {
          // The parts drawn last stay; the next frame tries again.
        })
        .then(function () {
          fetching = false;
          if (again) {
            refreshParts();
          } else {
            followFamily();
          }
        });
    }

    function setState(state, message) {
      panel.setAttribute("data-state", state);
      if (message) {
        text(note, message);
      }
      show(note, Boolean(message));
    }

    function setStatus(status) {
      if (!statusEl || status === undefined || status === null) {
        return;
      }
      text(statusEl, status);
      statusEl.className = statusClass(status);
    }

    function setReason(reason) {
      text(reasonEl, reason);
      show(reasonRow, true);
    }

    function cell(row, index, value) {
      text(row.cells[index], value);
    }

    function badgeCell(row, index, status) {
      var td = row.cells[index];
      var badge = td.firstChild;
      if (!badge || badge.nodeName !== "SPAN") {
        td.textContent = "";
        badge = document.createElement("span");
        td.appendChild(badge);
      }
      text(badge, status);
      badge.className = statusClass(status);
    }

    function newRow(name) {
      var row = document.createElement("tr");
      row.className = "pikku-live-step";
      row.setAttribute("data-step", name);
      for (var i = 0; i < 4; i++) {
        row.appendChild(document.createElement("td"));
      }
      return row;
    }

    function renderSteps(steps) {
      if (!tbody || !Array.isArray(steps)) {
        return;
      }
      for (var i = 0; i < steps.length; i++) {
        var step = steps[i] || {};
        var name = String(step.name);
        var row = tbody.rows[i];
        if (!row || row.getAttribute("data-step") !== name) {
          var fresh = newRow(name);
          if (row) {
            tbody.replaceChild(fresh, row);
          } else {
            tbody.appendChild(fresh);
          }
          row = fresh;
        }
        cell(row, 0, i + 1);
        cell(row, 1, name);
        badgeCell(row, 2, step.status);
        cell(row, 3, step.attempt);
      }
      while (tbody.rows.length > steps.length) {
        tbody.deleteRow(-1);
      }
    }

    function render(run) {
      setStatus(run.status);
      if (run.status === "suspended") {
        if (Object.prototype.hasOwnProperty.call(run, "reason")) {
          setReason(run.reason);
        }
      } else {
        show(reasonRow, false);
      }
      renderSteps(run.steps);
    }

    function finish(run) {
      render(run);
      if (outputRow && !outputRow.hidden) {
        return; // the server drew the finished run: its output and error stay
      }
      if (errorRow && !errorRow.hidden) {
        return;
      }
      text(outputEl, pretty(run.output));
      show(outputRow, run.output !== undefined && run.output !== null);
      var error = run.error;
      if (error) {
        var parts = [error.type, error.message].filter(function (part) {
          return part !== undefined && part !== null && part !== "";
        });
        text(errorEl, parts.length ? parts.join(": ") : pretty(error));
      }
      show(errorRow, Boolean(error));
    }

    function on(event, handle) {
      source.addEventListener(event, function (message) {
        var data;
        try {
          data = JSON.parse(message.data);
        } catch (e) {
          return; // not a frame we understand
        }
        if (data && typeof data === "object") {
          setState(finished ? "done" : "live");
          handle(data);
          refreshParts();
        }
      });
    }

    panel.hidden = false;
    show(document.querySelector(".pikku-live-only"), true);
    setState("connecting");
    followFamily();
    var source = new EventSource(url);

    source.addEventListener("open", function () {
      if (!finished) {
        setState("live");
      }
    });
    on("init", render);
    on("update", render);
    on("suspended", function (data) {
      setStatus("suspended");
      setReason(data.reason);
    });
    on("done", function (data) {
      finished = true;
      source.close();
      setState("done");
      finish(data);
    });
    source.addEventListener("error", function () {
      if (finished) {
        return;
      }
      if (source.readyState === EventSource.CLOSED) {
        // Refused (not a 200 event stream): EventSource gives up for good.
        setState("stopped", panel.getAttribute("data-text-stopped"));
      } else {
        setState("paused", panel.getAttribute("data-text-paused"));
      }
    });
  }

  function ready() {
    var panel = $("pikku-live");
    if (panel) {
      follow(panel);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", ready);
  } else {
    ready();
  }
})();
