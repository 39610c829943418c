// The web terminal: xterm.js on WS /jails/{id}/terminal, a new session or
// one that runs (any number of viewers may attach to one session), resized
// with the page, and re-attached after a reload (the session id is kept in
// sessionStorage per jail).
import {Terminal} from './vendor/xterm.mjs';
import {FitAddon} from './vendor/addon-fit.mjs';
import {api, wsURL} from './api.js';
import {h, fill, clear, age, toast} from './util.js';

const key = (jail) => 'agentjail.terminal.' + jail;

export function mount(el, jail) {
  let conn = null;
  const status = h('span', {class: 'term-status', id: 'term-status'}, 'not attached');
  const sessions = h('select', {id: 'term-sessions'});
  const wrap = h('div', {class: 'term-wrap', id: 'terminal'});
  fill(el, 
    h('div', {class: 'toolbar'},
      h('button', {class: 'primary', id: 'term-new', onclick: () => attach(null)}, 'New session'),
      sessions,
      h('button', {id: 'term-attach', onclick: () => sessions.value && attach(sessions.value)}, 'Attach'),
      h('button', {id: 'term-detach', onclick: () => { sessionStorage.removeItem(key(jail.id)); close(); }}, 'Detach'),
      status),
    wrap);

  const term = new Terminal({cursorBlink: true, fontFamily: 'ui-monospace, Menlo, Consolas, monospace', fontSize: 13,
    scrollback: 5000, theme: {background: '#000000'}});
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(wrap);
  fit.fit();
  // Tests and people read the screen through this.
  wrap.terminal = term;

  const enc = new TextEncoder();
  term.onData((d) => { if (conn && conn.readyState === WebSocket.OPEN) conn.send(enc.encode(d)); });
  term.onResize(({cols, rows}) => {
    if (conn && conn.readyState === WebSocket.OPEN) conn.send(JSON.stringify({type: 'resize', cols, rows}));
  });
  const ro = new ResizeObserver(() => { try { fit.fit(); } catch (_) { /* hidden */ } });
  ro.observe(wrap);

  async function listSessions() {
    let list = [];
    try { list = (await api('GET', `/jails/${jail.id}/terminals`)).terminals; } catch (_) { /* jail not running */ }
    fill(sessions, h('option', {value: ''}, list.length ? 'running sessions…' : 'no running sessions'),
      ...list.map(s => h('option', {value: s.id}, `${s.id} · ${(s.cmd && s.cmd.length ? s.cmd.join(' ') : 'shell')} · ${s.attached} attached · ${age(s.started_at)}`)));
    return list;
  }

  function close() {
    if (conn) { conn.onclose = null; conn.close(); conn = null; }
    status.textContent = 'not attached';
  }

  function attach(session) {
    close();
    term.reset();
    const q = new URLSearchParams({cols: term.cols, rows: term.rows});
    if (session) q.set('session', session);
    const ws = new WebSocket(wsURL(`/jails/${jail.id}/terminal?${q}`));
    ws.binaryType = 'arraybuffer';
    conn = ws;
    status.textContent = 'connecting…';
    ws.onmessage = (e) => {
      if (typeof e.data !== 'string') { term.write(new Uint8Array(e.data)); return; }
      const m = JSON.parse(e.data);
      if (m.type === 'session') {
        sessionStorage.setItem(key(jail.id), m.id);
        status.textContent = `session ${m.id} · ${m.session.attached} attached` + (m.session.recording_id ? ' · recorded' : '');
        wrap.dataset.session = m.id;
        term.focus();
        listSessions();
      } else if (m.type === 'exit') {
        status.textContent = `exited (${m.signal || 'code ' + m.code})`;
        sessionStorage.removeItem(key(jail.id));
      } else if (m.type === 'error') {
        toast('terminal: ' + m.error.message, 'error');
      }
    };
    ws.onclose = (e) => {
      if (conn !== ws) return;
      conn = null;
      if (e.code < 4000) status.textContent = `disconnected (${e.code}${e.reason ? ': ' + e.reason : ''})`;
    };
  }

  (async () => {
    const list = await listSessions();
    const saved = sessionStorage.getItem(key(jail.id));
    if (saved && list.some(s => s.id === saved)) attach(saved);
    else if (jail.status !== 'running') status.textContent = 'the jail is not running';
    else if (list.length) status.textContent = 'attach to a running session, or start a new one';
    else attach(null);
  })();

  return () => { close(); ro.disconnect(); term.dispose(); };
}
