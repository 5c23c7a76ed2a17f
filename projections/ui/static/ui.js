// steplog ui: a few lines of plain JavaScript. Live pages (data-live) re-render in place when
// the log grows (server-sent events carry the instance's version); the position slider and the
// time field navigate to a point; the graph is fetched from its own address once the page is
// shown (drawing it reads the whole log). Nothing is loaded from other sites.
(function () {
  "use strict";
  function go(url) { window.location.href = url; }
  function drawGraphs(root) {
    root.querySelectorAll(".graph-box[data-graph]").forEach(function (box) {
      var url = box.dataset.graph;
      fetch(url, { credentials: "same-origin" })
        .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
        .then(function (svg) { box.innerHTML = svg; })
        .catch(function () { box.innerHTML = '<p class="muted">the graph could not be drawn</p>'; });
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
  source.onmessage = function (e) {
    if (e.data === body.dataset.version || busy) { return; }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) { return r.text(); })
      .then(function (html) {
        var page = new DOMParser().parseFromString(html, "text/html");
        var fresh = page.querySelector("main");
        if (fresh) { document.querySelector("main").replaceWith(fresh); drawGraphs(fresh); }
        body.dataset.version = e.data;
        if (status) { status.textContent = "live · updated"; }
      })
      .finally(function () { busy = false; });
  };
  source.onerror = function () { if (status) { status.textContent = "live · reconnecting"; } };
}());
