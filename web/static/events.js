// Event formatting and the jail's shared live feed.
import {stream} from './api.js';
import {clock} from './util.js';

// summary is one event as one line of text (what the search matches).
export function summary(e) {
  switch (e.type) {
    case 'syscall': {
      let s = `${e.name || 'nr' + e.nr}(`;
      if (e.path) s += JSON.stringify(e.path) + (e.path2 ? ', ' + JSON.stringify(e.path2) : '');
      else if (e.addr) s += e.addr;
      s += `) = ${e.ret}`;
      if (e.count > 1) s += ` ×${e.count}`;
      if (e.dur_ns) s += `  ${(e.dur_ns / 1000).toFixed(1)}µs`;
      return s;
    }
    case 'file':
      return `${e.op} ${e.path}${e.path2 ? ' → ' + e.path2 : ''}${e.bytes ? ' ' + e.bytes + ' B' : ''}`;
    case 'net':
      return `${e.op || e.dir} ${e.proto} ${e.src} → ${e.dst}${e.host ? ' (' + e.host + ')' : ''}` +
        `${e.verdict ? ' ' + e.verdict : ''}${e.rule ? ' rule ' + e.rule : ''}${e.method ? ' ' + e.method + ' ' + (e.path || '') : ''}` +
        `${e.status ? ' ' + e.status : ''}${e.bytes ? ' ' + e.bytes + ' B' : ''}`;
    case 'proc':
      if (e.op === 'exec' || e.op === 'restored') return `${e.op} ${(e.argv || []).join(' ')}`;
      if (e.op === 'exit') return `exit ${e.signal ? 'signal ' + e.signal : 'code ' + e.exit_code}`;
      return `${e.op} ppid ${e.ppid}`;
    case 'lost': return `${e.count} events lost (${e.source})`;
    case 'notice': return e.message || `skipped ${e.skipped} events`;
    default: return JSON.stringify(e);
  }
}

export function searchText(e) {
  if (e._s === undefined) e._s = (e.type + ' ' + (e.comm || '') + ' ' + (e.pid ?? '') + ' ' + summary(e)).toLowerCase();
  return e._s;
}

export function renderRow(e, row) {
  row.textContent = '';
  const t = document.createElement('span');
  t.className = 't';
  t.textContent = clock(e.ts);
  const ty = document.createElement('span');
  ty.className = 'ty ' + e.type;
  ty.textContent = e.type;
  const who = document.createElement('span');
  who.className = 't';
  who.textContent = e.comm !== undefined ? `${e.comm}[${e.pid}]` : '';
  row.append(t, ty, who, summary(e));
  row.title = JSON.stringify(e);
}

export const types = ['syscall', 'file', 'net', 'proc', 'lost'];

// Feed is the jail's one event stream (history, then live), shared by
// the page's tabs: each listener gets batches of events.
export class Feed {
  constructor(jailID, history) {
    this.listeners = new Set();
    this.events = [];
    this.cap = 400000;
    this.historyDone = false;
    this.historyCount = 0;
    this.pending = [];
    this.frame = 0;
    // When the stream opened and when its history was in (for the
    // time-to-interactive benchmark and the curious).
    this.t0 = performance.now();
    this.historyMs = 0;
    const handlers = {
      // The stored events come in batches, a JSON array each.
      history: (batch) => { for (const e of batch) this.pending.push(e); this.schedule(); },
      'history-end': (m) => {
        this.historyDone = true; this.historyCount = m.count; this.historyMs = performance.now() - this.t0;
        this.flush(); this.emit('history', m);
      },
      end: () => this.emit('end'),
    };
    for (const t of [...types, 'notice']) handlers[t] = (e) => this.add(e);
    this.es = stream(`/jails/${encodeURIComponent(jailID)}/events?history=${history}`, handlers);
  }

  add(e) {
    this.pending.push(e);
    this.schedule();
  }

  schedule() {
    if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
  }

  flush() {
    if (this.frame) { cancelAnimationFrame(this.frame); this.frame = 0; }
    if (!this.pending.length) return;
    const batch = this.pending;
    this.pending = [];
    for (const e of batch) this.events.push(e);
    if (this.events.length > this.cap) this.events.splice(0, this.events.length - this.cap);
    this.emit('events', batch);
  }

  on(fn) { this.listeners.add(fn); return () => this.listeners.delete(fn); }
  emit(kind, data) { for (const fn of this.listeners) fn(kind, data); }
  close() { this.es.close(); if (this.frame) cancelAnimationFrame(this.frame); }
}
