// pollwarden console: the one script the pages load (CSP script-src 'self'). Without it every page still works;
// with it, pages refresh in place (never while a form is being edited), times show in local time, and the
// login token leaves the address bar.
(function () {
  "use strict";
  var body = document.body;

  // The one-time login token must not stay in the address bar or the history.
  if (location.search.indexOf("token=") !== -1) {
    history.replaceState(null, "", location.pathname);
  }

  function localTimes(root) {
    var times = root.querySelectorAll("time.clock[datetime]");
    var today = new Date().toDateString();
    for (var i = 0; i < times.length; i++) {
      var at = new Date(times[i].getAttribute("datetime"));
      if (isNaN(at.getTime())) continue;
      var clock = at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
      times[i].textContent = at.toDateString() === today ? clock : at.toLocaleDateString() + " " + clock;
    }
  }
  localTimes(document);

  var every = parseInt(body.getAttribute("data-refresh") || "0", 10);
  var live = document.getElementById("live");
  var main = document.getElementById("main");
  if (!every || !live || !main) return;

  var status = document.getElementById("live-status");
  var pause = document.getElementById("live-pause");
  var paused = false;
  var dirty = false; // a form changed and not submitted
  var updated = Date.now();
  var updates = 0;
  var held = 0;
  live.hidden = false;

  main.addEventListener("input", function () { dirty = true; });
  main.addEventListener("change", function () { dirty = true; });
  main.addEventListener("submit", function () { dirty = false; });

  function editing() {
    var active = document.activeElement;
    if (dirty) return true;
    return !!active && active !== main && main.contains(active) &&
      /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(active.tagName);
  }

  function say() {
    var seconds = Math.round((Date.now() - updated) / 1000);
    var ago = seconds < 2 ? "just now" : seconds < 120 ? seconds + " s ago" : Math.round(seconds / 60) + " min ago";
    var note = paused ? " · updates paused" : editing() ? " · held while you edit" : "";
    status.textContent = "updated " + ago + note;
  }

  pause.addEventListener("click", function () {
    paused = !paused;
    pause.setAttribute("aria-pressed", paused ? "true" : "false");
    pause.textContent = paused ? "Resume updates" : "Pause updates";
    say();
  });

  function refresh() {
    if (paused) return;
    if (editing()) {
      held += 1;
      body.setAttribute("data-held", String(held));
      say();
      return;
    }
    fetch(location.href, { headers: { "X-Pollwarden-Refresh": "1" }, credentials: "same-origin" })
      .then(function (response) {
        if (response.status === 401) { location.reload(); return null; }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html === null || paused || editing()) return;
        var fresh = new DOMParser().parseFromString(html, "text/html");
        var next = fresh.getElementById("main");
        if (!next) return;
        var flashes = main.querySelectorAll(".flash");
        main.replaceChildren.apply(main, Array.prototype.slice.call(next.childNodes));
        for (var i = flashes.length - 1; i >= 0; i--) main.insertBefore(flashes[i], main.firstChild);
        document.title = fresh.title;
        localTimes(main);
        updated = Date.now();
        updates += 1;
        body.setAttribute("data-updates", String(updates));
        say();
      })
      .catch(function () { status.textContent = "could not update: is the console still running?"; });
  }

  setInterval(refresh, every * 1000);
  setInterval(say, 1000);
  say();
})();
