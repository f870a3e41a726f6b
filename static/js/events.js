// Live page updates: one websocket per page; each server event becomes an htmx trigger "page:<event>" on <body>,
// so fragments refresh themselves with hx-trigger="page:tasks_changed from:body". Reconnects with backoff.
(function () {
  const url = document.body.dataset.eventsUrl;
  if (!url) return;
  let delay = 1000;
  function connect() {
    const absolute = url.startsWith("ws");
    const ws = new WebSocket(absolute ? url : (location.protocol === "https:" ? "wss://" : "ws://") + location.host + url);
    ws.onopen = () => { delay = 1000; document.body.dataset.eventsState = "open"; };
    ws.onmessage = (msg) => {
      const data = JSON.parse(msg.data);
      if (window.htmx && data.event) htmx.trigger(document.body, "page:" + data.event, data);
    };
    ws.onclose = (e) => {
      document.body.dataset.eventsState = "closed";
      if (e.code !== 4401) setTimeout(connect, delay = Math.min(delay * 2, 30000));
    };
  }
  connect();
})();
