// Recordings: the list of a jail's (or every jail's) terminal recordings,
// and one played with asciinema-player, with speed and seek.
import {api} from './api.js';
import {h, fill, clear, bytes, age} from './util.js';

function table(list) {
  return h('table', {id: 'recording-rows'},
    h('thead', {}, h('tr', {}, ['recording', 'command', 'started', 'size', 'status'].map(x => h('th', {}, x)))),
    h('tbody', {}, list.map(r => h('tr', {'data-recording': r.id},
      h('td', {}, h('a', {href: '#/recordings/' + encodeURIComponent(r.id), class: 'mono'}, r.id)),
      h('td', {class: 'mono wrap'}, r.command || 'shell'),
      h('td', {}, age(r.started_at) + ' ago'),
      h('td', {}, bytes(r.size)),
      h('td', {}, r.status)))));
}

// recordingList fills el with one jail's recordings.
export function recordingList(el, jailID) {
  api('GET', `/jails/${jailID}/recordings`).then(({recordings}) => {
    el.append(recordings.length ? table(recordings) : h('p', {class: 'muted'}, 'No recordings yet: terminal sessions are recorded.'));
  }).catch(e => el.append(h('p', {class: 'error'}, e.message)));
}

// mountAll lists the recordings of every jail.
export function mountAll(el) {
  fill(el, h('h1', {}, 'Recordings'));
  (async () => {
    const {jails} = await api('GET', '/jails');
    const all = [];
    for (const j of jails) {
      try { all.push(...(await api('GET', `/jails/${j.id}/recordings`)).recordings); } catch (_) { /* gone */ }
    }
    all.sort((a, b) => Date.parse(b.started_at) - Date.parse(a.started_at));
    el.append(all.length ? table(all) : h('p', {class: 'muted'}, 'No recordings yet.'));
  })().catch(e => el.append(h('p', {class: 'error'}, e.message)));
}

// mountPlayer plays one recording.
export function mountPlayer(el, rid) {
  let player = null;
  const box = h('div', {class: 'player', id: 'player'});
  const speed = h('select', {id: 'player-speed'}, ['0.5', '1', '2', '4', '8'].map(s => h('option', {value: s, selected: s === '1'}, s + '×')));
  const seek = h('input', {type: 'range', id: 'player-seek', min: 0, max: 1000, value: 0, style: 'width: 320px'});
  const pos = h('span', {class: 'muted mono', id: 'player-time'}, '0.0 s');
  fill(el, 
    h('h1', {}, h('a', {href: '#/recordings'}, 'Recordings'), ' / ', h('span', {class: 'mono'}, rid)),
    h('div', {class: 'toolbar'},
      h('button', {id: 'player-play', onclick: () => player && player.play()}, 'Play'),
      h('button', {id: 'player-pause', onclick: () => player && player.pause()}, 'Pause'),
      h('label', {}, 'speed', speed), h('label', {}, 'seek', seek), pos,
      h('a', {href: '/api/recordings/' + encodeURIComponent(rid), download: rid + '.cast'}, 'download .cast')),
    box);
  function create(startAt, autoPlay) {
    if (player) player.dispose();
    clear(box);
    player = window.AsciinemaPlayer.create('/api/recordings/' + encodeURIComponent(rid), box,
      {speed: Number(speed.value), startAt, autoPlay, idleTimeLimit: 2, fit: 'width', terminalFontSize: '13px'});
    box.player = player;
  }
  speed.addEventListener('change', async () => {
    const at = player ? await player.getCurrentTime() : 0;
    create(at, true);
  });
  seek.addEventListener('change', async () => {
    const d = await player.getDuration();
    if (d) await player.seek(d * seek.value / 1000);
  });
  const tick = setInterval(async () => {
    if (!player) return;
    const [t, d] = [await player.getCurrentTime(), await player.getDuration()];
    if (t === undefined) return;
    pos.textContent = `${t.toFixed(1)} s` + (d ? ` / ${d.toFixed(1)} s` : '');
    box.dataset.time = t.toFixed(2);
    if (d && document.activeElement !== seek) seek.value = Math.round(1000 * t / d);
  }, 250);
  const start = () => create(0, false);
  if (window.AsciinemaPlayer) start(); else window.addEventListener('load', start, {once: true});
  return () => { clearInterval(tick); if (player) player.dispose(); };
}
