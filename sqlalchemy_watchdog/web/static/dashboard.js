/* sqlalchemy-watchdog dashboard: the only script it runs, and optional:
   every page works without it.
   - An action form sends one request: its buttons are disabled once it is
     submitted (a double click does one thing; the actions are idempotent
     on the server as well).
   - The overview ([data-refresh-url]) fetches its fragment every few
     seconds and swaps it in, without reloading the page; it waits while
     the keyboard focus is inside it, and while the page is hidden. */
(function () {
  "use strict";

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement) || form.method.toLowerCase() !== "post") {
      return;
    }
    if (form.getAttribute("data-submitted") === "1") {
      event.preventDefault();
      return;
    }
    form.setAttribute("data-submitted", "1");
    window.setTimeout(function () {
      var buttons = form.querySelectorAll("button");
      for (var i = 0; i < buttons.length; i++) {
        buttons[i].disabled = true;
      }
    }, 0);
  }, true);

  // Coming back with the browser's Back button: forms may be used again.
  window.addEventListener("pageshow", function (event) {
    if (!event.persisted) {
      return;
    }
    var forms = document.querySelectorAll("form[data-submitted]");
    for (var i = 0; i < forms.length; i++) {
      forms[i].removeAttribute("data-submitted");
      var buttons = forms[i].querySelectorAll("button");
      for (var j = 0; j < buttons.length; j++) {
        buttons[j].disabled = false;
      }
    }
  });

  var region = document.querySelector("[data-refresh-url]");
  if (!region) {
    return;
  }
  var url = region.getAttribute("data-refresh-url");
  var every = Math.max(1000, parseFloat(region.getAttribute("data-refresh-seconds")) * 1000);

  function refresh() {
    if (document.hidden || region.contains(document.activeElement)) {
      window.setTimeout(refresh, every);
      return;
    }
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        if (!region.contains(document.activeElement)) {
          region.innerHTML = html;  // rendered and escaped by the server
          region.setAttribute("data-refreshed", String(Date.now()));
          region.removeAttribute("data-stale");
        }
      })
      .catch(function () {
        region.setAttribute("data-stale", "1");
      })
      .then(function () {
        window.setTimeout(refresh, every);
      });
  }

  window.setTimeout(refresh, every);
})();
