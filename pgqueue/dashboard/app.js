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
    armed: new Map(), // discard buttons waiting for their confirming click
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

  function badge(status) {
    const label = status === "failed" ? "dead" : status;
    return el("span", { class: `badge ${status}`, "data-status": status }, label);
  }

  // --- talking to the API ----------------------------------------------------------------------

  class HttpError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(path, options = {}) {
    const headers = { Accept: "application/json" };
    if (state.token) headers.Authorization = `Bearer ${state.token}`;
    let response;
    try {
      response = await fetch(new URL(path, API), {
        ...options,
        headers,
        cache: "no-store",
        credentials: "omit",
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
      throw new HttpError(response.status, `HTTP ${response.status}: ${detail}`);
    }
    return body;
  }

  // --- routes: #/ (overview), #/dead-letters, #/tasks/ID -----------------------------------------

  function route() {
    const hash = location.hash.replace(/^#/, "") || "/";
    const match = hash.match(/^\/tasks\/([^/]+)$/);
    if (match) return { view: "task", id: decodeURIComponent(match[1]) };
    if (hash === "/dead-letters") return { view: "dead-letters" };
    return { view: "overview" };
  }

  function showView(view) {
    $("login").hidden = true;
    $("nav").hidden = false;
    $("forget").hidden = !state.token;
    for (const name of ["overview", "dead-letters", "task"]) {
      $(`view-${name}`).hidden = name !== view;
    }
    for (const link of document.querySelectorAll("#nav a")) {
      if (link.dataset.view === view) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  function clearData() {
    for (const id of ["cards", "queues", "chart", "running", "failures", "dead-letters", "task"]) {
      $(id).replaceChildren();
    }
    for (const id of ["chart-summary", "running-summary", "dlq-summary", "dlq-count"]) {
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
    for (const name of ["overview", "dead-letters", "task"]) $(`view-${name}`).hidden = true;
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
      else if (current.view === "dead-letters") await loadDeadLetters();
      else await loadTask(current.id);
    } catch (err) {
      if (err instanceof HttpError && err.status === 401) {
        askForToken(state.token ? "That token was refused." : "");
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

  function notify(text) {
    const notice = $("notice");
    notice.textContent = text;
    notice.hidden = false;
    clearTimeout(state.noticeTimer);
    state.noticeTimer = setTimeout(() => {
      notice.hidden = true;
    }, 6000);
  }

  // --- the overview ----------------------------------------------------------------------------

  async function loadOverview() {
    const [stats, series, running, failures] = await Promise.all([
      api("stats"),
      loadSeries(),
      api("tasks?status=running&limit=100"),
      api("failures?limit=20"),
    ]);
    renderCards(stats, series);
    renderQueues(stats);
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
      "idle_in_transaction_session_timeout (README: When the database holds an old snapshot).";
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
        "waiting",
        "Waiting",
        number(sumBy(depth, "queued")),
        `${number(sumBy(depth, "queued", "ready"))} ready · ${number(sumBy(depth, "queued", "scheduled"))} scheduled`,
      ),
      card("oldest", "Oldest waiting", ages.length ? duration(Math.max(...ages)) : "—", "age of the oldest ready task"),
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
          count("running", c.statuses.running),
          count("failed", c.statuses.failed),
          el("td", { class: "num", "data-col": "oldest" }, c.oldest === null ? "—" : duration(c.oldest)),
        );
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
      { label: "Running", cls: "num" },
      { label: "Dead letters", cls: "num" },
      { label: "Oldest waiting", cls: "num" },
    ];
    fill($("queues"), table(columns, rows, "No tasks in any queue."));
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
      return el(
        "tr",
        { "data-task-id": t.task_id },
        el("td", {}, taskLink(t.task_id)),
        el("td", { "data-col": "type" }, t.type),
        el("td", { "data-col": "queue" }, t.queue),
        el("td", { "data-col": "worker", class: "mono" }, t.worker ?? "—"),
        el("td", { class: "num", "data-col": "attempt" }, `${t.attempts} / ${t.max_attempts}`),
        el("td", { "data-col": "started" }, when(t.started_at), el("span", { class: "muted" }, ` ${relative(t.started_at)}`)),
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

  function errorCell(text) {
    return el("td", { class: "error-cell", "data-col": "error" }, el("pre", { class: "error-text", title: text ?? "" }, clip(text ?? "—", 400)));
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
        errorCell(f.last_error),
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

  // --- the dead-letter queue ---------------------------------------------------------------------

  async function loadDeadLetters() {
    const [stats, page] = await Promise.all([api("stats"), api("dead-letters?limit=100")]);
    const dead = renderDeadLetterCount(stats);
    $("dlq-summary").textContent =
      page.items.length < dead ? `the newest ${page.items.length} of ${number(dead)}` : `${number(dead)} task${dead === 1 ? "" : "s"}`;
    const rows = page.items.map((t) =>
      el(
        "tr",
        { "data-task-id": t.task_id },
        el("td", {}, taskLink(t.task_id)),
        el("td", { "data-col": "type" }, t.type),
        el("td", { "data-col": "queue" }, t.queue),
        el("td", { class: "num", "data-col": "attempt" }, `${t.attempts} / ${t.max_attempts}`),
        el("td", { "data-col": "finished" }, when(t.finished_at)),
        errorCell(t.last_error),
        el("td", { class: "actions" }, actionButtons(t.task_id)),
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
    fill($("dead-letters"), table(columns, rows, "The dead-letter queue is empty."));
  }

  function actionButtons(taskId) {
    const replay = el("button", { type: "button", class: "replay", "data-action": "replay", onclick: () => act("replay", taskId, replay) }, "Replay");
    const discard = el(
      "button",
      {
        type: "button",
        class: "discard danger",
        "data-action": "discard",
        "data-task": taskId,
        onclick: () => act("discard", taskId, discard),
      },
      state.armed.has(taskId) ? "Really discard?" : "Discard",
    );
    if (state.armed.has(taskId)) discard.classList.add("armed");
    return [replay, " ", discard];
  }

  async function act(action, taskId, button) {
    if (action === "discard" && !state.armed.has(taskId)) {
      // Deleting is for good: the first click arms the button, a second within 5 s deletes.
      const disarm = () => {
        state.armed.delete(taskId);
        // The table may have been redrawn since: reset whichever button is this task's now.
        for (const b of document.querySelectorAll("button.discard")) {
          if (b.dataset.task === taskId) {
            b.textContent = "Discard";
            b.classList.remove("armed");
          }
        }
      };
      state.armed.set(taskId, setTimeout(disarm, 5000));
      button.textContent = "Really discard?";
      button.classList.add("armed");
      return;
    }
    clearTimeout(state.armed.get(taskId));
    state.armed.delete(taskId);
    button.disabled = true;
    const path = `dead-letters/${encodeURIComponent(taskId)}${action === "replay" ? "/replay" : ""}`;
    try {
      await api(path, { method: action === "replay" ? "POST" : "DELETE" });
      notify(action === "replay" ? `Task ${shortId(taskId)} replayed: queued again with fresh attempts.` : `Task ${shortId(taskId)} discarded.`);
    } catch (err) {
      if (err instanceof HttpError && err.status === 401) {
        askForToken("That token was refused.");
        return;
      }
      notify(`Could not ${action} task ${shortId(taskId)}: ${err.message}`);
    }
    await refresh();
  }

  // --- one task ----------------------------------------------------------------------------------

  async function loadTask(taskId) {
    let task;
    try {
      task = await api(`tasks/${encodeURIComponent(taskId)}`);
    } catch (err) {
      if (err instanceof HttpError && err.status === 404) {
        fill($("task"), el("div", { class: "panel" }, el("h2", {}, "No such task"), el("p", { class: "mono" }, taskId)));
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
          task.status === "failed" ? el("span", { class: "actions" }, actionButtons(task.task_id)) : null,
        ),
        el(
          "dl",
          { class: "fields" },
          field("type", "Type", task.type),
          field("queue", "Queue", task.queue),
          field("priority", "Priority", task.priority),
          field("status", "Status", task.status === "failed" ? "failed (dead letter)" : task.status),
          field("attempts", "Attempts", `${task.attempts} of ${task.max_attempts}`),
          field("created", "Created", when(task.created_at)),
          task.status === "queued"
            ? field("run-at", "Runs at", when(task.run_at), el("span", { class: "muted" }, ` ${relative(task.run_at)}`))
            : null,
          field("started", "Last started", when(task.started_at)),
          field("finished", "Finished", when(task.finished_at)),
          field("worker", "Worker", task.worker ?? "—"),
          field("lease", "Lease expires", when(task.lease_expires_at)),
          field("idempotency-key", "Idempotency key", task.idempotency_key ?? "—"),
          field("cancel", "Cancel requested", task.cancel_requested ? "yes" : "no"),
        ),
      ),
      el("div", { class: "panel" }, el("h3", {}, "Payload"), json("payload", task.payload)),
      el("div", { class: "panel" }, el("h3", {}, "Result"), json("result", task.result)),
      el(
        "div",
        { class: "panel" },
        el("h3", {}, "Last error"),
        task.last_error
          ? el("p", { class: "muted" }, `after ${task.attempts} of ${task.max_attempts} attempts; pgqueue keeps the last error only`)
          : null,
        el("pre", { class: "error-text full", "data-field": "last-error" }, task.last_error ?? "—"),
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
