// The family tree: jails, the snapshots taken of them, the jails branched
// or restored from those, and so on; any two nodes can be diffed.
import {api, stream} from './api.js';
import {h, fill, clear, age, toast} from './util.js';
import {renderDiff, diffCounts} from './diff.js';
import {snapshotJail} from './jails.js';

export function mount(el) {
  const picked = []; // up to two node keys "jail:ID" / "snapshot:ID"
  const treeBox = h('div', {class: 'ftree', id: 'family-tree'});
  const diffBtn = h('button', {class: 'primary', id: 'diff-nodes', disabled: true, onclick: () => diff()}, 'Diff the two selected');
  const pickInfo = h('span', {class: 'muted', id: 'picked'}, 'select two nodes to diff them');
  const diffBox = h('div', {id: 'node-diff'});
  fill(el, h('h1', {}, 'Snapshots'), h('div', {class: 'toolbar'}, diffBtn, pickInfo), treeBox, diffBox);
  let jails = [], snaps = [], lastJailKey = '';

  async function loadSnaps() {
    snaps = (await api('GET', '/snapshots')).snapshots;
    draw();
  }

  function draw() {
    const nodes = new Map();
    const add = (key, n) => { if (!nodes.has(key)) nodes.set(key, {...n, key, children: []}); return nodes.get(key); };
    for (const j of jails) add('jail:' + j.id, {kind: 'jail', id: j.id, name: j.name, status: j.status, parent: j.parent, created: j.created_at});
    for (const s of snaps) {
      add('snapshot:' + s.id, {kind: 'snapshot', id: s.id, name: s.name, mode: s.mode, parent: s.parent, created: s.created_at});
      // A snapshot outlives its jail: the jail stays in the tree, marked.
      if (s.parent && s.parent.kind === 'jail') add('jail:' + s.parent.id, {kind: 'jail', id: s.parent.id, name: s.parent.name || s.jail_name, status: 'destroyed'});
    }
    const roots = [];
    for (const n of nodes.values()) {
      const pk = n.parent ? n.parent.kind + ':' + n.parent.id : '';
      if (pk && nodes.has(pk)) nodes.get(pk).children.push(n); else roots.push(n);
    }
    const byTime = (a, b) => (a.created || '').localeCompare(b.created || '');
    const li = (n) => h('li', {}, nodeEl(n), n.children.length ? h('ul', {}, n.children.sort(byTime).map(li)) : null);
    fill(treeBox, roots.length ? h('ul', {}, roots.sort(byTime).map(li)) : h('p', {class: 'muted'}, 'No jails or snapshots.'));
  }

  function nodeEl(n) {
    const sel = picked.includes(n.key);
    const el = h('span', {class: `node ${n.kind}${sel ? ' selected' : ''}`, 'data-node': n.key, 'data-name': n.name},
      h('input', {type: 'checkbox', checked: sel, 'aria-label': 'select ' + n.name, onchange: () => pick(n.key)}),
      h('span', {class: 'kindtag'}, n.kind === 'snapshot' ? `snapshot · ${n.mode}` : `jail · ${n.status}`),
      n.kind === 'jail' && n.status !== 'destroyed' ? h('a', {href: '#/jails/' + encodeURIComponent(n.id)}, n.name) : h('span', {}, n.name),
      n.created ? h('span', {class: 'muted'}, age(n.created)) : null,
      n.kind === 'snapshot' ? h('button', {class: 'branch', onclick: () => branch(n)}, 'Branch') : null,
      n.kind === 'jail' && n.status === 'running' ? h('button', {onclick: async () => { if (await snapshotJail({id: n.id, name: n.name})) loadSnaps(); }}, 'Snapshot') : null);
    return el;
  }

  function pick(key) {
    const i = picked.indexOf(key);
    if (i >= 0) picked.splice(i, 1); else { picked.push(key); if (picked.length > 2) picked.shift(); }
    diffBtn.disabled = picked.length !== 2;
    pickInfo.textContent = picked.length ? picked.map(k => k.split(':')[0] + ' ' + (treeBox.querySelector(`[data-node="${CSS.escape(k)}"]`)?.dataset.name || k)).join(' ↔ ') : 'select two nodes to diff them';
    draw();
  }

  async function branch(n) {
    try {
      const b = await api('POST', `/snapshots/${n.id}/branch`, {count: 1});
      toast(`branched ${n.name}: ${b.jails.map(j => j.name).join(', ')}`);
      jails = (await api('GET', '/jails')).jails;
      draw();
    } catch (e) { toast('branch: ' + e.message, 'error'); }
  }

  async function diff() {
    const [a, b] = picked.map(k => k.split(':')[1]);
    fill(diffBox, h('p', {class: 'muted'}, 'comparing…'));
    try {
      const d = await api('GET', `/diff?from=${encodeURIComponent(a)}&to=${encodeURIComponent(b)}&text=true`);
      const view = h('div', {});
      const rows = d.changes.map(c => h('tr', {'data-path': c.path, onclick: () => { fill(view, h('h2', {class: 'mono'}, c.path), renderDiff(c)); }},
        h('td', {class: 'kind ' + c.kind}, c.kind), h('td', {class: 'mono wrap'}, c.path)));
      fill(diffBox, h('h2', {}, diffCounts(d)),
        h('div', {class: 'split'}, h('div', {}, h('table', {class: 'list-click', id: 'node-diff-rows'}, h('tbody', {}, rows))), view));
    } catch (e) { fill(diffBox, h('p', {class: 'error'}, e.message)); }
  }

  const es = stream('/stats?interval_ms=2000', {stats: (s) => {
    jails = s.jails;
    const key = jails.map(j => j.id + j.status).join();
    if (key !== lastJailKey) { lastJailKey = key; loadSnaps().catch(e => toast(e.message, 'error')); }
  }});
  return () => es.close();
}
