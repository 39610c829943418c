// The jails view: every jail with state, root filesystem, age, live
// CPU/memory/disk/pids sparklines, network mode and agent, fed by one
// stats stream (GET /stats); create, stop, start, destroy, snapshot and
// branch from the page.
import {api, stream} from './api.js';
import {h, fill, clear, bytes, age, sparkline, toast} from './util.js';
import {ask, confirmAction} from './dialog.js';

const keep = 60; // samples per sparkline

export function rootfsOf(j) {
  const c = j.config || {};
  if (c.image) return typeof c.image === 'string' ? c.image : (c.image.ref || c.image.name || JSON.stringify(c.image));
  return c.isolation?.filesystem?.rootfs || 'host';
}

export function agentOf(j) {
  const a = j.config?.agent;
  if (!a) return '—';
  if (typeof a === 'string') return a;
  return [a.name, a.version, a.model ? '(' + a.model + ')' : ''].filter(Boolean).join(' ') || '—';
}

export function netOf(j) { return j.config?.isolation?.network?.mode || 'isolated'; }

// jailActions returns the lifecycle buttons for a jail.
export function jailActions(j, after) {
  const run = async (label, fn) => {
    try { await fn(); toast(label + ': ' + j.name); if (after) after(); } catch (e) { toast(label + ' ' + j.name + ': ' + e.message, 'error'); }
  };
  const running = j.status === 'running';
  return h('span', {class: 'actions'},
    h('button', {'data-action': 'start', disabled: running || j.status === 'starting', onclick: () => run('started', () => api('POST', `/jails/${j.id}/start`))}, 'Start'),
    h('button', {'data-action': 'stop', disabled: !running, onclick: () => run('stopped', () => api('POST', `/jails/${j.id}/stop`, {}))}, 'Stop'),
    h('button', {'data-action': 'snapshot', disabled: !running, onclick: () => snapshotJail(j)}, 'Snapshot'),
    h('button', {'data-action': 'branch', disabled: !running, onclick: () => branchJail(j)}, 'Branch'),
    h('button', {'data-action': 'destroy', class: 'danger', onclick: async () => {
      if (await confirmAction(`Destroy ${j.name}? Its disk, events and recordings go with it.`, 'Destroy')) {
        await run('destroyed', () => api('DELETE', `/jails/${j.id}`));
      }
    }}, 'Destroy'));
}

export async function snapshotJail(j) {
  const v = await ask(`Snapshot ${j.name}`, [
    {name: 'name', label: 'Name (optional)'},
    {name: 'mode', label: 'Mode', options: ['full', 'fs'], value: 'full'},
  ], 'Snapshot');
  if (!v) return null;
  try {
    const s = await api('POST', `/jails/${j.id}/snapshot`, {name: v.name || undefined, mode: v.mode});
    toast(`snapshot ${s.name} taken in ${Math.round(s.duration_ms)} ms`);
    return s;
  } catch (e) { toast('snapshot: ' + e.message, 'error'); return null; }
}

export async function branchJail(j) {
  const v = await ask(`Branch ${j.name}: snapshot it, then start jails from the snapshot`, [
    {name: 'count', label: 'Branches', type: 'number', value: '2', min: 1, max: 32},
    {name: 'mode', label: 'Snapshot mode', options: ['full', 'fs'], value: 'full'},
  ], 'Branch');
  if (!v) return;
  try {
    const s = await api('POST', `/jails/${j.id}/snapshot`, {mode: v.mode});
    const b = await api('POST', `/snapshots/${s.id}/branch`, {count: Number(v.count)});
    toast(`${b.jails.length} branches of ${j.name}: ${b.jails.map(x => x.name).join(', ')}`);
  } catch (e) { toast('branch: ' + e.message, 'error'); }
}

export async function createJail() {
  const v = await ask('Create a jail', [
    {name: 'name', label: 'Name', placeholder: 'optional'},
    {name: 'rootfs', label: 'Root filesystem', value: 'host', placeholder: 'host or dir:/path'},
    {name: 'network', label: 'Network', options: ['isolated', 'none', 'bridge'], value: 'isolated'},
    {name: 'memory', label: 'Memory (MiB)', type: 'number', value: '512', min: 16, max: 8192},
  ], 'Create');
  if (!v) return null;
  const body = {};
  if (v.name) body.name = v.name;
  const iso = {};
  if (v.rootfs && v.rootfs !== 'host') iso.filesystem = {rootfs: v.rootfs};
  if (v.network !== 'isolated') iso.network = {mode: v.network};
  if (Number(v.memory) !== 512) iso.resources = {memory_bytes: Number(v.memory) * 1024 * 1024};
  if (Object.keys(iso).length) body.isolation = iso;
  try {
    const j = await api('POST', '/jails', body);
    toast('created ' + j.name);
    return j;
  } catch (e) { toast('create: ' + e.message, 'error'); return null; }
}

export function mount(el) {
  const hist = new Map(); // id -> {cpu:[], mem:[], disk:[], pids:[], lastCPU, lastTS}
  const rows = new Map(); // id -> tr
  const tbody = h('tbody', {id: 'jail-rows'});
  const empty = h('p', {class: 'muted', id: 'no-jails', hidden: true}, 'No jails yet. Create one.');
  const count = h('span', {class: 'muted'});
  fill(el, 
    h('div', {class: 'row'}, h('h1', {}, 'Jails'), count, h('span', {class: 'spacer'}),
      h('button', {class: 'primary', id: 'create-jail', onclick: async () => {
        const j = await createJail();
        if (j) location.hash = '#/jails/' + encodeURIComponent(j.id);
      }}, 'Create jail')),
    h('table', {class: 'jails'},
      h('thead', {}, h('tr', {}, ['Name', 'State', 'Image / rootfs', 'Age', 'CPU', 'Memory', 'Disk', 'PIDs', 'Network', 'Agent', ''].map(t => h('th', {}, t)))),
      tbody),
    empty);

  function series(id) {
    let s = hist.get(id);
    if (!s) { s = {cpu: [], mem: [], disk: [], pids: []}; hist.set(id, s); }
    return s;
  }
  function push(a, v) { a.push(v); if (a.length > keep) a.shift(); }

  function metric(values, max, text, label) {
    return h('span', {class: 'metric'}, sparkline(values, max, label), text);
  }

  function onSample(sample) {
    const seen = new Set();
    for (const j of sample.jails) {
      seen.add(j.id);
      const s = series(j.id);
      const st = j.stats;
      let cpu = 0;
      if (st) {
        const t = Date.parse(sample.ts);
        if (s.lastCPU !== undefined && t > s.lastTS) cpu = Math.max(0, (st.cpu_time_ns - s.lastCPU) / ((t - s.lastTS) * 1e6) * 100);
        s.lastCPU = st.cpu_time_ns; s.lastTS = t;
        push(s.cpu, cpu); push(s.mem, st.memory_bytes); push(s.disk, st.disk_used_bytes); push(s.pids, st.pids);
      }
      const cells = [
        h('td', {}, h('a', {href: '#/jails/' + encodeURIComponent(j.id), class: 'jail-link'}, j.name)),
        h('td', {}, h('span', {class: 'status ' + j.status}, j.status), j.error ? h('div', {class: 'error wrap'}, j.error) : null),
        h('td', {class: 'mono'}, rootfsOf(j)),
        h('td', {title: j.created_at}, age(j.created_at)),
        h('td', {}, st ? metric(s.cpu, 5, cpu.toFixed(1) + ' %', 'CPU') : '—'),
        h('td', {title: st ? 'limit ' + bytes(st.memory_limit_bytes) : ''}, st ? metric(s.mem, 0, bytes(st.memory_bytes), 'memory') : '—'),
        h('td', {title: st ? 'limit ' + bytes(st.disk_limit_bytes) : ''}, st ? metric(s.disk, 0, bytes(st.disk_used_bytes), 'disk') : '—'),
        h('td', {title: st ? 'limit ' + st.pids_limit : ''}, st ? metric(s.pids, 0, String(st.pids), 'pids') : '—'),
        h('td', {}, netOf(j)),
        h('td', {}, agentOf(j)),
      ];
      let tr = rows.get(j.id);
      if (!tr) {
        tr = h('tr', {'data-jail': j.id, 'data-name': j.name});
        rows.set(j.id, tr);
      }
      // The actions are rebuilt only when the state changes, so a click is
      // never lost to a refresh.
      let actions = tr.lastChild;
      if (tr.dataset.status !== j.status || !actions) actions = h('td', {}, jailActions(j));
      tr.dataset.status = j.status;
      fill(tr, ...cells, actions);
      tbody.appendChild(tr); // keeps the stream's order (oldest first)
    }
    for (const [id, tr] of rows) {
      if (!seen.has(id)) { tr.remove(); rows.delete(id); hist.delete(id); }
    }
    empty.hidden = sample.jails.length > 0;
    count.textContent = sample.jails.length + ' jail' + (sample.jails.length === 1 ? '' : 's');
  }

  const live = document.getElementById('live');
  const es = stream('/stats?interval_ms=1000', {
    stats: onSample,
    open: () => live.classList.add('on'),
    error: () => live.classList.remove('on'),
  });
  return () => es.close();
}
