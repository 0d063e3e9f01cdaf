// Tollgate's dashboard: polls the admin API and draws what it answers. No library, no CDN:
// this file is compiled into the binary with the page and its style sheet.
'use strict';

(() => {
  const HISTORY_SECONDS = 120;
  const FIELDS = {
    fixed_window: [['limit', 'number'], ['window', 'text']],
    sliding_window_log: [['limit', 'number'], ['window', 'text']],
    sliding_window_counter: [['limit', 'number'], ['window', 'text']],
    token_bucket: [['capacity', 'number'], ['refill', 'text']],
    leaky_bucket: [['rate', 'text'], ['queue', 'number']],
    concurrency: [['limit', 'number']],
  };

  // Everything the page knows; also where a test (or a curious operator) can look.
  const state = {
    token: sessionStorage.getItem('tollgate-token') || '',
    policies: [],
    previous: null,
    series: new Map(),
    polls: 0,
  };
  window.tollgateDashboard = state;

  const $ = (id) => document.getElementById(id);
  const make = (tag, text, cls) => {
    const el = document.createElement(tag);
    if (text !== undefined && text !== null) el.textContent = String(text);
    if (cls) el.className = cls;
    return el;
  };

  async function api(method, path, body) {
    const headers = {};
    if (state.token) headers.Authorization = 'Bearer ' + state.token;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (res.status === 401) {
      $('login').hidden = false;
      throw new Error('this admin listener needs its token');
    }
    const text = await res.text();
    const data = text ? JSON.parse(text) : null;
    if (!res.ok) {
      const error = new Error((data && (data.detail || data.title)) || res.statusText);
      error.data = data;
      throw error;
    }
    return data;
  }

  function status(text, bad) {
    const el = $('status');
    el.textContent = text;
    el.classList.toggle('bad', Boolean(bad));
  }

  // --- decisions per second -------------------------------------------------------------

  function recordRates(stats) {
    const prev = state.previous;
    state.previous = stats;
    if (!prev) return;
    const seconds = (stats.time_ms - prev.time_ms) / 1000;
    if (seconds <= 0) return;
    for (const p of stats.policies) {
      const before = prev.policies.find((q) => q.name === p.name);
      if (!before) continue;
      const rate = (field) => Math.max(0, (p[field] - before[field]) / seconds);
      const list = state.series.get(p.name) || [];
      list.push({
        t: stats.time_ms,
        admitted: rate('allowed') + rate('fail_open'),
        denied: rate('denied'),
        shadow: rate('shadow'),
      });
      while (list.length && list[0].t < stats.time_ms - HISTORY_SECONDS * 1000) list.shift();
      state.series.set(p.name, list);
    }
  }

  function chartCard(name) {
    let card = document.querySelector(`.card[data-policy="${CSS.escape(name)}"]`);
    if (card) return card;
    card = make('div', null, 'card');
    card.dataset.policy = name;
    card.append(make('h3', name), make('p', '', 'rates'), make('canvas'));
    $('charts').append(card);
    return card;
  }

  function drawCharts(stats) {
    const names = new Set(stats.policies.map((p) => p.name));
    for (const card of document.querySelectorAll('.card')) {
      if (!names.has(card.dataset.policy)) card.remove();
    }
    for (const p of stats.policies) {
      const card = chartCard(p.name);
      const points = state.series.get(p.name) || [];
      const last = points[points.length - 1] || { admitted: 0, denied: 0, shadow: 0 };
      card.querySelector('h3').textContent = `${p.name} (${p.action}, ${p.quota})`;
      let line =
        `${fmt(last.admitted)}/s admitted · ${fmt(last.denied)}/s denied · ${fmt(last.shadow)}/s shadow`;
      if (p.in_flight !== undefined) {
        line += ` · ${p.in_flight} in flight · ${p.slots_expired} taken back at lease_ttl`;
      }
      card.querySelector('.rates').textContent = line;
      draw(card.querySelector('canvas'), points, stats.time_ms);
    }
  }

  function fmt(x) {
    return x >= 100 ? Math.round(x).toString() : x.toFixed(1);
  }

  function draw(canvas, points, now) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 300;
    const height = canvas.clientHeight || 140;
    if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
    if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const left = 40;
    const bottom = height - 16;
    let max = 1;
    for (const p of points) max = Math.max(max, p.admitted, p.denied, p.shadow);
    max = niceCeiling(max);
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = '#667';
    ctx.strokeStyle = '#dde';
    ctx.lineWidth = 1;
    for (const f of [0, 0.5, 1]) {
      const y = bottom - f * (bottom - 8);
      ctx.beginPath();
      ctx.moveTo(left, y);
      ctx.lineTo(width - 4, y);
      ctx.stroke();
      ctx.fillText(fmt(max * f), 2, y + 4);
    }
    ctx.fillText(`${HISTORY_SECONDS} s`, left, height - 2);
    const x = (t) => left + (width - 4 - left) * (1 - (now - t) / (HISTORY_SECONDS * 1000));
    const y = (v) => bottom - (v / max) * (bottom - 8);
    for (const [field, colour] of [['admitted', '#1a7f37'], ['denied', '#cf222e'], ['shadow', '#bf8700']]) {
      ctx.strokeStyle = colour;
      ctx.lineWidth = 2;
      ctx.beginPath();
      points.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p[field])) : ctx.moveTo(x(p.t), y(p[field]))));
      ctx.stroke();
    }
    canvas.dataset.samples = String(points.length);
    canvas.dataset.max = String(max);
  }

  function niceCeiling(v) {
    const power = 10 ** Math.floor(Math.log10(v));
    for (const step of [1, 2, 5, 10]) if (v <= step * power) return step * power;
    return 10 * power;
  }

  function showStore(stats) {
    const s = stats.store;
    const parts = [`store: ${s.kind}`, s.ready ? 'ready' : 'unreachable'];
    if (s.keys_tracked !== null && s.keys_tracked !== undefined) parts.push(`${s.keys_tracked} keys`);
    if (s.redis) parts.push(`${s.redis.script_calls} calls, ${s.redis.errors} errors, ${s.redis.fallbacks} fallbacks`);
    if (!s.ready && s.error) parts.push(s.error);
    const el = $('store');
    el.textContent = parts.join(' · ');
    el.classList.toggle('bad', !s.ready);
  }

  // --- top keys ---------------------------------------------------------------------------

  async function refreshTop() {
    const policy = $('top-policy').value;
    if (!policy) return;
    const top = await api('GET', `/v1/top?policy=${encodeURIComponent(policy)}&n=20`);
    $('top-scope').textContent = top.scope;
    const requests = new Map(top.requests.keys.map((k) => [k.key, k]));
    const rows = top.denied.keys.map((k) => {
      const tr = make('tr');
      const seen = requests.get(k.key);
      const button = make('button', 'override', 'secondary');
      button.type = 'button';
      button.addEventListener('click', () => editOverride({ policy, key: k.key }));
      tr.append(
        make('td', k.key, 'key'),
        make('td', k.error ? `${k.count} ±${k.error}` : k.count),
        make('td', seen ? (seen.error ? `${seen.count} ±${seen.error}` : seen.count) : '—'),
        cell(button),
      );
      return tr;
    });
    $('top').tBodies[0].replaceChildren(...rows);
    $('top-note').textContent = rows.length
      ? `${top.denied.total} denied of ${top.requests.total} requests in the last ${top.window_seconds} s`
      : `no denials in the last ${top.window_seconds} s (${top.requests.total} requests)`;
  }

  function cell(child) {
    const td = make('td');
    td.append(child);
    return td;
  }

  // --- overrides --------------------------------------------------------------------------

  async function refreshOverrides() {
    const list = await api('GET', '/v1/overrides');
    $('override-scope').textContent = list.shared;
    const rows = list.overrides.map((o) => {
      const tr = make('tr');
      if (!o.active) tr.className = 'inactive';
      const edit = make('button', 'edit', 'secondary');
      edit.type = 'button';
      edit.addEventListener('click', () => editOverride(o));
      const remove = make('button', 'remove', 'danger');
      remove.type = 'button';
      remove.addEventListener('click', () => removeOverride(o));
      const actions = make('td');
      actions.append(edit, remove);
      tr.append(
        make('td', o.policy),
        make('td', o.key, 'key'),
        make('td', o.active ? o.quota : `inactive: ${o.inactive_reason}`),
        make('td', o.expires || 'never'),
        make('td', o.reason),
        actions,
      );
      return tr;
    });
    $('overrides').tBodies[0].replaceChildren(...rows);
  }

  function policyByName(name) {
    return state.policies.find((p) => p.name === name);
  }

  function showFields() {
    const policy = policyByName($('o-policy').value);
    const box = $('o-fields');
    box.replaceChildren();
    if (!policy) return;
    for (const [name, type] of FIELDS[policy.algorithm] || []) {
      const label = make('label', `${name} `);
      const input = make('input');
      input.id = `o-${name}`;
      input.name = name;
      input.type = type;
      if (type === 'number') input.min = name === 'queue' ? '0' : '1';
      input.placeholder = `policy: ${current(policy, name)}`;
      label.append(input);
      box.append(label);
    }
  }

  function current(policy, field) {
    const m = policy.quota.match(new RegExp(`${field}=(\\S+)`));
    return m ? m[1] : '';
  }

  function editOverride(o) {
    $('o-policy').value = o.policy;
    showFields();
    $('o-key').value = o.key;
    for (const field of ['limit', 'window', 'capacity', 'refill', 'rate', 'queue']) {
      const input = $(`o-${field}`);
      if (input) input.value = o[field] === undefined ? '' : o[field];
    }
    $('o-reason').value = o.reason || '';
    $('o-expires').value = o.expires || '';
    $('override-form').scrollIntoView({ block: 'nearest' });
    ($('o-limit') || $('o-capacity') || $('o-rate') || $('o-key')).focus();
  }

  function overridePath(policy, key) {
    return `/v1/overrides/${encodeURIComponent(policy)}/${encodeURIComponent(key)}`;
  }

  async function saveOverride(event) {
    event.preventDefault();
    const result = $('o-result');
    for (const el of document.querySelectorAll('#override-form .invalid')) el.classList.remove('invalid');
    const body = { reason: $('o-reason').value };
    if ($('o-expires').value.trim()) body.expires = $('o-expires').value.trim();
    for (const input of $('o-fields').querySelectorAll('input')) {
      if (input.value.trim() === '') continue;
      body[input.name] = input.type === 'number' ? Number(input.value) : input.value.trim();
    }
    try {
      const saved = await api('PUT', overridePath($('o-policy').value, $('o-key').value.trim()), body);
      result.textContent = `saved: ${saved.key} now has ${saved.quota}`;
      result.classList.remove('bad');
      await refreshOverrides();
    } catch (e) {
      result.textContent = e.message;
      result.classList.add('bad');
      const field = e.data && e.data.field && $(`o-${e.data.field}`);
      if (field) field.classList.add('invalid');
    }
  }

  async function removeOverride(o) {
    const reason = $('o-reason').value.trim();
    const query = reason ? `?reason=${encodeURIComponent(reason)}` : '';
    try {
      await api('DELETE', overridePath(o.policy, o.key) + query);
      $('o-result').textContent = `removed the override of ${o.key}`;
      await refreshOverrides();
    } catch (e) {
      $('o-result').textContent = e.message;
    }
  }

  // --- bans -------------------------------------------------------------------------------

  async function refreshBans() {
    const { bans } = await api('GET', '/v1/bans');
    const rows = bans.map((b) => {
      const lift = make('button', 'lift', 'danger');
      lift.type = 'button';
      lift.addEventListener('click', () => liftBan(b));
      const tr = make('tr');
      tr.append(
        make('td', b.policy),
        make('td', b.key, 'key'),
        make('td', b.since),
        make('td', b.until),
        make('td', b.denials),
        cell(lift),
      );
      return tr;
    });
    if (!rows.length) {
      const tr = make('tr');
      const td = make('td', 'no key is banned', 'note');
      td.colSpan = 6;
      tr.append(td);
      rows.push(tr);
    }
    $('bans').tBodies[0].replaceChildren(...rows);
  }

  async function liftBan(b) {
    const reason = $('b-reason').value.trim();
    const query = reason ? `?reason=${encodeURIComponent(reason)}` : '';
    const path = `/v1/bans/${encodeURIComponent(b.policy)}/${encodeURIComponent(b.key)}${query}`;
    try {
      await api('DELETE', path);
      $('b-result').textContent = `lifted the ban of ${b.key} under ${b.policy}`;
      $('b-result').classList.remove('bad');
      await refreshBans();
    } catch (e) {
      $('b-result').textContent = e.message;
      $('b-result').classList.add('bad');
    }
  }

  // --- policies and polling ---------------------------------------------------------------

  async function refreshPolicies() {
    const { policies } = await api('GET', '/v1/policies');
    state.policies = policies;
    for (const select of [$('top-policy'), $('o-policy')]) {
      const chosen = select.value;
      select.replaceChildren(...policies.map((p) => {
        const option = make('option', p.name);
        option.value = p.name;
        return option;
      }));
      if (policies.some((p) => p.name === chosen)) select.value = chosen;
    }
    if (!$('o-fields').children.length) showFields();
  }

  async function poll() {
    try {
      if (state.polls % 10 === 0 || !state.policies.length) await refreshPolicies();
      const stats = await api('GET', '/v1/stats');
      recordRates(stats);
      drawCharts(stats);
      showStore(stats);
      if (state.polls % 2 === 0) await refreshTop();
      if (state.polls % 3 === 0) await refreshOverrides();
      if (state.polls % 2 === 1) await refreshBans();
      state.polls += 1;
      status(`updated ${new Date(stats.time_ms).toLocaleTimeString()}`);
    } catch (e) {
      status(e.message, true);
    }
    setTimeout(poll, 1000);
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('token-form').addEventListener('submit', (event) => {
      event.preventDefault();
      state.token = $('token').value;
      sessionStorage.setItem('tollgate-token', state.token);
      $('login').hidden = true;
    });
    $('override-form').addEventListener('submit', saveOverride);
    $('o-policy').addEventListener('change', showFields);
    $('o-clear').addEventListener('click', () => {
      $('override-form').reset();
      showFields();
    });
    $('top-policy').addEventListener('change', () => refreshTop().catch((e) => status(e.message, true)));
    poll();
  });
})();
