// The pgqueue dashboard: plain JavaScript, no build step, no dependencies.
//
// Every piece of data comes from the token-protected JSON API next to this page (../api/v1),
// sent with "Authorization: Bearer TOKEN"; the token is asked for when the server wants one
// and kept in sessionStorage (this tab only). Everything shown is built with createElement
// and textContent, never innerHTML: payloads, results, errors, types and queue names are
// user data. The page refreshes itself every few seconds while it is visible.
"use strict";

(() => {
  const API = new URL("../api/v1/", document.baseURI);
  const TOKEN_KEY = "pgqueue.dashboard.token";
  const REFRESH_MS = 5000;
  const CHART_MINUTES = 60;
  const FULL_SERIES_EVERY_MS = 5 * 60 * 1000; // between these, only the last minutes are read
  const PRIORITIES = ["high", "normal", "low"];
  const SVG_NS = "http://www.w3.org/2000/svg";

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY),
    locked: false, // waiting for a token: nothing is fetched
    inFlight: false,
    again: false,
    series: [], // [{t: ms since epoch, completed, failed}], oldest first
    seriesFullAt: 0,
    seriesAt: 0,
    noticeTimer: null,
    back: [], // the cursors of the pages before this one (keyset paging: no offsets)
    backKey: "", // the view and filter those cursors belong to
    updatedAt: null, // when the last refresh succeeded
  };

  const $ = (id) => document.getElementById(id);

  // --- building the page: text only ever goes in as text ------------------------------------

  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
  }

  function addChildren(node, children) {
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    addChildren(node, children);
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    addChildren(node, children);
    return node;
  }

  function fill(container, ...children) {
    container.replaceChildren();
    addChildren(container, children);
  }

  function table(columns, rows, empty) {
    if (!rows.length) return el("p", { class: "empty" }, empty);
    return el(
      "table",
      {},
      el("thead", {}, el("tr", {}, columns.map((c) => el("th", { class: c.cls }, c.label)))),
      el("tbody", {}, rows),
    );
  }

  // --- formatting ------------------------------------------------------------------------------

  const pad = (n) => String(n).padStart(2, "0");

  function clock(date) {
    return `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  }

  function when(iso) {
    if (!iso) return "—";
    const date = new Date(iso);
    const today = new Date();
    if (date.toDateString() === today.toDateString()) return clock(date);
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ${clock(date)}`;
  }

  function duration(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
  }

  function relative(iso) {
    if (!iso) return "";
    const seconds = (Date.parse(iso) - Date.now()) / 1000;
    return seconds >= 0 ? `in ${duration(seconds)}` : `${duration(-seconds)} ago`;
  }

  const number = (n) => Number(n || 0).toLocaleString("en-US");
  // Task ids are UUIDv7: the leading digits are a timestamp, shared by tasks made together;
  // the trailing ones are random, so those tell tasks apart.
  const shortId = (id) => `…${String(id).slice(-8)}`;
  const taskHref = (id) => `#/tasks/${encodeURIComponent(id)}`;

  function percent(part, whole) {
    if (!whole) return "—";
    const value = (100 * part) / whole;
    return `${value < 10 ? value.toFixed(1) : Math.round(value)}%`;
  }

  function clip(text, limit) {
    const value = String(text ?? "");
    return value.length > limit ? `${value.slice(0, limit - 1)}…` : value;
  }

  function taskLink(id) {
    return el("a", { href: taskHref(id), class: "id", title: String(id) }, shortId(id));
  }

  // A task's parents or children: each a link to its page, its type and status.
  function edgeList(edges, none) {
    if (!edges.length) return el("span", { class: "muted" }, none);
    return el(
      "ul",
      { class: "edges" },
      ...edges.map((edge) =>
        el(
          "li",
          { "data-edge": String(edge.task_id) },
          taskLink(edge.task_id),
          " ",
          el("span", { class: "muted" }, edge.type ?? "(pruned)"),
          " ",
          edge.status ? badge(edge.status) : null,
        ),
      ),
    );
  }

  function badge(status) {
    const label = status === "failed" ? "dead" : status;
    return el("span", { class: `badge ${status}`, "data-status": status }, label);
  }

  // --- talking to the API ----------------------------------------------------------------------

  class HttpError extends Error {
    constructor(status, message, code = null, scope = null) {
      super(message);
      this.status = status;
      this.code = code; // the API's error name: "insufficient_scope", "not_found", ...
      this.scope = scope; // for insufficient_scope: the scope the request needs
    }
  }

  const isScopeRefusal = (err) => err instanceof HttpError && err.status === 403 && err.code === "insufficient_scope";

  async function api(path, options = {}) {
    const headers = { Accept: "application/json" };
    if (state.token) headers.Authorization = `Bearer ${state.token}`;
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(new URL(path, API), {
        ...options,
        headers,
        cache: "no-store",
        // With this origin's own credentials: mounted in a host app behind its login (HTTP
        // Basic, a session cookie), the data calls pass it as the page did. Pages of other
        // sites cannot use it: the server refuses their writes (Sec-Fetch-Site, Origin).
        credentials: "same-origin",
      });
    } catch (err) {
      throw new HttpError(0, "the server did not answer");
    }
    const text = await response.text();
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = null;
    }
    if (!response.ok) {
      const detail = body && typeof body.message === "string" ? body.message : response.statusText;
      const code = body && typeof body.error === "string" ? body.error : null;
      // WWW-Authenticate: Bearer error="insufficient_scope", scope="admin" (RFC 6750)
      const challenge = (response.headers.get("WWW-Authenticate") || "").match(/scope="([a-z]+)"/);
      throw new HttpError(response.status, `HTTP ${response.status}: ${detail}`, code, challenge ? challenge[1] : null);
    }
    return body;
  }

  // --- routes: #/ (overview), #/dead-letters, #/tasks/ID -----------------------------------------

  function route() {
    const hash = location.hash.replace(/^#/, "") || "/";
    const match = hash.match(/^\/tasks\/([^/?]+)$/);
    if (match) return { view: "task", id: decodeURIComponent(match[1]) };
    const [path, query] = hash.split("?");
    const params = new URLSearchParams(query || "");
    if (path === "/dead-letters") return { view: "dead-letters", params };
    if (path === "/tasks" || path === "/tasks/") return { view: "tasks", params };
    return { view: "overview" };
  }

  function showView(view) {
    $("login").hidden = true;
    $("nav").hidden = false;
    $("forget").hidden = !state.token;
    for (const name of ["overview", "tasks", "dead-letters", "task"]) {
      $(`view-${name}`).hidden = name !== view;
    }
    for (const link of document.querySelectorAll("#nav a")) {
      if (link.dataset.view === view) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  function clearData() {
    for (const id of ["cards", "queues", "keys", "chart", "running", "failures", "tasks", "tasks-pager", "dead-letters", "dlq-pager", "task"]) {
      $(id).replaceChildren();
    }
    $("keys-panel").hidden = true;
    for (const id of ["chart-summary", "running-summary", "tasks-summary", "dlq-summary", "dlq-count"]) {
      $(id).textContent = "";
    }
    state.series = [];
    state.seriesFullAt = 0;
  }

  function askForToken(message) {
    state.locked = true;
    state.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    clearData();
    for (const name of ["overview", "tasks", "dead-letters", "task"]) $(`view-${name}`).hidden = true;
    $("nav").hidden = true;
    $("forget").hidden = true;
    hideBanner();
    state.updatedAt = null;
    $("updated").textContent = "";
    $("login").hidden = false;
    const error = $("login-error");
    error.textContent = message || "";
    error.hidden = !message;
    $("token-input").value = "";
    $("token-input").focus();
  }

  // --- refreshing ------------------------------------------------------------------------------

  async function refresh() {
    if (state.locked) return;
    if (state.inFlight) {
      state.again = true; // a route change or an action while a refresh runs: go again after
      return;
    }
    state.inFlight = true;
    try {
      do {
        state.again = false;
        await refreshOnce();
      } while (state.again && !state.locked);
    } finally {
      state.inFlight = false;
    }
  }

  async function refreshOnce() {
    const current = route();
    try {
      if (current.view === "overview") await loadOverview();
      else if (current.view === "dead-letters") await loadDeadLetters(current.params);
      else if (current.view === "tasks") await loadTasks(current.params);
      else await loadTask(current.id);
    } catch (err) {
      if (err instanceof HttpError && err.status === 401) {
        askForToken(state.token ? "That token was refused." : "");
        return;
      }
      if (isScopeRefusal(err)) {
        // A metrics-only or submit-only token: it cannot read what the dashboard shows.
        askForToken(`That token cannot read the dashboard: it needs the read scope (or admin). ${err.message}`);
        return;
      }
      showBanner(`Refresh failed at ${clock(new Date())}: ${err.message}. Retrying every ${REFRESH_MS / 1000} s.`);
      return;
    }
    showView(current.view);
    hideBanner();
    state.updatedAt = new Date();
    showUpdated();
  }

  function showUpdated() {
    if (!state.updatedAt || state.locked) return;
    const paused = document.hidden ? " (paused while hidden)" : "";
    $("updated").textContent = `updated ${clock(state.updatedAt)}${paused}`;
  }

  function showBanner(text) {
    const banner = $("banner");
    banner.textContent = text;
    banner.hidden = false;
  }

  function hideBanner() {
    $("banner").hidden = true;
    $("banner").textContent = "";
  }

  function notify(text, failed = false) {
    // What an action did stays long enough to be read; a refusal stays until the next one.
    const notice = $("notice");
    notice.textContent = text;
    notice.classList.toggle("failed", failed);
    notice.hidden = false;
    clearTimeout(state.noticeTimer);
    if (!failed) {
      state.noticeTimer = setTimeout(() => {
        notice.hidden = true;
      }, 15000);
    }
  }

  // --- the overview ----------------------------------------------------------------------------

  async function loadOverview() {
    const [stats, series, running, failures] = await Promise.all([
      api("stats"),
      loadSeries(),
      api("tasks?status=running&limit=100&fields=summary"),
      api("failures?limit=20"),
    ]);
    renderCards(stats, series);
    renderQueues(stats);
    renderKeys(stats);
    renderChart(series);
    renderRunning(running.items);
    renderFailures(failures);
    renderDeadLetterCount(stats);
    renderSnapshotWarning(stats);
  }

  function renderSnapshotWarning(stats) {
    // An old snapshot stops vacuum from cleaning the queue's table: say who holds it and
    // what to do, before the table and its indexes have grown.
    const box = $("snapshot-warning");
    const held = stats.oldest_snapshot;
    if (!stats.oldest_snapshot_warning || !held) {
      box.hidden = true;
      box.textContent = "";
      return;
    }
    const state = held.state ? `, ${held.state}` : "";
    box.textContent =
      `Vacuum of pgqueue.tasks is held back: a ${held.kind}, ${held.holder}${state}, has kept ` +
      `a snapshot open for ${duration(held.seconds)} (${number(held.xid_age)} transactions). ` +
      "Finished tasks cannot be cleaned up until it ends: end it, or set " +
      "idle_in_transaction_session_timeout (docs/how-to/dba.md: When the database holds an old snapshot).";
    box.hidden = false;
  }

  async function loadSeries() {
    // The whole hour now and then; in between only the last two minutes, merged in (a refresh
    // every few seconds should not count an hour of finished tasks each time).
    const now = Date.now();
    const full =
      !state.series.length || now - state.seriesFullAt > FULL_SERIES_EVERY_MS || now - state.seriesAt > 60000;
    const body = await api(`throughput/series?minutes=${full ? CHART_MINUTES : 2}`);
    const points = body.points.map((p) => ({
      t: Date.parse(p.minute),
      completed: p.completed,
      failed: p.failed,
    }));
    if (full) {
      state.series = points;
      state.seriesFullAt = now;
    } else {
      const byMinute = new Map(state.series.map((p) => [p.t, p]));
      for (const p of points) byMinute.set(p.t, p);
      state.series = [...byMinute.values()].sort((a, b) => a.t - b.t).slice(-CHART_MINUTES);
    }
    state.seriesAt = now;
    return state.series;
  }

  function sumBy(rows, status, field = "tasks") {
    return rows.filter((r) => r.status === status).reduce((n, r) => n + r[field], 0);
  }

  function renderCards(stats, series) {
    const depth = stats.depth;
    const ages = depth
      .filter((r) => r.status === "queued" && r.oldest_ready_age_seconds !== null)
      .map((r) => r.oldest_ready_age_seconds);
    const completed = series.reduce((n, p) => n + p.completed, 0);
    const failed = series.reduce((n, p) => n + p.failed, 0);
    const card = (key, label, value, detail) =>
      el(
        "div",
        { class: "card", "data-card": key },
        el("div", { class: "card-label" }, label),
        el("div", { class: "card-value" }, value),
        el("div", { class: "card-detail" }, detail),
      );
    fill(
      $("cards"),
      card(
        "queued",
        "Queued",
        number(sumBy(depth, "queued")),
        `${number(sumBy(depth, "queued", "ready"))} ready · ${number(sumBy(depth, "queued", "scheduled"))} scheduled`,
      ),
      card("oldest", "Oldest ready", ages.length ? duration(Math.max(...ages)) : "—", "age of the oldest ready task"),
      card("running", "Running", number(sumBy(depth, "running")), "leased to workers"),
      card("completed", "Completed, 1 h", number(completed), `${number(failed)} dead-lettered`),
      card("failure-rate", "Failure rate, 1 h", percent(failed, completed + failed), "dead-lettered / finished"),
      card("dead", "Dead letters", number(sumBy(depth, "failed")), "waiting for replay or discard"),
    );
  }

  function renderQueues(stats) {
    const paused = new Set(stats.paused_queues);
    const groups = new Map(); // queue -> priority -> counts
    for (const row of stats.depth) {
      if (!groups.has(row.queue)) groups.set(row.queue, new Map());
      const byPriority = groups.get(row.queue);
      if (!byPriority.has(row.priority)) {
        byPriority.set(row.priority, { ready: 0, scheduled: 0, oldest: null, statuses: {} });
      }
      const cell = byPriority.get(row.priority);
      cell.statuses[row.status] = (cell.statuses[row.status] || 0) + row.tasks;
      if (row.status === "queued") {
        cell.ready += row.ready;
        cell.scheduled += row.scheduled;
        cell.oldest = row.oldest_ready_age_seconds;
      }
    }
    for (const name of paused) if (!groups.has(name)) groups.set(name, new Map());

    const order = (p) => (PRIORITIES.includes(p) ? PRIORITIES.indexOf(p) : 99);
    const rows = [];
    for (const name of [...groups.keys()].sort()) {
      const priorities = [...groups.get(name).keys()].sort((a, b) => order(a) - order(b) || a.localeCompare(b));
      const entries = priorities.length ? priorities : [null];
      entries.forEach((priority, i) => {
        const c = priority === null ? { ready: 0, scheduled: 0, oldest: null, statuses: {} } : groups.get(name).get(priority);
        const count = (key, value) => el("td", { class: "num", "data-col": key }, value ? number(value) : "·");
        const cells = [];
        if (i === 0) {
          cells.push(
            el(
              "th",
              { rowspan: entries.length, scope: "rowgroup", class: "queue-name" },
              name,
              paused.has(name) ? el("span", { class: "badge paused" }, "paused") : null,
            ),
          );
        }
        cells.push(
          el("td", { "data-col": "priority" }, priority ?? "—"),
          count("ready", c.ready),
          count("scheduled", c.scheduled),
          count("waiting", c.statuses.waiting),
          count("running", c.statuses.running),
          count("failed", c.statuses.failed),
          el("td", { class: "num", "data-col": "oldest" }, c.oldest === null ? "—" : duration(c.oldest)),
        );
        if (i === 0) {
          const total = (status) => [...groups.get(name).values()].reduce((n, p) => n + (p.statuses[status] || 0), 0);
          const button = queueButton(name, paused.has(name), total("queued"), total("waiting"));
          cells.push(el("td", { rowspan: entries.length, class: "actions" }, button));
        }
        rows.push(
          el(
            "tr",
            { "data-queue": name, "data-priority": priority ?? "", class: i === 0 ? "group-start" : null },
            cells,
          ),
        );
      });
    }
    const columns = [
      { label: "Queue" },
      { label: "Priority" },
      { label: "Ready", cls: "num" },
      { label: "Scheduled", cls: "num" },
      { label: "Waiting", cls: "num" },
      { label: "Running", cls: "num" },
      { label: "Dead letters", cls: "num" },
      { label: "Oldest ready", cls: "num" },
      { label: "" },
    ];
    fill($("queues"), table(columns, rows, "No tasks in any queue."));
  }

  function renderKeys(stats) {
    // Shown only where tasks have concurrency keys: who holds the workers, who waits. A key
    // with 1,000 or more queued tasks is counted no further: its ready count is a floor.
    const keys = stats.busiest_keys || [];
    $("keys-panel").hidden = !keys.length;
    const rows = keys.map((k) =>
      el(
        "tr",
        { "data-queue": k.queue, "data-key": k.key },
        el("td", { "data-col": "queue" }, k.queue),
        el("td", { "data-col": "key", title: k.key }, clip(k.key, 60)),
        el("td", { class: "num", "data-col": "running" }, number(k.running)),
        el("td", { class: "num", "data-col": "ready" }, `${number(k.ready)}${k.ready_capped ? "+" : ""}`),
      ),
    );
    const columns = [
      { label: "Queue" },
      { label: "Key" },
      { label: "Running", cls: "num" },
      { label: "Ready", cls: "num" },
    ];
    fill($("keys"), table(columns, rows, "No task has a concurrency key."));
  }

  function niceMax(value) {
    if (value <= 4) return 4;
    const magnitude = 10 ** Math.floor(Math.log10(value));
    for (const step of [1, 2, 2.5, 5, 10]) {
      if (step * magnitude >= value) return step * magnitude;
    }
    return 10 * magnitude;
  }

  function renderChart(series) {
    const width = 960;
    const height = 200;
    const left = 44;
    const right = 8;
    const top = 10;
    const bottom = 26;
    const plotW = width - left - right;
    const plotH = height - top - bottom;
    const peak = niceMax(Math.max(0, ...series.map((p) => p.completed + p.failed)));
    const slot = plotW / Math.max(series.length, 1);
    const barW = Math.max(1, slot * 0.72);
    const y = (v) => top + plotH - (v / peak) * plotH;

    const grid = [0, peak / 2, peak].map((v) =>
      svg(
        "g",
        { class: "grid" },
        svg("line", { x1: left, x2: width - right, y1: y(v), y2: y(v) }),
        svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end" }, number(v)),
      ),
    );
    const bars = series.map((p, i) => {
      const x = left + i * slot + (slot - barW) / 2;
      const minute = new Date(p.t);
      const label = `${pad(minute.getHours())}:${pad(minute.getMinutes())}`;
      const g = svg(
        "g",
        { class: "minute", "data-minute": new Date(p.t).toISOString(), "data-completed": p.completed, "data-failed": p.failed },
        svg("title", {}, `${label}: ${p.completed} completed, ${p.failed} dead-lettered`),
        // A transparent full-height target, so the tooltip works on empty minutes too.
        svg("rect", { class: "hover", x: left + i * slot, y: top, width: slot, height: plotH }),
      );
      if (p.completed) {
        g.append(svg("rect", { class: "bar completed", x, y: y(p.completed), width: barW, height: y(0) - y(p.completed) }));
      }
      if (p.failed) {
        const base = y(p.completed);
        g.append(svg("rect", { class: "bar failed", x, y: base - (y(0) - y(p.failed)), width: barW, height: y(0) - y(p.failed) }));
      }
      return g;
    });
    const last = series.length - 1;
    const ticks = series
      .map((p, i) => ({ p, i }))
      .filter(({ p, i }) => i === last || (new Date(p.t).getMinutes() % 10 === 0 && last - i >= 5))
      .map(({ p, i }) => {
        const minute = new Date(p.t);
        const label = i === series.length - 1 ? "now" : `${pad(minute.getHours())}:${pad(minute.getMinutes())}`;
        return svg("text", { class: "tick", x: left + i * slot + slot / 2, y: height - 8, "text-anchor": "middle" }, label);
      });
    const chart = svg(
      "svg",
      {
        viewBox: `0 0 ${width} ${height}`,
        class: "throughput",
        role: "img",
        "aria-label": "Tasks completed and dead-lettered per minute over the last hour",
      },
      grid,
      bars,
      svg("line", { class: "axis", x1: left, x2: width - right, y1: y(0), y2: y(0) }),
      ticks,
    );
    const completed = series.reduce((n, p) => n + p.completed, 0);
    const failed = series.reduce((n, p) => n + p.failed, 0);
    fill(
      $("chart"),
      chart,
      el(
        "div",
        { class: "legend" },
        el("span", { class: "swatch completed" }),
        "completed",
        el("span", { class: "swatch failed" }),
        "dead-lettered",
        el("span", { class: "muted" }, "per minute; counts come from the finished tasks still kept"),
      ),
    );
    $("chart-summary").textContent =
      `${number(completed)} completed · ${number(failed)} dead-lettered · failure rate ${percent(failed, completed + failed)}`;
  }

  function renderRunning(tasks) {
    const rows = tasks.map((t) => {
      const expires = t.lease_expires_at ? Date.parse(t.lease_expires_at) : null;
      const expired = expires !== null && expires < Date.now();
      // Running past its type's timeout: a sync handler's thread the worker waits for (it
      // records the timeout once the thread returns), or an async one blocking the loop.
      const ranFor = t.started_at ? (Date.now() - Date.parse(t.started_at)) / 1000 : 0;
      const overrunning = t.timeout_seconds != null && ranFor > t.timeout_seconds;
      return el(
        "tr",
        { "data-task-id": t.task_id },
        el("td", {}, taskLink(t.task_id)),
        el("td", { "data-col": "type" }, t.type),
        el("td", { "data-col": "queue" }, t.queue),
        el("td", { "data-col": "worker", class: "mono" }, t.worker ?? "—"),
        el("td", { class: "num", "data-col": "attempt" }, `${t.attempts} / ${t.max_attempts}`),
        el(
          "td",
          { "data-col": "started", class: overrunning ? "warn" : null },
          when(t.started_at),
          el("span", { class: "muted" }, ` ${relative(t.started_at)}`),
          overrunning
            ? el(
                "span",
                { class: "badge retrying", "data-field": "overrunning", title: "Its handler ran past its timeout; the worker holds the task until the handler returns, then records the attempt timed out." },
                `overrunning its ${duration(t.timeout_seconds)} timeout`,
              )
            : null,
        ),
        el(
          "td",
          { "data-col": "lease", class: expired ? "warn" : null },
          when(t.lease_expires_at),
          el("span", { class: expired ? "" : "muted" }, ` ${expired ? "expired " : ""}${relative(t.lease_expires_at)}`),
          t.cancel_requested ? el("span", { class: "badge cancelled" }, "cancel requested") : null,
        ),
      );
    });
    $("running-summary").textContent = tasks.length === 100 ? "the newest 100" : `${tasks.length} task${tasks.length === 1 ? "" : "s"}`;
    const columns = [
      { label: "Task" },
      { label: "Type" },
      { label: "Queue" },
      { label: "Worker" },
      { label: "Attempt", cls: "num" },
      { label: "Started" },
      { label: "Lease expires" },
    ];
    fill($("running"), table(columns, rows, "Nothing is running."));
  }

  // An error as the API splits it (pgqueue.error_text): the exception's type and message
  // first, since that is what a list of failures is scanned for; the traceback on demand.
  function traceback(text, full) {
    if (!text) return null;
    return el(
      "details",
      { class: "traceback", "data-field": "traceback" },
      el("summary", {}, "Traceback"),
      el("pre", { class: `error-text traceback-text${full ? " full" : ""}` }, text),
    );
  }

  function errorCell(item) {
    const summary = item.last_error_summary ?? item.last_error;
    return el(
      "td",
      { class: "error-cell", "data-col": "error" },
      el("pre", { class: "error-text", "data-field": "error-summary", title: summary ?? "" }, clip(summary ?? "—", 400)),
      traceback(item.last_error_traceback, false),
    );
  }

  function renderFailures(body) {
    const row = (f, dead) =>
      el(
        "tr",
        { "data-task-id": f.task_id, "data-kind": dead ? "dead" : "retrying" },
        el("td", {}, taskLink(f.task_id)),
        el("td", { "data-col": "type" }, f.type),
        el("td", { "data-col": "queue" }, f.queue),
        el("td", { class: "num", "data-col": "attempt" }, `${f.attempts} / ${f.max_attempts}`),
        el(
          "td",
          { "data-col": "state" },
          dead ? badge("failed") : el("span", { class: "badge retrying" }, "retrying"),
          el("span", { class: "muted" }, dead ? ` ${when(f.finished_at)}` : ` next ${relative(f.retry_at)}`),
        ),
        errorCell(f),
      );
    const rows = [...body.retrying.map((f) => row(f, false)), ...body.dead.map((f) => row(f, true))];
    const columns = [
      { label: "Task" },
      { label: "Type" },
      { label: "Queue" },
      { label: "Attempt", cls: "num" },
      { label: "State" },
      { label: "Last error" },
    ];
    fill($("failures"), table(columns, rows, "No failures."));
  }

  function renderDeadLetterCount(stats) {
    const dead = sumBy(stats.depth, "failed");
    $("dlq-count").textContent = dead ? number(dead) : "";
    return dead;
  }

  // --- confirming and doing an action ------------------------------------------------------------

  // Every action asks first, in one dialog that names what it will do and to how many tasks;
  // every action then goes to the same API endpoint the CLI's HTTP users call, and says what
  // happened. Resolves true only on the confirming button.
  function confirmAction(title, text, okLabel, danger) {
    const dialog = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    const ok = $("confirm-ok");
    ok.textContent = okLabel;
    ok.className = danger ? "danger armed" : "primary";
    return new Promise((resolve) => {
      const done = (answer) => {
        ok.onclick = null;
        $("confirm-cancel").onclick = null;
        dialog.oncancel = null;
        if (dialog.open) dialog.close();
        resolve(answer);
      };
      ok.onclick = () => done(true);
      $("confirm-cancel").onclick = () => done(false);
      dialog.oncancel = () => done(false); // Escape
      dialog.showModal();
      $("confirm-cancel").focus(); // Enter at 3 a.m. should not delete anything
    });
  }

  async function perform(what, request) {
    try {
      const result = await request();
      return result;
    } catch (err) {
      if (err instanceof HttpError && err.status === 401) {
        askForToken("That token was refused.");
        return null;
      }
      if (isScopeRefusal(err)) {
        notify(`Could not ${what}: this token may read, not act: needs ${err.scope || "admin"}.`, true);
        return null;
      }
      notify(`Could not ${what}: ${err.message}`, true);
      return null;
    } finally {
      refresh();
    }
  }

  const plural = (n, one, many) => `${number(n)} ${n === 1 ? one : many}`;
  const describeTask = (t) => `task ${shortId(t.task_id)} (${t.type}, queue ${t.queue})`;

  // --- paging: keyset cursors in the address, the way back kept in the tab -----------------------

  function pager(container, view, params, nextCursor) {
    const key = `${view}?${filterQuery(params)}`;
    if (state.backKey !== key) {
      state.backKey = key;
      state.back = [];
    }
    const go = (cursor) => {
      const query = new URLSearchParams(filterQuery(params));
      if (cursor) query.set("cursor", cursor);
      const text = query.toString();
      location.hash = `#/${view}${text ? `?${text}` : ""}`;
    };
    const here = params.get("cursor") || "";
    const buttons = [];
    if (here) {
      buttons.push(el("button", { type: "button", "data-page": "newest", onclick: () => { state.back = []; go(""); } }, "« Newest"));
      buttons.push(
        el("button", { type: "button", "data-page": "previous", onclick: () => go(state.back.pop() || "") }, "‹ Previous"),
      );
    }
    if (nextCursor) {
      buttons.push(el("button", { type: "button", "data-page": "next", onclick: () => { state.back.push(here); go(nextCursor); } }, "Next ›"));
    }
    fill(container, buttons);
    // Pages before this one; null for a page opened by its address, whose place is unknown.
    if (here && !state.back.length) return null;
    return state.back.length;
  }

  function filterQuery(params) {
    const query = new URLSearchParams();
    for (const key of ["type", "queue", "status"]) {
      const value = (params.get(key) || "").trim();
      if (value) query.set(key, value);
    }
    return query.toString();
  }

  function fillFilter(form, params) {
    // Not while the operator is typing in it: the refresh every few seconds would undo that.
    if (form.contains(document.activeElement)) return;
    for (const input of form.querySelectorAll("input, select")) input.value = params.get(input.name) || "";
  }

  function onFilter(form, view) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const query = filterQuery(new URLSearchParams(new FormData(form)));
      document.activeElement?.blur();
      location.hash = `#/${view}${query ? `?${query}` : ""}`;
    });
    form.addEventListener("reset", (event) => {
      event.preventDefault();
      document.activeElement?.blur();
      location.hash = `#/${view}`;
    });
  }

  function refused(container, err) {
    // A filter the API refuses (an unknown status, a name too long): its message, not a banner
    // that retries every few seconds.
    if (err instanceof HttpError && (err.status === 400 || err.status === 422)) {
      fill(container, el("p", { class: "error", "data-field": "filter-error" }, `That filter was refused: ${err.message.replace(/^HTTP \d+: /, "")}`));
      return true;
    }
    return false;
  }

  const PAGE = 100;
  const span = (first, count) => (first === null ? `${number(count)} after earlier pages` : `${number(first)} to ${number(first + count - 1)}`);

  // --- all tasks, by filter --------------------------------------------------------------------------

  async function loadTasks(params) {
    fillFilter($("tasks-filter"), params);
    const query = new URLSearchParams(filterQuery(params));
    query.set("limit", String(PAGE));
    query.set("fields", "summary"); // no payloads or results: a task's own page shows them
    if (params.get("cursor")) query.set("cursor", params.get("cursor"));
    let page;
    try {
      page = await api(`tasks?${query}`);
    } catch (err) {
      if (!refused($("tasks"), err)) throw err;
      fill($("tasks-pager"));
      $("tasks-summary").textContent = "";
      return;
    }
    const before = pager($("tasks-pager"), "tasks", params, page.next_cursor);
    const first = before === null ? null : before * PAGE + 1;
    $("tasks-summary").textContent = page.items.length
      ? `${span(first, page.items.length)}, newest first${page.next_cursor ? "" : " (the last page)"}`
      : "";
    const rows = page.items.map((t) =>
      el(
        "tr",
        { "data-task-id": t.task_id },
        el("td", {}, taskLink(t.task_id)),
        el("td", { "data-col": "type" }, t.type),
        el("td", { "data-col": "queue" }, t.queue),
        el("td", { "data-col": "status" }, badge(t.status)),
        el("td", { "data-col": "priority" }, t.priority),
        el("td", { class: "num", "data-col": "attempt" }, `${t.attempts} / ${t.max_attempts}`),
        el("td", { "data-col": "created" }, when(t.created_at)),
      ),
    );
    const columns = [
      { label: "Task" },
      { label: "Type" },
      { label: "Queue" },
      { label: "Status" },
      { label: "Priority" },
      { label: "Attempts", cls: "num" },
      { label: "Created" },
    ];
    fill($("tasks"), table(columns, rows, "No task matches this filter."));
  }

  // --- the dead-letter queue ---------------------------------------------------------------------

  function selectionText(type, queue) {
    if (type && queue) return ` of type ${type} in queue ${queue}`;
    if (type) return ` of type ${type}`;
    if (queue) return ` in queue ${queue}`;
    return "";
  }

  async function loadDeadLetters(params) {
    fillFilter($("dlq-filter"), params);
    const type = (params.get("type") || "").trim();
    const queue = (params.get("queue") || "").trim();
    const filter = new URLSearchParams(filterQuery(new URLSearchParams({ type, queue })));
    const query = new URLSearchParams(filter);
    query.set("limit", String(PAGE));
    query.set("fields", "summary"); // no payloads or results: a task's own page shows them
    if (params.get("cursor")) query.set("cursor", params.get("cursor"));
    let stats, page, counted;
    try {
      [stats, page, counted] = await Promise.all([api("stats"), api(`dead-letters?${query}`), api(`dead-letters/count?${filter}`)]);
    } catch (err) {
      if (!refused($("dead-letters"), err)) throw err;
      fill($("dlq-pager"));
      return;
    }
    renderDeadLetterCount(stats);
    const matching = counted.count;
    const before = pager($("dlq-pager"), "dead-letters", params, page.next_cursor);
    const first = before === null ? null : before * PAGE + 1;
    const which = selectionText(type, queue);
    $("dlq-summary").textContent = page.items.length
      ? `${span(first, page.items.length)} of ${plural(matching, "dead letter", "dead letters")}${which}`
      : `${plural(matching, "dead letter", "dead letters")}${which}`;
    for (const [id, action] of [["dlq-replay-all", "replay"], ["dlq-discard-all", "discard"]]) {
      const button = $(id);
      button.disabled = matching === 0;
      button.textContent = `${action === "replay" ? "Replay" : "Discard"} ${matching === 0 ? "all" : `all ${number(matching)}`}…`;
      button.onclick = () => bulk(action, type, queue, matching);
    }
    const rows = page.items.map((t) =>
      el(
        "tr",
        { "data-task-id": t.task_id },
        el("td", {}, taskLink(t.task_id)),
        el("td", { "data-col": "type" }, t.type),
        el("td", { "data-col": "queue" }, t.queue),
        el("td", { class: "num", "data-col": "attempt" }, `${t.attempts} / ${t.max_attempts}`),
        el("td", { "data-col": "finished" }, when(t.finished_at)),
        errorCell(t),
        el("td", { class: "actions" }, actionButtons(t)),
      ),
    );
    const columns = [
      { label: "Task" },
      { label: "Type" },
      { label: "Queue" },
      { label: "Attempts", cls: "num" },
      { label: "Dead since" },
      { label: "Last error" },
      { label: "" },
    ];
    fill($("dead-letters"), table(columns, rows, which ? "No dead letter matches this filter." : "The dead-letter queue is empty."));
  }

  function actionButtons(task) {
    const replay = el("button", { type: "button", class: "replay", "data-action": "replay", onclick: () => act("replay", task) }, "Replay");
    const discard = el("button", { type: "button", class: "discard danger", "data-action": "discard", onclick: () => act("discard", task) }, "Discard");
    return [replay, " ", discard];
  }

  async function act(action, task) {
    const what = describeTask(task);
    const ok =
      action === "replay"
        ? await confirmAction("Replay 1 dead letter?", `Queue ${what} again, with fresh attempts.`, "Replay 1 task", false)
        : await confirmAction("Discard 1 dead letter?", `Delete ${what} for good. This cannot be undone.`, "Discard 1 task", true);
    if (!ok) return;
    const path = `dead-letters/${encodeURIComponent(task.task_id)}${action === "replay" ? "/replay" : ""}`;
    const done = await perform(`${action} ${what}`, () => api(path, { method: action === "replay" ? "POST" : "DELETE" }));
    if (done) {
      const named = what.charAt(0).toUpperCase() + what.slice(1);
      notify(action === "replay" ? `${named} replayed: queued again with fresh attempts.` : `${named} discarded.`);
    }
  }

  async function bulk(action, type, queue, counted) {
    const which = selectionText(type, queue) || " (every dead letter)";
    const tasks = plural(counted, "dead letter", "dead letters");
    const ok =
      action === "replay"
        ? await confirmAction(`Replay ${tasks}?`, `Queue ${tasks}${which} again, with fresh attempts.`, `Replay ${plural(counted, "task", "tasks")}`, false)
        : await confirmAction(`Discard ${tasks}?`, `Delete ${tasks}${which} for good. This cannot be undone.`, `Discard ${plural(counted, "task", "tasks")}`, true);
    if (!ok) return;
    // In batches, and never more than the count confirmed: dead letters that arrive meanwhile
    // were not part of what the operator agreed to.
    const selection = type || queue ? { type: type || null, queue: queue || null } : { all: true };
    const done = await perform(`${action} dead letters${which}`, async () => {
      let total = 0;
      while (total < counted) {
        const limit = Math.min(1000, counted - total);
        const batch = await api(`dead-letters/${action}`, {
          method: "POST",
          body: JSON.stringify({ ...selection, limit }),
        });
        total += batch.count;
        if (batch.count < limit) break;
      }
      return { total };
    });
    if (!done) return;
    const verb = action === "replay" ? "Replayed" : "Discarded";
    const rest = done.total < counted ? ` of the ${number(counted)} counted (the others changed meanwhile)` : "";
    notify(`${verb} ${plural(done.total, "dead letter", "dead letters")}${rest}${which}.`);
  }

  // --- pausing a queue, cancelling a task ------------------------------------------------------------

  function queueButton(name, isPaused, queued, waiting) {
    const label = isPaused ? "Resume" : "Pause";
    return el(
      "button",
      { type: "button", class: isPaused ? "resume" : "pause", "data-action": isPaused ? "resume" : "pause", "data-queue": name, onclick: () => toggleQueue(name, isPaused, queued, waiting) },
      label,
    );
  }

  async function toggleQueue(name, isPaused, queued, waiting) {
    // Waiting tasks are claimed once their parents release them, so the pause holds them too.
    const tasks =
      plural(queued, "queued task", "queued tasks") +
      (waiting ? ` (and the ${plural(waiting, "task", "tasks")} waiting for their parents, once released)` : "");
    const ok = isPaused
      ? await confirmAction(`Resume queue ${name}?`, `Workers start claiming its ${tasks} again.`, `Resume ${name}`, false)
      : await confirmAction(
          `Pause queue ${name}?`,
          `Workers stop claiming its ${tasks} until it is resumed; tasks already running finish, and submitting still works.`,
          `Pause ${name}`,
          true,
        );
    if (!ok) return;
    const action = isPaused ? "resume" : "pause";
    const done = await perform(`${action} queue ${name}`, () => api(`queues/${encodeURIComponent(name)}/${action}`, { method: "POST" }));
    if (done) notify(done.paused ? `Paused queue ${name}: no worker claims its tasks until it is resumed.` : `Resumed queue ${name}.`);
  }

  async function cancelTask(task) {
    const what = describeTask(task);
    const text =
      task.status === "running"
        ? `It is running on ${task.worker ?? "a worker"}: its handler is asked to stop, and decides when.`
        : "It is waiting: it will never run.";
    if (!(await confirmAction("Cancel 1 task?", `Cancel ${what}. ${text}`, "Cancel 1 task", true))) return;
    const done = await perform(`cancel ${what}`, () => api(`tasks/${encodeURIComponent(task.task_id)}`, { method: "DELETE" }));
    if (done) notify(done.status === "running" ? `Asked ${what} to stop: it is still running until its handler does.` : `Cancelled ${what}.`);
  }

  // --- one task ----------------------------------------------------------------------------------

  async function loadTask(taskId) {
    let task;
    try {
      task = await api(`tasks/${encodeURIComponent(taskId)}`);
    } catch (err) {
      // The API answers 404 for an id that is not even a UUID, as for one it does not know;
      // the page tells the two apart, since a mistyped id wants another answer at 3 a.m.
      const uuidLike = /^[0-9a-f]{8}-?(?:[0-9a-f]{4}-?){3}[0-9a-f]{12}$/i.test(taskId);
      if (err instanceof HttpError && err.status === 404 && uuidLike) {
        fill(
          $("task"),
          el("div", { class: "panel" }, el("h2", {}, "No such task"), el("p", { "data-field": "not-found" }, `No task has the id ${taskId}: it may have been pruned or discarded, or the id is mistyped.`)),
        );
        return;
      }
      if (err instanceof HttpError && [400, 404, 422].includes(err.status)) {
        fill(
          $("task"),
          el("div", { class: "panel" }, el("h2", {}, "Not a task id"), el("p", { "data-field": "not-found" }, `"${clip(taskId, 80)}" is not a task id: a task id is a UUID, like 0193b1c2-8f4e-7a10-9c3d-5e6f7a8b9c0d.`)),
        );
        return;
      }
      throw err;
    }
    const field = (key, label, ...value) => [el("dt", {}, label), el("dd", { "data-field": key }, ...value)];
    const json = (key, value) =>
      el("pre", { class: "json", "data-field": key }, value === null || value === undefined ? "—" : JSON.stringify(value, null, 2));
    fill(
      $("task"),
      el(
        "div",
        { class: "panel" },
        el(
          "div",
          { class: "panel-head" },
          el("h2", {}, `Task ${task.task_id}`),
          badge(task.status),
          task.status === "failed" ? el("span", { class: "actions" }, actionButtons(task)) : null,
          (task.status === "queued" || task.status === "running" || task.status === "waiting") && !task.cancel_requested
            ? el("span", { class: "actions" }, el("button", { type: "button", class: "cancel danger", "data-action": "cancel", onclick: () => cancelTask(task) }, "Cancel task…"))
            : null,
        ),
        el(
          "dl",
          { class: "fields" },
          field("type", "Type", task.type),
          field("queue", "Queue", task.queue),
          field(
            "priority",
            "Priority",
            task.priority,
            task.submitted_priority && task.submitted_priority !== task.priority
              ? el("span", { class: "muted", "data-field": "submitted-priority" }, ` (submitted ${task.submitted_priority}, promoted for waiting)`)
              : null,
          ),
          field("status", "Status", task.status === "failed" ? "failed (dead letter)" : task.status),
          field("attempts", "Attempts", `${task.attempts} of ${task.max_attempts}`),
          field("created", "Created", when(task.created_at)),
          task.status === "queued"
            ? field("run-at", "Runs at", when(task.run_at), el("span", { class: "muted" }, ` ${relative(task.run_at)}`))
            : null,
          task.status === "queued" && task.ready_since && task.ready_since !== task.run_at
            ? field("ready-since", "Ready since", when(task.ready_since), el("span", { class: "muted" }, ` ${relative(task.ready_since)}`))
            : null,
          field("started", "Last started", when(task.started_at)),
          field("finished", "Finished", when(task.finished_at)),
          field("worker", "Worker", task.worker ?? "—"),
          field("lease", "Lease expires", when(task.lease_expires_at)),
          field("idempotency-key", "Idempotency key", task.idempotency_key ?? "—"),
          field("cancel", "Cancel requested", task.cancel_requested ? "yes" : "no"),
          // Snoozes (no attempt spent) and the expiry, when the task has them.
          task.snoozes ? field("snoozes", "Snoozed", `${task.snoozes} times`) : null,
          task.expires_at
            ? field(
                "expires-at",
                "Expires",
                when(task.expires_at),
                el("span", { class: "muted" }, task.status === "cancelled" && task.last_error === "expired" ? " (expired: never run)" : ` ${relative(task.expires_at)}`),
              )
            : null,
        ),
      ),
      // Where the task sits in a workflow, its parents and children with their statuses.
      task.workflow_id || (task.parents ?? []).length || (task.children ?? []).length
        ? el(
            "div",
            { class: "panel", "data-panel": "workflow" },
            el("h3", {}, "Workflow"),
            el(
              "dl",
              { class: "fields" },
              field("workflow-id", "Workflow", task.workflow_id ?? "—"),
              task.cancelled_by ? field("cancelled-by", "Cancelled by", taskLink(task.cancelled_by), el("span", { class: "muted" }, " (that parent failed or was cancelled)")) : null,
              field("parents", "Parents", edgeList(task.parents ?? [], "none: it starts as soon as it is queued")),
              field("children", "Children", edgeList(task.children ?? [], "none: nothing waits for it")),
            ),
          )
        : null,
      // The handler's progress report (ctx.set_progress), while it runs and after: the last one.
      task.progress !== null && task.progress !== undefined
        ? el(
            "div",
            { class: "panel", "data-panel": "progress" },
            el("h3", {}, "Progress"),
            el(
              "p",
              { class: "muted" },
              task.status === "running" ? "reported by its handler, written at most every 0.5 s" : "its handler's last report",
            ),
            json("progress", task.progress),
          )
        : null,
      el("div", { class: "panel" }, el("h3", {}, "Payload"), json("payload", task.payload)),
      el("div", { class: "panel" }, el("h3", {}, "Result"), json("result", task.result)),
      el(
        "div",
        { class: "panel" },
        el("h3", {}, "Last error"),
        task.last_error
          ? el("p", { class: "muted" }, `after ${task.attempts} of ${task.max_attempts} attempts; pgqueue keeps the last error only`)
          : null,
        el("pre", { class: "error-text full", "data-field": "last-error" }, task.last_error_summary ?? task.last_error ?? "—"),
        traceback(task.last_error_traceback, true),
      ),
    );
  }

  // --- start -------------------------------------------------------------------------------------

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) return;
    state.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
    state.locked = false;
    $("login-error").hidden = true;
    $("updated").textContent = "loading…";
    refresh();
  });

  $("forget").addEventListener("click", () => askForToken(""));

  $("find-form").addEventListener("submit", (event) => {
    event.preventDefault();
    // The API decides what an id is (one rule): the task page says when it is not one.
    const id = $("find-id").value.trim().replace(/^…/, "");
    if (!id) return;
    $("find-id").value = "";
    location.hash = taskHref(id);
  });
  onFilter($("tasks-filter"), "tasks");
  onFilter($("dlq-filter"), "dead-letters");

  window.addEventListener("hashchange", () => {
    window.scrollTo(0, 0);
    refresh();
  });

  document.addEventListener("visibilitychange", () => {
    showUpdated();
    if (!document.hidden) refresh();
  });

  setInterval(() => {
    if (!document.hidden) refresh();
  }, REFRESH_MS);

  refresh();
})();
