// page.mjs - what a person sees at GET /: the device bars carry the numbers /v1/vram reports,
// the KV pool beside them (running sequences, free and cached slots, rows, parked conversations)
// shows /v1/vram's numbers during a concurrent load and the cached rows after it,
// a chat message streams an answer in, a PNG picked in the file input gets an answer and both
// show in the recent-requests table (GET /v1/requests), a reserve
// set with the page's button shrinks the bar and the slot count, restore brings them back.
// The daemon has an API key: the page asks for it once. Usage: node page.mjs BASE_URL OUT_DIR KEY (run.sh starts the daemon). Screenshots go to OUT_DIR.
import { chromium } from 'playwright-core';
import assert from 'node:assert/strict';
import { isDeepStrictEqual } from 'node:util';

const [base, out, key] = process.argv.slice(2);
const auth = { headers: { Authorization: 'Bearer ' + key } };
const KINDS = ['weights', 'kv', 'workspace', 'expert_cache', 'vision'];
const vram = async () => (await fetch(base + '/v1/vram', auth)).json();
const t0 = Date.now();
const step = (s) => console.log(`  browser: ${s} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);

// The KV pool as the page shows it, and as a /v1/vram "sequences" object says it should be: the
// numbers, and a cell per slot (running, then cached, then empty).
const kvShown = (page) => page.evaluate(() => {
  const n = (id) => Number(document.getElementById(id).textContent);
  const cells = (k) => document.querySelectorAll('#kv .slot.' + k).length;
  return { running: n('seq-running'), slots: n('seq-slots'), free: n('seq-free'), cached: n('seq-cached'),
           running_rows: n('seq-running-rows'), cached_rows: n('seq-cached-rows'), parked: n('seq-parked'),
           parked_mib: n('seq-parked-mib'), cells: [cells('run'), cells('cached'), cells('empty')],
           blocks: [n('kv-blocks'), n('kv-block-rows'), n('kv-blocks-running'), n('kv-blocks-cached'),
                    n('kv-blocks-free'), n('kv-blocks-shared'), n('seq-paused')] };
});
const kvWanted = (sq) => ({ running: sq.running, slots: sq.slots, free: sq.free, cached: sq.cached,
  running_rows: sq.running_rows, cached_rows: sq.cached_rows, parked: sq.parked,
  parked_mib: Number(sq.parked_mib.toFixed(1)), cells: [sq.running, sq.cached, sq.slots - sq.running - sq.cached],
  blocks: [sq.blocks, sq.block_rows, sq.blocks_running, sq.blocks_cached, sq.blocks_free, sq.blocks_shared, sq.paused] });
// wait (up to ms) until the page shows sq; fail showing both when it does not
async function kvMatches(page, sq, ms) {
  const want = kvWanted(sq), until = Date.now() + ms;
  for (;;) {
    const got = await kvShown(page);
    if (isDeepStrictEqual(got, want)) return;
    if (Date.now() > until) assert.deepEqual(got, want, 'the KV pool on the page is not /v1/vram\'s');
    await page.waitForTimeout(50);
  }
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true,
  args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update',
         '--disable-sync', '--disable-default-apps', '--no-first-run', '--disable-dev-shm-usage'],
});
let page;
try {
  page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  // the daemon has an API key: the page asks for it once (a prompt) and keeps it in memory
  let asked = 0;
  page.on('dialog', async (d) => { asked++; await (d.type() === 'prompt' ? d.accept(key) : d.dismiss()); });
  // the page may reach nothing but this daemon
  const foreign = [];
  page.on('request', (r) => { if (!r.url().startsWith(base) && !r.url().startsWith('data:')) foreign.push(r.url()); });

  await page.goto(base + '/');
  await page.waitForSelector('#dev1 .bar span[data-kind=expert_cache]');
  const v = await vram();
  assert.equal(v.devices.length, 2);
  for (const d of v.devices) {
    const el = page.locator(`#dev${d.index}`);
    assert.equal(Number(await el.getAttribute('data-total-mib')), d.total_mib);
    assert.equal(Number(await el.getAttribute('data-slots')), d.expert_slots);
    assert.equal(Number(await el.getAttribute('data-slots-full')), d.expert_slots_full);
    const title = await el.locator('.title').textContent();
    assert.ok(title.includes(`expert slots ${d.expert_slots} / ${d.expert_slots_full}`), title);
    assert.ok(title.includes(`${d.total_mib} MiB`), title);
    assert.equal(Number(await el.getAttribute('data-kv-bytes')), d.kv_bytes);
    assert.equal(await el.getAttribute('data-kv-type'), d.kv_type);
    assert.ok(title.includes(`KV ${(d.kv_bytes / 1048576).toFixed(1)} MiB ${d.kv_type}`), title);
    for (const k of KINDS)
      assert.equal(Number(await el.locator(`.bar span[data-kind=${k}]`).getAttribute('data-mib')), d[k + '_mib'], `device ${d.index} ${k}`);
  }
  assert.equal(await page.locator('#vision-state').textContent(), v.vision.state);
  step(`device bars match /v1/vram (${v.devices.map(d => d.expert_slots + '/' + d.expert_slots_full + ' slots').join(', ')})`);

  // a chat message: the answer arrives as SSE deltas assembled into the log
  await page.fill('#prompt', 'Count with me: one two');
  await page.fill('#temperature', '0');
  await page.fill('#max_tokens', '24');
  await page.click('#send');
  const a1 = page.locator('.msg.assistant').nth(0);
  await page.waitForSelector('.msg.assistant[data-done="1"]');
  const txt1 = await a1.textContent();
  assert.ok(txt1.trim().length > 0, 'no streamed text');
  assert.ok(!/error/i.test(txt1), txt1);
  assert.ok(Number(await a1.getAttribute('data-chunks')) >= 2, 'answer did not come as a stream of deltas');
  step(`chat streamed ${await a1.getAttribute('data-chunks')} deltas: ${JSON.stringify(txt1.slice(0, 40))}`);

  // a PNG (drawn by the browser itself) picked in the file input
  const png = Buffer.from((await page.evaluate(() => {
    const c = document.createElement('canvas'); c.width = c.height = 32;
    const g = c.getContext('2d'); g.fillStyle = '#e22'; g.fillRect(0, 0, 32, 32);
    g.fillStyle = '#22e'; g.fillRect(8, 8, 16, 16); return c.toDataURL('image/png');
  })).split(',')[1], 'base64');
  // dropped on the drop zone, it becomes the attachment (then the file input replaces it)
  const dropped = await page.evaluateHandle((b64) => {
    const bin = atob(b64), u = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
    const dt = new DataTransfer();
    dt.items.add(new File([u], 'dropped.png', { type: 'image/png' }));
    return dt;
  }, png.toString('base64'));
  await page.dispatchEvent('#drop', 'dragover', { dataTransfer: dropped });
  await page.dispatchEvent('#drop', 'drop', { dataTransfer: dropped });
  await page.waitForFunction(() => document.getElementById('imgname').textContent.includes('dropped.png'));
  step('drag and drop: dropped.png attached');
  await page.setInputFiles('#image', { name: 'square.png', mimeType: 'image/png', buffer: png });
  await page.waitForFunction(() => document.getElementById('imgname').textContent.includes('square.png'));
  await page.fill('#prompt', 'What is in this picture?');
  await page.click('#send');
  await page.waitForSelector('.msg.assistant:nth-of-type(4)[data-done="1"]', { timeout: 60000 });
  const txt2 = await page.locator('.msg.assistant').nth(1).textContent();
  assert.ok(txt2.trim().length > 0 && !/error/i.test(txt2), 'image answer: ' + txt2);
  // the daemon's list of recent requests (GET /v1/requests), newest first, in the table
  await page.waitForFunction(() => document.querySelectorAll('#recent-body tr').length === 2);
  const rq = (await (await fetch(base + '/v1/requests', auth)).json()).requests;
  assert.equal(rq.length, 2);
  assert.equal(rq[0].images, 1); assert.equal(rq[1].images, 0);
  const usage = await page.locator('#recent-body tr').first().locator('td').allTextContents();
  assert.deepEqual(usage.slice(1).map(String), ['chat/completions (stream)', '1', String(rq[0].prompt_tokens),
    String(rq[0].completion_tokens), String(rq[0].latency_ms), '200'], 'recent row: ' + usage);
  assert.ok(rq[0].prompt_tokens > rq[1].prompt_tokens && rq[0].completion_tokens > 0);
  await page.waitForFunction(() => document.getElementById('vision-state').textContent === 'ready');
  await page.waitForSelector('#vision-countdown');
  step(`image answered (${rq[0].prompt_tokens} prompt tokens, ${rq[0].latency_ms} ms), vision ready, unloads in ${await page.locator('#vision-countdown').textContent()} s`);
  await page.waitForTimeout(1500); // a few points in the time series
  assert.ok(await page.evaluate(() => {
    const c = document.getElementById('chart');
    return c.getContext('2d').getImageData(0, 0, c.width, c.height).data.some((x, i) => i % 4 === 3 && x > 0);
  }), 'the time series is blank');
  // The KV pool beside the bars. During a load of concurrent streams the page shows the /v1/vram
  // body its own poll fetched (taken from the page's traffic): several running, their rows.
  assert.equal(await page.locator('#kv-type').textContent(), v.devices[0].kv_type);
  assert.equal(Number(await page.locator('#kv-rows-per-slot').textContent()), v.sequences.rows_per_slot);
  const load = [0, 1, 2].map((i) => fetch(base + '/v1/chat/completions', {
    method: 'POST', headers: { ...auth.headers, 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: `stream ${i}` }], max_tokens: 300, temperature: 0, stream: true }),
  }).then((r) => r.text()));
  let during = null;
  for (let polls = 0; polls < 20 && !(during && during.running >= 2 && during.running_rows > 0); polls++) {
    const resp = await page.waitForResponse((r) => r.url() === base + '/v1/vram' && r.request().method() === 'GET');
    during = (await resp.json()).sequences;
    await kvMatches(page, during, 3000);
  }
  assert.ok(during.running >= 2 && during.running_rows > 0, 'no poll saw the streams run: ' + JSON.stringify(during));
  assert.ok(during.paged && during.blocks_running > 0 && during.blocks_running + during.blocks_cached + during.blocks_free === during.blocks,
            'the paged pool during the load: ' + JSON.stringify(during));
  await page.screenshot({ path: `${out}/kv-load.png` });
  await Promise.all(load);
  step(`page showed ${during.running} sequences running of ${during.slots} KV slots (${during.running_rows} rows), ` +
       `${during.free} free, ${during.cached} cached (${during.cached_rows} rows)`);
  // after the load: the slots are free and keep the streams' rows for reuse; parked conversations too
  const vp = (await vram()).sequences;
  assert.ok(vp.running === 0 && vp.cached >= Math.min(3, vp.slots) && vp.cached_rows > 0, 'after the load: ' + JSON.stringify(vp));
  await kvMatches(page, vp, 5000);
  step(`page shows ${vp.cached} cached slots keeping ${vp.cached_rows} rows, ${vp.parked} parked conversations (${vp.parked_mib} MiB)`);

  await page.screenshot({ path: `${out}/dashboard.png` });

  // a reserve on device 0 through the page's button (POST /v1/vram from the page's own Origin)
  const v0 = await vram(), d0 = v0.devices[0];
  const r = Math.floor(d0.free_mib + d0.expert_cache_mib / 2 + 1);
  await page.fill('#res0', String(r));
  await page.click('#setres0');
  await page.waitForFunction((r) => Number(document.getElementById('dev0').dataset.reserveMib) === r, r);
  const v1 = await vram();
  const dev0 = page.locator('#dev0');
  assert.ok(v1.devices[0].expert_slots < d0.expert_slots, 'slots did not drop');
  assert.equal(Number(await dev0.getAttribute('data-slots')), v1.devices[0].expert_slots);
  assert.equal(Number(await dev0.locator('.bar span[data-kind=expert_cache]').getAttribute('data-mib')), v1.devices[0].expert_cache_mib);
  assert.ok(v1.devices[0].expert_cache_mib < d0.expert_cache_mib);
  assert.ok(await dev0.locator('.reserve').isVisible(), 'reserve marker not shown');
  assert.ok((await dev0.locator('.title').textContent()).includes(`expert slots ${v1.devices[0].expert_slots} / ${d0.expert_slots_full}`));
  assert.equal(v1.devices[1].reserve_mib, 0, 'device 1 was touched');
  step(`reserve ${r} MiB: slots ${d0.expert_slots} -> ${v1.devices[0].expert_slots}, cache ${d0.expert_cache_mib} -> ${v1.devices[0].expert_cache_mib} MiB`);
  await page.screenshot({ path: `${out}/reserve.png` });

  await page.click('#restore0');
  await page.waitForFunction((n) => Number(document.getElementById('dev0').dataset.slots) === n, d0.expert_slots_full);
  assert.equal(Number(await dev0.getAttribute('data-reserve-mib')), 0);
  assert.ok(!(await dev0.locator('.reserve').isVisible()), 'reserve marker still shown');
  assert.equal((await vram()).devices[0].expert_slots, d0.expert_slots_full);
  step('restore: slots back to full');
  await page.screenshot({ path: `${out}/restored.png` });
  assert.deepEqual(errors, [], 'page errors');
  assert.equal(asked, 1, 'the API key was not asked for exactly once');
  assert.equal(await page.evaluate(() => localStorage.length + sessionStorage.length + document.cookie.length), 0, 'the key was stored');
  assert.deepEqual(foreign, [], 'requests off this daemon');
  console.log(`ok browser: dashboard, API key asked once, streamed chat, image, recent requests, reserve and restore in chromium (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
} catch (e) {
  if (page) await page.screenshot({ path: `${out}/failure.png` }).catch(() => {});
  console.error('FAIL browser:', e.message);
  process.exitCode = 1;
} finally {
  await browser.close();
}
