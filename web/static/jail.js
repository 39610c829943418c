// One jail: its state and actions, and tabs for the live process tree, the
// event stream (virtualised, filtered, searchable), the files it changed
// with text diffs, the network log, the report, terminals, recordings and
// snapshots.
import {api, stream} from './api.js';
import {h, fill, clear, bytes, age, clock, debounce, toast} from './util.js';
import {jailActions, rootfsOf, netOf, agentOf} from './jails.js';
import {Feed, renderRow, searchText, summary, types} from './events.js';
import {VList} from './vlist.js';
import {renderDiff, diffCounts} from './diff.js';
import * as terminal from './terminal.js';
import {recordingList} from './recordings.js';

// history is how many stored events the page loads.
export const historySize = 100000;

const tabs = ['processes', 'events', 'files', 'network', 'report', 'terminal', 'recordings', 'snapshots'];

export function mount(el, id, tab) {
  tab = tabs.includes(tab) ? tab : 'processes';
  let jail = null;
  let feed = null;
  let unmountTab = () => {};
  const head = h('div', {class: 'row', id: 'jail-head'});
  const facts = h('dl', {class: 'kv', id: 'jail-facts'});
  const bar = h('div', {class: 'tabs', role: 'tablist'});
  const pane = h('div', {class: 'pane', id: 'tab-pane'});
  fill(el, head, facts, bar, pane);

  function drawHead() {
    fill(head, 
      h('h1', {}, h('a', {href: '#/'}, 'Jails'), ' / ', jail.name),
      h('span', {class: 'status ' + jail.status, id: 'jail-status'}, jail.status),
      h('span', {class: 'spacer'}),
      jailActions(jail, refresh));
    drawFacts();
  }

  // The facts follow every sample of the stats stream (age, usage).
  function drawFacts() {
    const st = jail.stats;
    fill(facts, 
      h('dt', {}, 'id'), h('dd', {class: 'mono'}, jail.id),
      h('dt', {}, 'image / rootfs'), h('dd', {class: 'mono'}, rootfsOf(jail)),
      h('dt', {}, 'network'), h('dd', {}, netOf(jail)),
      h('dt', {}, 'agent'), h('dd', {}, agentOf(jail)),
      h('dt', {}, 'age'), h('dd', {}, age(jail.created_at)),
      jail.parent ? [h('dt', {}, 'from'), h('dd', {}, `${jail.parent.kind} ${jail.parent.name || jail.parent.id}`)] : null,
      st ? [h('dt', {}, 'usage'), h('dd', {}, `${bytes(st.memory_bytes)} memory · ${(st.cpu_time_ns / 1e9).toFixed(2)} s CPU · ${st.pids} pids · ${bytes(st.disk_used_bytes)} disk`)] : null,
      jail.error ? [h('dt', {}, 'error'), h('dd', {class: 'error'}, jail.error)] : null);
  }

  async function refresh() {
    try {
      jail = await api('GET', `/jails/${encodeURIComponent(id)}`);
      drawHead();
    } catch (e) {
      fill(el, h('p', {class: 'error'}, e.message));
    }
  }

  // The jail's record follows the stats stream (state changes, usage).
  const live = document.getElementById('live');
  const statsES = stream('/stats?interval_ms=2000', {
    open: () => live.classList.add('on'),
    error: () => live.classList.remove('on'),
    stats: (s) => {
    const j = s.jails.find(x => x.id === id || x.name === id);
    if (!j) { if (jail) head.querySelector('#jail-status').textContent = 'destroyed'; return; }
    if (jail && (j.status !== jail.status)) { jail = j; drawHead(); } else if (jail) { jail = j; drawFacts(); }
  }});

  function select(t) {
    tab = t;
    for (const b of bar.children) b.classList.toggle('active', b.dataset.tab === t);
    unmountTab();
    clear(pane);
    const fn = {processes: processTab, events: eventsTab, files: filesTab, network: networkTab, report: reportTab,
      terminal: (p) => terminal.mount(p, jail), recordings: (p) => recordingList(p, jail.id), snapshots: snapshotsTab}[t];
    unmountTab = fn(pane) || (() => {});
    history.replaceState(null, '', `#/jails/${encodeURIComponent(id)}/${t}`);
  }

  (async () => {
    await refresh();
    if (!jail) return;
    feed = new Feed(jail.id, historySize);
    fill(bar, ...tabs.map(t => h('button', {role: 'tab', 'data-tab': t, id: 'tab-' + t, onclick: () => select(t)}, t[0].toUpperCase() + t.slice(1))));
    select(tab);
  })();

  // ---- processes
  function processTab(p) {
    const info = h('span', {class: 'muted', id: 'proc-count'});
    const box = h('div', {class: 'tree', id: 'proc-tree'});
    p.append(h('div', {class: 'toolbar'}, info), box);
    const procs = new Map(); // pid -> node
    let dirty = false;
    const fresh = new Set();
    function node(pid) {
      let n = procs.get(pid);
      if (!n) { n = {pid, ppid: 0, argv: [], comm: '', children: []}; procs.set(pid, n); }
      return n;
    }
    function load(list, ppid) {
      for (const pr of list || []) {
        const n = node(pr.pid);
        Object.assign(n, {ppid: ppid ?? pr.ppid, comm: pr.comm, argv: pr.argv || [], exe: pr.exe, exit_code: pr.exit_code, signal: pr.signal, exited: !!pr.exited_at});
        load(pr.children, pr.pid);
      }
    }
    function apply(e) {
      if (e.type !== 'proc') return;
      const n = node(e.pid);
      if (e.op === 'fork') {
        if (n.exited) { Object.assign(n, {argv: [], exe: '', exit_code: undefined, signal: undefined, exited: false}); }
        n.ppid = e.ppid; n.comm = e.comm; fresh.add(e.pid);
      } else if (e.op === 'exec' || e.op === 'restored') {
        n.argv = e.argv || []; n.exe = e.exe; n.comm = e.comm; if (!n.ppid) n.ppid = e.ppid; fresh.add(e.pid);
      } else if (e.op === 'exit') {
        n.exited = true; n.exit_code = e.exit_code; n.signal = e.signal;
      }
      dirty = true;
    }
    function draw() {
      dirty = false;
      const kids = new Map();
      const roots = [];
      for (const n of procs.values()) {
        if (n.ppid && procs.has(n.ppid) && n.ppid !== n.pid) {
          if (!kids.has(n.ppid)) kids.set(n.ppid, []);
          kids.get(n.ppid).push(n);
        } else roots.push(n);
      }
      const li = (n) => {
        const ex = n.exited ? (n.signal ? h('span', {class: 'exit bad'}, 'signal ' + n.signal) :
          h('span', {class: 'exit ' + (n.exit_code === 0 ? 'ok' : 'bad')}, 'exit ' + n.exit_code)) : null;
        const cls = 'proc ' + (n.exited ? 'exited' : 'running') + (fresh.has(n.pid) ? ' new' : '');
        const ch = (kids.get(n.pid) || []).sort((a, b) => a.pid - b.pid);
        return h('li', {}, h('span', {class: cls, 'data-pid': n.pid},
          h('span', {class: 'pid'}, n.pid), h('span', {class: 'argv'}, n.argv.length ? n.argv.join(' ') : `[${n.comm}]`), ex),
        ch.length ? h('ul', {}, ch.map(li)) : null);
      };
      fresh.clear();
      const running = [...procs.values()].filter(n => !n.exited).length;
      info.textContent = `${procs.size} processes, ${running} running`;
      fill(box, h('ul', {}, roots.sort((a, b) => a.pid - b.pid).map(li)));
    }
    let off = () => {};
    (async () => {
      try { load((await api('GET', `/jails/${jail.id}/processes`)).roots); } catch (e) { info.textContent = e.message; }
      for (const e of feed.events) apply(e);
      draw();
      off = feed.on((kind, batch) => {
        if (kind !== 'events') return;
        for (const e of batch) apply(e);
        if (dirty) draw();
      });
    })();
    return () => off();
  }

  // ---- events
  function eventsTab(p) {
    const on = new Set(types);
    const search = h('input', {type: 'search', id: 'event-search', placeholder: 'search events…', size: 30});
    const count = h('span', {class: 'muted', id: 'event-count'});
    const checks = types.map(t => h('label', {}, h('input', {type: 'checkbox', checked: true, 'data-type': t, onchange: (e) => {
      if (e.target.checked) on.add(t); else on.delete(t);
      rebuild();
    }}), t));
    const listEl = h('div', {id: 'event-list'});
    const detail = h('pre', {class: 'mono muted', id: 'event-detail', style: 'margin:6px 0 0; max-height: 120px; overflow:auto; white-space: pre-wrap'});
    p.append(h('div', {class: 'toolbar'}, ...checks, search, count), listEl, detail);
    const vl = new VList(listEl, {render: renderRow, onclick: (e) => { detail.textContent = JSON.stringify(e, (k, v) => k === '_s' ? undefined : v, 1); }});
    let view = [];
    const match = (e) => (on.has(e.type) || e.type === 'notice') && (!q || searchText(e).includes(q));
    let q = '';
    function rebuild() {
      view = feed.events.filter(match);
      vl.setItems(view);
      counter();
    }
    function counter() {
      count.textContent = `${view.length.toLocaleString()} of ${feed.events.length.toLocaleString()} events` + (feed.historyDone ? '' : ' (loading…)');
      listEl.dataset.count = view.length;
      listEl.dataset.loaded = feed.historyDone ? 'true' : 'false';
      listEl.dataset.historyMs = Math.round(feed.historyMs);
    }
    search.addEventListener('input', debounce(() => { q = search.value.trim().toLowerCase(); rebuild(); }, 150));
    rebuild();
    const off = feed.on((kind, batch) => {
      if (kind === 'events') {
        for (const e of batch) if (match(e)) view.push(e);
        vl.changed();
      }
      counter();
    });
    return off;
  }

  // ---- files
  function filesTab(p) {
    const tbody = h('tbody', {id: 'file-rows'});
    const view = h('div', {id: 'file-diff'}, h('p', {class: 'muted'}, 'Pick a file to see its diff.'));
    const info = h('span', {class: 'muted'});
    p.append(h('div', {class: 'toolbar'}, h('button', {id: 'files-refresh', onclick: () => load()}, 'Refresh'), info),
      h('div', {class: 'split'}, h('div', {}, h('table', {class: 'list-click'}, h('thead', {}, h('tr', {}, h('th', {}, 'change'), h('th', {}, 'path'), h('th', {}, 'size'))), tbody)), view));
    let text = null; // the diff with text, fetched when a file is opened
    let selected = '';
    async function load() {
      text = null;
      try {
        const d = await api('GET', `/jails/${jail.id}/fs/diff`);
        info.textContent = diffCounts(d);
        fill(tbody, ...d.changes.map(c => h('tr', {'data-path': c.path, class: c.path === selected ? 'selected' : '', onclick: () => open(c.path)},
          h('td', {class: 'kind ' + c.kind}, c.kind), h('td', {class: 'mono wrap'}, c.path + (c.type === 'dir' ? '/' : '')), h('td', {}, c.type === 'file' ? bytes(c.size) : c.type))));
        if (selected) open(selected);
      } catch (e) { info.textContent = e.message; }
    }
    async function open(path) {
      selected = path;
      for (const tr of tbody.children) tr.classList.toggle('selected', tr.dataset.path === path);
      try {
        if (!text) text = await api('GET', `/jails/${jail.id}/fs/diff?text=true`);
        const c = text.changes.find(x => x.path === path);
        fill(view, h('h2', {class: 'mono'}, path), c ? renderDiff(c) : h('p', {class: 'muted'}, 'no longer changed'));
      } catch (e) { fill(view, h('p', {class: 'error'}, e.message)); }
    }
    load();
    // Live: a file event reloads the list (at most every 2 s).
    const reload = debounce(load, 2000);
    return feed.on((kind, batch) => { if (kind === 'events' && batch.some(e => e.type === 'file')) reload(); });
  }

  // ---- network
  function networkTab(p) {
    const listEl = h('div', {id: 'net-list'});
    const info = h('span', {class: 'muted', id: 'net-count'});
    const onlyRefused = h('input', {type: 'checkbox', id: 'net-refused', onchange: () => rebuild()});
    p.append(h('div', {class: 'toolbar'}, h('label', {}, onlyRefused, 'refused only'), info), listEl);
    const render = (e, row) => {
      row.textContent = '';
      const t = h('span', {class: 't'}, clock(e.ts));
      const v = h('span', {class: 'verdict ' + (e.verdict || ''), style: 'display:inline-block;width:70px'}, e.verdict || e.op || e.dir || '');
      row.append(t, v, h('span', {}, `${e.host || e.dst} ${e.proto || ''}`), h('span', {class: 't', style: 'margin-left:10px'}, e.rule ? 'rule ' + e.rule : ''),
        h('span', {class: 't'}, summary(e)));
      row.title = JSON.stringify(e);
    };
    const vl = new VList(listEl, {render});
    let all = [], view = [], last = 0;
    const refused = (e) => /refus|block|den/.test(e.verdict || '');
    function rebuild() { view = onlyRefused.checked ? all.filter(refused) : all.slice(); vl.setItems(view); info.textContent = `${all.length} records, ${all.filter(refused).length} refused`; }
    function add(list) {
      for (const e of list) { if (e.type === 'net' && e.ts_ns > last) { all.push(e); last = e.ts_ns; } }
      rebuild();
    }
    let off = () => {};
    (async () => {
      try { add(await api('GET', `/jails/${jail.id}/network/log`)); } catch (e) { info.textContent = e.message; }
      add(feed.events);
      off = feed.on((kind, batch) => { if (kind === 'events') add(batch); });
    })();
    return () => off();
  }

  // ---- report
  function reportTab(p) {
    const box = h('div', {id: 'report'});
    p.append(h('div', {class: 'toolbar'}, h('button', {onclick: () => load()}, 'Refresh')), box);
    async function load() {
      try {
        const r = await api('GET', `/jails/${jail.id}/report`);
        const table = (head, rows) => h('table', {}, h('thead', {}, h('tr', {}, head.map(x => h('th', {}, x)))), h('tbody', {}, rows.map(r => h('tr', {}, r.map(c => h('td', {class: 'wrap'}, c))))));
        fill(box, 
          h('p', {class: 'muted'}, `generated ${new Date(r.generated_at).toLocaleString()} · tracing ${r.tracing} · ` +
            Object.entries(r.events || {}).map(([k, v]) => `${v} ${k}`).join(', ')),
          h('div', {class: 'grid2'},
            h('div', {}, h('h2', {}, 'Top syscalls'), table(['name', 'count', 'errors', 'time'], (r.syscalls || []).slice(0, 15).map(s => [s.name, s.count, s.errors, (s.total_ns / 1e6).toFixed(1) + ' ms']))),
            h('div', {}, h('h2', {}, 'Network'), table(['destination', 'conns', 'allowed', 'refused', 'out', 'in'], (r.network || []).slice(0, 15).map(n => [n.destination, n.connections, n.allowed, n.blocked, bytes(n.bytes_out), bytes(n.bytes_in)])))),
          h('h2', {}, 'Files'), table(['path', 'read', 'written', 'opens'], (r.files || []).slice(0, 25).map(f => [f.path, bytes(f.bytes_read), bytes(f.bytes_written), f.opens])),
          r.fs_diff ? h('p', {}, `Filesystem: ${diffCounts(r.fs_diff)}`) : null,
          h('p', {class: 'muted'}, `${r.processes?.total ?? 0} processes recorded`));
      } catch (e) { fill(box, h('p', {class: 'error'}, e.message)); }
    }
    load();
  }

  // ---- snapshots
  function snapshotsTab(p) {
    const tbody = h('tbody', {});
    p.append(h('div', {class: 'toolbar'}, h('a', {href: '#/snapshots'}, 'Family tree and diffs →')),
      h('table', {}, h('thead', {}, h('tr', {}, ['name', 'mode', 'taken', 'disk', ''].map(x => h('th', {}, x)))), tbody));
    async function load() {
      const list = (await api('GET', `/jails/${jail.id}/snapshots`)).snapshots;
      fill(tbody, ...list.map(s => h('tr', {'data-snapshot': s.id},
        h('td', {}, s.name), h('td', {}, s.mode), h('td', {}, age(s.created_at) + ' ago'), h('td', {}, bytes(s.disk_used_bytes)),
        h('td', {}, h('button', {onclick: async () => {
          try { const b = await api('POST', `/snapshots/${s.id}/branch`, {count: 1}); toast('branched: ' + b.jails[0].name); } catch (e) { toast(e.message, 'error'); }
        }}, 'Branch')))));
    }
    load().catch(e => p.append(h('p', {class: 'error'}, e.message)));
  }

  return () => { unmountTab(); statsES.close(); if (feed) feed.close(); };
}
