// steward /ui: refresh the live part every few seconds and follow the event log.
// With keys in force the admin key the user typed is kept in sessionStorage (this tab only)
// and sent as a Bearer header: EventSource cannot send one, so events are read with fetch.
"use strict";
(function () {
  const REFRESH_MS = 3000;
  const MAX_EVENTS = 200;
  const period = document.body.dataset.period || "1h";
  const live = document.getElementById("live");
  const list = document.getElementById("events");
  const form = document.getElementById("key-form");

  function headers() {
    const key = sessionStorage.getItem("steward-key");
    return key ? { Authorization: "Bearer " + key } : {};
  }

  async function refresh() {
    try {
      const answer = await fetch("/ui/live?period=" + encodeURIComponent(period), { headers: headers() });
      if (answer.ok) {
        live.innerHTML = await answer.text(); // rendered and escaped by steward (page.py)
        document.body.classList.remove("stale");
      } else {
        document.body.classList.add("stale");
      }
    } catch (error) {
      document.body.classList.add("stale");
    }
  }

  function show(record) {
    if (record.level === "debug") return;
    const row = document.createElement("li");
    row.className = "event " + (record.level || "");
    const details = Object.entries(record)
      .filter(([k]) => !["ts", "level", "event", "mono"].includes(k))
      .map(([k, v]) => k + "=" + (typeof v === "string" ? v : JSON.stringify(v)));
    row.textContent = [record.ts, record.event, details.join(" ")].join("  ");
    list.prepend(row);
    while (list.children.length > MAX_EVENTS) list.lastChild.remove();
  }

  async function follow() {
    for (;;) {
      try {
        const answer = await fetch("/admin/events", { headers: headers() });
        if (answer.ok && answer.body) {
          const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
          let buffer = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buffer += value;
            let end;
            while ((end = buffer.indexOf("\n\n")) >= 0) {
              const block = buffer.slice(0, end);
              buffer = buffer.slice(end + 2);
              if (block.startsWith("data: ")) {
                try { show(JSON.parse(block.slice(6))); } catch (error) { /* not JSON: skipped */ }
              }
            }
          }
        }
      } catch (error) { /* steward restarting: try again below */ }
      await new Promise((resolve) => setTimeout(resolve, REFRESH_MS));
    }
  }

  if (form) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem("steward-key", document.getElementById("key").value);
      refresh();
    });
  }
  if (!form || sessionStorage.getItem("steward-key")) refresh();
  setInterval(refresh, REFRESH_MS);
  follow();
})();
