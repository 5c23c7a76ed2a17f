// steplog ui: a few lines of plain JavaScript. Live pages (data-live) re-render in place when
// the log grows (server-sent events carry the instance's version); the position slider and the
// time field navigate to a point; the graph is fetched from its own address once the page is
// shown (drawing it reads the whole log). Nothing is loaded from other sites, and nothing runs
// inline: the server's Content-Security-Policy allows only this file. A log found altered (the
// server answers 409 with the error, or the live stream sends a "broken" event) is shown in
// place of the page.
(function () {
  "use strict";
  function go(url) { window.location.href = url; }
  function said(text) {
    var p = document.createElement("p");
    p.className = "muted";
    p.textContent = text;
    return p;
  }
  function drawGraphs(root) {
    root.querySelectorAll(".graph-box[data-graph]").forEach(function (box) {
      var url = box.dataset.graph;
      fetch(url, { credentials: "same-origin" })
        .then(function (r) {
          return r.text().then(function (text) {
            if (r.ok) { box.innerHTML = text; return; }
            var page = new DOMParser().parseFromString(text, "text/html");
            var detail = page.querySelector(".error-detail");
            box.replaceChildren(detail || said("the graph could not be drawn"));
          });
        })
        .catch(function () { box.replaceChildren(said("the graph could not be drawn")); });
    });
  }
  drawGraphs(document);
  document.addEventListener("input", function (e) {
    if (e.target.id === "slider") {
      var out = document.getElementById("slider-value");
      if (out) { out.textContent = e.target.value; }
    }
  });
  document.addEventListener("change", function (e) {
    var t = e.target;
    if (t.id === "slider") { go(t.dataset.base + t.value); }
    if (t.id === "when" && t.value) {
      var iso = t.value.length === 16 ? t.value + ":00" : t.value;
      go(t.dataset.base + encodeURIComponent(iso + "+00:00"));
    }
  });
  var body = document.body;
  if (!body.dataset.live || !window.EventSource) { return; }
  var status = document.getElementById("live-status");
  var source = new EventSource(body.dataset.live);
  var busy = false;
  function refresh(version, said) {
    busy = true;
    return fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) { return r.text(); })
      .then(function (html) {
        var page = new DOMParser().parseFromString(html, "text/html");
        var fresh = page.querySelector("main");
        if (fresh) { document.querySelector("main").replaceWith(fresh); drawGraphs(fresh); }
        if (version !== null) { body.dataset.version = version; }
        if (status) { status.textContent = said; }
      })
      .finally(function () { busy = false; });
  }
  source.onmessage = function (e) {
    if (e.data === body.dataset.version || busy) { return; }
    refresh(e.data, "live · updated");
  };
  source.addEventListener("broken", function (e) {
    source.close();  // the page is refused from now on: its error replaces it
    if (status) { status.textContent = "live · the log was altered"; status.title = e.data; }
    refresh(null, "live · the log was altered");
  });
  source.addEventListener("unreadable", function (e) {
    source.close();  // a row it cannot read (a sealed one without its key): its error replaces it
    if (status) { status.textContent = "live · a row cannot be read"; status.title = e.data; }
    refresh(null, "live · a row cannot be read");
  });
  source.onerror = function () { if (status) { status.textContent = "live · reconnecting"; } };
}());
