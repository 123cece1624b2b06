// tide dashboard + playground. Plain JS, same origin, no network beyond this daemon.
'use strict';
let apiKey = null;             // kept in page memory only
const KINDS = ['weights', 'kv', 'workspace', 'expert_cache', 'vision', 'free'];
const hist = [];               // {t, slots:[...], tps}
let lastTok = null, lastTokT = 0, lastVram = null, imageURL = null;
const $ = (id) => document.getElementById(id);

async function api(path, opts = {}) {
  for (;;) {
    const h = Object.assign({}, opts.headers || {}), sent = apiKey;
    if (apiKey) h['Authorization'] = 'Bearer ' + apiKey;
    const r = await fetch(path, Object.assign({}, opts, { headers: h }));
    if (r.status !== 401) return r;
    if (apiKey !== sent) continue; // another request asked meanwhile: ask once, not per request
    const k = window.prompt('This server needs an API key:');
    if (!k) return r;
    apiKey = k;
  }
}

function metric(text, name) {
  const m = text.match(new RegExp('^' + name + '(?:\\{[^}]*\\})? ([0-9.eE+-]+)$', 'm'));
  return m ? Number(m[1]) : null;
}

function renderLegend() {
  $('legend').innerHTML = KINDS.map(k => `<span><i class="k-${k}"></i>${k}</span>`).join('') +
    '<span><i style="border-left:3px dashed #c00"></i>reserve</span>';
}

function renderDevices(v) {
  const box = $('devices');
  v.devices.forEach((d, i) => {
    let el = $('dev' + i);
    if (!el) {
      el = document.createElement('div');
      el.id = 'dev' + i; el.className = 'dev';
      el.innerHTML = `<div class="title"></div><div class="bar"></div>
        <div class="controls">reserve MiB <input type="number" min="0" value="0" id="res${i}">
        <button id="setres${i}">Set reserve</button> <button id="restore${i}">Restore</button></div>`;
      box.appendChild(el);
      $('setres' + i).onclick = () => postReserve(i, Number($('res' + i).value));
      $('restore' + i).onclick = () => postReserve(i, null);
    }
    const tot = d.total_mib || 1;
    el.dataset.totalMib = d.total_mib; el.dataset.freeMib = d.free_mib;
    el.dataset.reserveMib = d.reserve_mib; el.dataset.slots = d.expert_slots;
    el.dataset.slotsFull = d.expert_slots_full;
    el.dataset.kvBytes = d.kv_bytes; el.dataset.kvType = d.kv_type;
    el.querySelector('.title').textContent =
      `device ${d.index} (${d.backend}) ${d.total_mib} MiB, free ${d.free_mib} MiB, reserve ${d.reserve_mib} MiB, ` +
      `expert slots ${d.expert_slots} / ${d.expert_slots_full}, KV ${(d.kv_bytes / 1048576).toFixed(1)} MiB ${d.kv_type}, ` +
      `layers ${d.layers ? d.layers.join('-') : ''}`;
    const bar = el.querySelector('.bar');
    bar.innerHTML = KINDS.map(k => {
      const mib = d[k + '_mib'] || 0;
      return `<span class="k-${k}" data-kind="${k}" data-mib="${mib}" title="${k} ${mib} MiB" style="width:${100 * mib / tot}%"></span>`;
    }).join('') + `<div class="reserve" title="reserve ${d.reserve_mib} MiB" style="left:${100 * (1 - d.reserve_mib / tot)}%;${d.reserve_mib ? '' : 'display:none'}"></div>`;
  });
  const vi = v.vision || {};
  let s = `vision: <b id="vision-state">${vi.state}</b>${vi.lazy ? ' (lazy)' : ''}`;
  if (vi.state === 'ready' && vi.last_image_s_ago != null && vi.idle_s != null)
    s += `, unloads in <span id="vision-countdown">${Math.max(0, Math.round(vi.idle_s - vi.last_image_s_ago))}</span> s`;
  $('vision').innerHTML = s;
  renderKV(v.sequences || {}, v.devices[0] ? v.devices[0].kv_type : '');
}

// The KV pool (GET /v1/vram "sequences"): a cell per slot, running ones first, then the idle
// ones keeping rows for a later prompt with the same prefix, then empty ones; rows in the text,
// and the pool's blocks by state.
function renderKV(sq, type) {
  const n = sq.slots ?? 0, run = sq.running ?? 0, cached = sq.cached ?? 0;
  const cell = (i) => i < run ? 'run' : i < run + cached ? 'cached' : 'empty';
  $('kv').innerHTML = `<div>KV pool (<span id="kv-type">${type}</span>, <span id="seq-slots">${n}</span> slots of ` +
    `<span id="kv-rows-per-slot">${sq.rows_per_slot ?? 0}</span> rows): <b id="seq-running">${run}</b> running ` +
    `holding <span id="seq-running-rows">${sq.running_rows ?? 0}</span> rows · <span id="seq-free">${sq.free ?? 0}</span> ` +
    `free, <span id="seq-cached">${cached}</span> of them keeping <span id="seq-cached-rows">${sq.cached_rows ?? 0}</span> ` +
    `rows of a reusable prefix · <span id="seq-parked">${sq.parked ?? 0}</span> conversations parked in host RAM ` +
    `(<span id="seq-parked-mib">${(sq.parked_mib ?? 0).toFixed(1)}</span> of ${sq.parked_budget_mib ?? 0} MiB)</div>` +
    `<div>${sq.paged ? 'paged' : 'one block a slot'}: <span id="kv-blocks">${sq.blocks ?? 0}</span> blocks of ` +
    `<span id="kv-block-rows">${sq.block_rows ?? 0}</span> rows · <span id="kv-blocks-running">${sq.blocks_running ?? 0}</span> ` +
    `running, <span id="kv-blocks-cached">${sq.blocks_cached ?? 0}</span> cached, <span id="kv-blocks-free">` +
    `${sq.blocks_free ?? 0}</span> free, <span id="kv-blocks-shared">${sq.blocks_shared ?? 0}</span> shared in place · ` +
    `<span id="seq-paused">${sq.paused ?? 0}</span> paused for blocks</div>` +
    `<div class="slots">${Array.from({ length: n }, (_, i) => `<span class="slot ${cell(i)}" title="slot: ${cell(i)}"></span>`).join('')}</div>`;
}

async function postReserve(i, mib) {
  const n = lastVram ? lastVram.devices.length : i + 1;
  const arr = [];
  for (let j = 0; j < n; j++) arr.push(j === i ? mib : (lastVram ? lastVram.devices[j].reserve_mib : 0));
  const r = await api('/v1/vram', { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                    body: JSON.stringify({ reserve_mib: arr }) });
  const j = await r.json().catch(() => null);
  $('status').textContent = r.ok ? `reserve: ${j && j.status}` : `reserve failed: ${r.status}`;
  if (r.ok && j && j.devices) { lastVram = j; renderDevices(j); }
}

function drawChart() {
  const c = $('chart'), g = c.getContext('2d'), W = c.width, H = c.height;
  g.clearRect(0, 0, W, H);
  if (hist.length < 2) return;
  // the window grows with the data from 30 s to 5 min, so a fresh page is not a sliver
  const t1 = hist[hist.length - 1].t, span = Math.min(300000, Math.max(30000, t1 - hist[0].t)), t0 = t1 - span;
  const x = t => (t - t0) / span * W;
  const colors = ['#2ca02c', '#1f77b4', '#ff7f0e', '#8c564b'];
  const maxS = Math.max(1, ...hist.flatMap(h => h.slots));
  const maxT = Math.max(1, ...hist.map(h => h.tps));
  const line = (f, max, col) => {
    g.strokeStyle = col; g.beginPath();
    hist.forEach((h, k) => { const y = H - 4 - (H - 8) * f(h) / max; k ? g.lineTo(x(h.t), y) : g.moveTo(x(h.t), y); });
    g.stroke();
  };
  hist[0].slots.forEach((_, i) => line(h => h.slots[i] || 0, maxS, colors[i % 4]));
  g.setLineDash([4, 3]); line(h => h.tps, maxT, '#d62728'); g.setLineDash([]);
  $('chart-legend').innerHTML = hist[0].slots.map((_, i) => `<span style="color:${colors[i % 4]}">slots dev ${i}</span>`).join(' ') +
    ` <span style="color:#d62728">tok/s (max ${maxT.toFixed(1)})</span> · last ${Math.round(span / 1000)} s (up to 5 min), slots max ${maxS}`;
}

// the daemon's last finished requests (GET /v1/requests), newest first
function renderRecent(j) {
  $('recent-body').innerHTML = j.requests.map(q =>
    `<tr><td>${new Date(q.time * 1000).toLocaleTimeString()}</td><td>${q.endpoint.replace('/v1/', '')}${q.stream ? ' (stream)' : ''}</td>` +
    `<td>${q.images}</td><td>${q.prompt_tokens}</td><td>${q.completion_tokens}</td><td>${q.latency_ms}</td><td>${q.status}</td></tr>`).join('');
}

async function poll() {
  try {
    const [rv, rm, rr] = await Promise.all([api('/v1/vram'), api('/metrics'), api('/v1/requests')]);
    if (rr.ok) renderRecent(await rr.json());
    const now = Date.now();
    let tps = 0;
    if (rm.ok) {
      const m = await rm.text();
      const tok = metric(m, 'tide_generation_tokens_total');
      if (tok != null && lastTok != null && now > lastTokT) tps = Math.max(0, (tok - lastTok) * 1000 / (now - lastTokT));
      lastTok = tok; lastTokT = now;
      $('queue').innerHTML = `queue: <span id="q-waiting">${metric(m, 'tide_requests_waiting')}</span> waiting, ` +
        `<span id="q-running">${metric(m, 'tide_requests_running')}</span> running, ${tps.toFixed(1)} tok/s`;
    }
    if (rv.ok) {
      const v = await rv.json();
      lastVram = v; renderDevices(v);
      hist.push({ t: now, slots: v.devices.map(d => d.expert_slots), tps });
      while (hist.length && hist[0].t < now - 300000) hist.shift();
      drawChart();
      $('status').dataset.ok = '1';
      if ($('status').textContent === 'connecting…') $('status').textContent = 'live';
    } else $('status').textContent = `/v1/vram: ${rv.status}`;
  } catch (e) { $('status').textContent = 'offline: ' + e.message; }
  setTimeout(poll, 1000);
}

function addMsg(role, text) {
  const d = document.createElement('div');
  d.className = 'msg ' + role; d.textContent = (role === 'user' ? 'you: ' : '') + text;
  $('log').appendChild(d); return d;
}

function setImage(file) {
  const rd = new FileReader();
  rd.onload = () => { imageURL = rd.result; $('imgname').textContent = ' ' + file.name; };
  rd.readAsDataURL(file);
}

async function send(ev) {
  ev.preventDefault();
  const text = $('prompt').value;
  if (!text && !imageURL) return;
  const content = imageURL ? [{ type: 'text', text }, { type: 'image_url', image_url: { url: imageURL } }] : text;
  addMsg('user', text + (imageURL ? ' [image]' : ''));
  const out = addMsg('assistant', ''); out.dataset.done = '0'; out.dataset.chunks = '0';
  const body = { messages: [{ role: 'user', content }], stream: true, stream_options: { include_usage: true },
                 temperature: Number($('temperature').value), max_tokens: Number($('max_tokens').value) };
  imageURL = null; $('imgname').textContent = ''; $('image').value = '';
  const t0 = performance.now(); let status = 'ok';
  $('send').disabled = true;
  try {
    const r = await api('/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
    if (!r.ok) { status = String(r.status); out.textContent = 'error ' + r.status + ': ' + await r.text(); }
    else {
      const rd = r.body.getReader(), dec = new TextDecoder(); let buf = '';
      for (;;) {
        const { value, done } = await rd.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i); buf = buf.slice(i + 2);
          for (const line of ev.split('\n')) {
            if (!line.startsWith('data:')) continue;
            const data = line.slice(5).trim();
            if (data === '[DONE]') continue;
            const j = JSON.parse(data);
            if (j.error) { status = 'error'; out.textContent += ' [error: ' + j.error.message + ']'; }
            const delta = j.choices && j.choices[0] && j.choices[0].delta;
            if (delta && delta.content) { out.textContent += delta.content; out.dataset.chunks = String(Number(out.dataset.chunks) + 1); }
          }
        }
      }
    }
  } catch (e) { status = 'error'; out.textContent += ' [' + e.message + ']'; }
  out.dataset.done = '1'; $('send').disabled = false;
  out.dataset.status = status; out.dataset.latencyMs = String(Math.round(performance.now() - t0));
}

renderLegend();
$('chat').onsubmit = send;
$('image').onchange = (e) => { if (e.target.files[0]) setImage(e.target.files[0]); };
const drop = $('drop');
drop.ondragover = (e) => { e.preventDefault(); drop.classList.add('over'); };
drop.ondragleave = () => drop.classList.remove('over');
drop.ondrop = (e) => { e.preventDefault(); drop.classList.remove('over'); if (e.dataTransfer.files[0]) setImage(e.dataTransfer.files[0]); };
poll();
