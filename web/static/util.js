// DOM and formatting helpers. Everything that comes from a jail is put in
// the page as text (textContent), never as markup.

// h builds an element: h('div', {class: 'x', onclick: fn}, child, 'text').
export function h(tag, attrs, ...children) {
  const el = document.createElementNS(tag === 'svg' || tag === 'polyline' || tag === 'path' || tag === 'line'
    ? 'http://www.w3.org/2000/svg' : 'http://www.w3.org/1999/xhtml', tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// fill replaces an element's children (arrays are flattened; null,
// undefined and false are left out) and returns it.
export function fill(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

// clear empties an element and returns it.
export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function bytes(n) {
  if (n === undefined || n === null) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(n < 10 ? 1 : 0)) + ' ' + units[i];
}

export function age(iso) {
  if (!iso) return '—';
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return Math.floor(s) + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm';
  if (s < 86400) return Math.floor(s / 3600) + 'h' + String(Math.floor((s % 3600) / 60)).padStart(2, '0');
  return Math.floor(s / 86400) + 'd';
}

export function clock(ms) {
  const d = new Date(ms);
  return d.toLocaleTimeString(undefined, {hour12: false}) + '.' + String(d.getMilliseconds()).padStart(3, '0');
}

// sparkline draws values (latest last) as an SVG polyline: from 0 to top
// when top is given, else from the series' own lowest to highest value
// (a steady series is a line across the middle).
export function sparkline(values, top, label) {
  const w = 80, hgt = 20;
  const svg = h('svg', {class: 'spark', width: w, height: hgt, viewBox: `0 0 ${w} ${hgt}`, role: 'img', 'aria-label': label});
  if (values.length > 0) {
    const lo = top ? 0 : Math.min(...values), hi = top ? Math.max(top, ...values) : Math.max(...values);
    const span = hi - lo;
    const step = w / Math.max(values.length - 1, 1);
    const y = (v) => span > 0 ? hgt - 1 - ((v - lo) / span) * (hgt - 2) : hgt / 2;
    const pts = values.map((v, i) => `${(i * step).toFixed(1)},${y(v).toFixed(1)}`);
    svg.appendChild(h('polyline', {points: pts.join(' ')}));
  }
  return svg;
}

// debounce returns fn delayed until calls stop for ms.
export function debounce(fn, ms) {
  let t;
  return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); };
}

// toast shows a message for a few seconds.
export function toast(msg, kind) {
  const el = h('div', {class: 'toast ' + (kind || ''), role: 'status'}, msg);
  document.getElementById('toasts').appendChild(el);
  setTimeout(() => el.remove(), kind === 'error' ? 8000 : 4000);
}
