// The login page: trades the API token or an API key for a session cookie.
const form = document.getElementById('login');
const err = document.getElementById('login-error');
form.addEventListener('submit', async (e) => {
  e.preventDefault();
  err.hidden = true;
  const credential = document.getElementById('credential').value.trim();
  try {
    const r = await fetch('/console/login', {
      method: 'POST', credentials: 'same-origin',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({credential}),
    });
    if (r.ok) { location.assign('/'); return; }
    let msg = r.status + ' ' + r.statusText;
    try { msg = (await r.json()).error.message; } catch (_) { /* not JSON */ }
    err.textContent = msg;
  } catch (x) {
    err.textContent = String(x);
  }
  err.hidden = false;
});
