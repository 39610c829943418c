// The console's entry: the session, the router (#/ jails, #/jails/{id}/{tab},
// #/snapshots, #/recordings, #/recordings/{rid}) and the views.
import {loadSession, logout} from './api.js';
import * as jails from './jails.js';
import * as jail from './jail.js';
import * as snapshots from './snapshots.js';
import {mountAll as recordings, mountPlayer} from './recordings.js';

const view = document.getElementById('view');
let unmount = () => {};

function route() {
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  unmount();
  let nav = 'jails';
  if (parts[0] === 'jails' && parts[1]) unmount = jail.mount(view, parts[1], parts[2]);
  else if (parts[0] === 'snapshots') { nav = 'snapshots'; unmount = snapshots.mount(view); }
  else if (parts[0] === 'recordings' && parts[1]) { nav = 'recordings'; unmount = mountPlayer(view, parts[1]); }
  else if (parts[0] === 'recordings') { nav = 'recordings'; unmount = recordings(view) || (() => {}); }
  else unmount = jails.mount(view);
  for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === nav);
  document.body.dataset.view = parts[0] || 'jails';
}

(async () => {
  const session = await loadSession();
  // Who the session acts for: a key sees its tenant's jails only, and a
  // viewer's changes are refused by the API (403, shown as a toast).
  const who = session.whoami || {};
  document.body.dataset.role = who.role || '';
  document.getElementById('who').textContent = who.tenant ? `${who.tenant} · ${who.role}` : '';
  document.getElementById('logout').addEventListener('click', logout);
  // Moving between tabs of one jail keeps the page; other changes route.
  let last = '';
  window.addEventListener('hashchange', () => {
    const key = location.hash.split('/').slice(0, 3).join('/');
    if (key === last && location.hash.startsWith('#/jails/')) return;
    last = key;
    route();
  });
  last = location.hash.split('/').slice(0, 3).join('/');
  route();
  document.body.dataset.ready = 'true';
})();
