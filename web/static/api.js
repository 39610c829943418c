// The console's access to the daemon: the REST API under /api/ with the
// session cookie, and the CSRF token on every state-changing call.
let csrf = '';

// loadSession fetches the session's CSRF token; without a session it
// sends the browser to the login page.
export async function loadSession() {
  const r = await fetch('/console/session', {credentials: 'same-origin'});
  if (r.status === 401) { location.assign('/login'); throw new Error('not logged in'); }
  const s = await r.json();
  csrf = s.csrf_token;
  return s;
}

export class APIError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

// api calls the REST API: api('POST', '/jails', {name: 'x'}).
export async function api(method, path, body, opts) {
  const init = {method, credentials: 'same-origin', headers: {}};
  if (method !== 'GET' && method !== 'HEAD') init.headers['X-CSRF-Token'] = csrf;
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch('/api' + path, init);
  if (r.status === 401) { location.assign('/login'); throw new APIError(401, 'unauthorized', 'not logged in'); }
  if (!r.ok) {
    let code = 'error', message = r.status + ' ' + r.statusText;
    try { const e = await r.json(); code = e.error.code; message = e.error.message; } catch (_) { /* not JSON */ }
    throw new APIError(r.status, code, message);
  }
  if (opts && opts.raw) return r;
  if (r.status === 204) return null;
  const type = r.headers.get('Content-Type') || '';
  if (type.includes('ndjson')) {
    const text = await r.text();
    return text.split('\n').filter(l => l.trim()).map(l => JSON.parse(l));
  }
  return type.includes('json') ? r.json() : r.text();
}

// stream opens a Server-Sent Events stream of the API; handlers maps event
// names to functions of the parsed data. It returns the EventSource.
export function stream(path, handlers) {
  const es = new EventSource('/api' + path);
  for (const [name, fn] of Object.entries(handlers)) {
    if (name === 'error' || name === 'open') es.addEventListener(name, fn);
    else es.addEventListener(name, e => fn(JSON.parse(e.data), e));
  }
  return es;
}

export async function logout() {
  await fetch('/console/logout', {method: 'POST', credentials: 'same-origin', headers: {'X-CSRF-Token': csrf}});
  location.assign('/login');
}

// wsURL is the WebSocket address of an API path.
export function wsURL(path) {
  return (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/api' + path;
}
