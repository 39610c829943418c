// The E2B SDK's network options, driven with the official SDK, unchanged,
// against an agentjail daemon that enforces them with its network policy.
//
// test/integration's TestE2BNetwork starts the daemon with a hosts file in
// which allowed.test and other.test name a test server at AJ_TEST_INET
// (HTTP on port 80, a TCP echo on port 7, in a network namespace of the
// test's own), and runs `node --test` on this file with the E2B_*
// variables of compat.test.mjs and AJ_TEST_SECRET, a header value only the
// daemon may add. The steps run in order.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { Sandbox, SandboxError, SandboxNotFoundError, ALL_TRAFFIC } from 'e2b'

const inet = process.env.AJ_TEST_INET
const secret = process.env.AJ_TEST_SECRET
const opts = { timeoutMs: 300_000 }
const made = []

after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})

async function create(o) {
  const s = await Sandbox.create('base', { ...opts, ...o })
  made.push(s)
  return s
}

// get fetches url in the sandbox (through the daemon's proxy, which every
// command's environment names): "STATUS CURL-EXIT".
const OK = '200 0'
const REFUSED = '403 0'
async function get(s, url) {
  const r = await s.commands.run(`curl -s -m 8 -o /dev/null -w '%{http_code}' ${url}; echo " $?"`)
  return r.stdout.trim()
}

// echo connects straight to the test server's TCP echo (no proxy).
async function echo(s) {
  const py = `import socket
s = socket.socket(); s.settimeout(5)
try:
    s.connect(("${inet}", 7)); s.sendall(b"ping"); print(s.recv(4).decode())
except OSError:
    print("refused")`
  const r = await s.commands.run(`python3 -c '${py}'`)
  return r.stdout.trim()
}

// netEvents are the sandbox's network records (an agentjail extension).
async function netEvents(s) {
  const r = await fetch(`${process.env.E2B_API_URL}/sandboxes/${s.sandboxId}/events?type=net&follow=false`,
    { headers: { 'X-API-KEY': process.env.E2B_API_KEY } })
  assert.equal(r.status, 200)
  return (await r.text()).trim().split('\n').filter(Boolean).map((l) => JSON.parse(l))
}

// byHost sends a GET for path to the daemon with Host host, as a browser
// that resolves the sandbox host names to the daemon would: [status, body].
function byHost(host, path, headers = {}) {
  const daemon = new URL(process.env.E2B_API_URL)
  return new Promise((resolve, reject) => {
    const req = http.get({ host: daemon.hostname, port: daemon.port, path, headers: { ...headers, Host: host } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => { body += c })
      res.on('end', () => resolve([res.statusCode, body]))
    })
    req.on('error', reject)
    req.setTimeout(15000, () => req.destroy(new Error('no answer within 15 s')))
  })
}

// serve starts a web server on port 8000 of s serving a file, and waits
// until it answers through host.
async function serve(s, host, headers) {
  await s.files.write('/tmp/www/hello.txt', `hello from ${s.sandboxId}`)
  await s.commands.run('cd /tmp/www && exec python3 -m http.server 8000 --bind 127.0.0.1', { background: true })
  const end = Date.now() + 20000
  for (;;) {
    const [status] = await byHost(host, '/hello.txt', headers)
    if (status === 200) return
    if (Date.now() > end) assert.fail(`the server in ${s.sandboxId} did not answer through ${host}: ${status}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

let open, listed, none

test('allowInternetAccess: every name and address, the protected ones still refused', async () => {
  open = await create({ allowInternetAccess: true })
  assert.equal(await get(open, 'http://allowed.test/'), OK)
  assert.equal(await get(open, 'http://other.test/'), OK)
  assert.equal(await echo(open), 'ping')
  // The host's loopback stands for every protected address (cloud
  // metadata among them, which a test must never reach).
  assert.equal(await get(open, 'http://127.0.0.2/protected'), REFUSED)
  assert.ok((await netEvents(open)).some((e) => e.path === '/protected' && e.verdict === 'block' && e.rule === 'protected:127.0.0.0/8'),
    'the request is refused as protected')
  assert.equal((await open.getInfo()).allowInternetAccess, true)
})

test('a sandbox made from a snapshot has the network its create asks for, not the snapshot\'s', async () => {
  const snap = await open.createSnapshot()
  try {
    const fromSnap = await Sandbox.create(snap.snapshotId, opts)
    made.push(fromSnap)
    assert.equal(await get(fromSnap, 'http://allowed.test/'), REFUSED)
    assert.equal((await fromSnap.getInfo()).allowInternetAccess, false)
    const listedSnap = await Sandbox.create(snap.snapshotId, { ...opts, network: { denyOut: [ALL_TRAFFIC], allowOut: ['other.test'] } })
    made.push(listedSnap)
    assert.equal(await get(listedSnap, 'http://other.test/'), OK)
    assert.equal(await get(listedSnap, 'http://allowed.test/'), REFUSED)
  } finally {
    await Sandbox.deleteSnapshot(snap.snapshotId)
  }
})

test('no option: the daemon default, no egress', async () => {
  none = await create({})
  assert.equal(await get(none, 'http://allowed.test/'), REFUSED)
  assert.equal(await echo(none), 'refused')
  assert.equal((await none.getInfo()).allowInternetAccess, false)
})

test('allowOut beats denyOut ALL_TRAFFIC; rules add headers the sandbox never sees', async () => {
  listed = await create({
    network: {
      denyOut: [ALL_TRAFFIC],
      allowOut: ['allowed.test'],
      rules: { 'allowed.test': [{ transform: { headers: { 'X-Injected': secret } } }] },
      maskRequestHost: 'app-${PORT}.sandbox.test',
    },
  })
  assert.equal(await get(listed, 'http://allowed.test/injected'), OK)
  assert.equal(await get(listed, 'http://other.test/'), REFUSED)
  assert.equal(await echo(listed), 'refused')
  const env = await listed.commands.run('env')
  assert.ok(!env.stdout.includes(secret), 'the header value is not in the sandbox')
  const info = await listed.getInfo()
  assert.equal(info.allowInternetAccess, false)
  assert.deepEqual(info.network.allowOut, ['allowed.test'])
  assert.deepEqual(info.network.denyOut, [ALL_TRAFFIC])
  assert.equal(info.network.maskRequestHost, 'app-${PORT}.sandbox.test')
  assert.deepEqual(info.network.rules, { 'allowed.test': [{ transform: { headers: { 'X-Injected': '<redacted>' } } }] })
  const evs = await netEvents(listed)
  assert.ok(evs.some((e) => e.host === 'other.test' && e.verdict === 'block'), 'the refusal is recorded')
  assert.ok(evs.some((e) => e.host === 'allowed.test' && e.verdict === 'allow' && e.rule === 'always_allow:allowed.test'),
    'the allowed request is recorded with its rule')
})

test('updateNetwork replaces the egress options of a running sandbox at once', async () => {
  await listed.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: ['other.test'] })
  assert.equal(await get(listed, 'http://other.test/'), OK)
  assert.equal(await get(listed, 'http://allowed.test/'), REFUSED)
  // What an update leaves out is cleared: back to no egress.
  await listed.updateNetwork({})
  assert.equal(await get(listed, 'http://other.test/'), REFUSED)
  await listed.updateNetwork({ allowInternetAccess: true })
  assert.equal(await get(listed, 'http://allowed.test/'), OK)
  assert.equal(await echo(listed), 'ping')
  const info = await listed.getInfo()
  assert.equal(info.allowInternetAccess, true)
  assert.equal(info.network.maskRequestHost, 'app-${PORT}.sandbox.test', 'an update keeps the public-URL options')
  // A sandbox made without options allows direct connections once updated.
  await none.updateNetwork({ allowOut: [inet] })
  assert.equal(await echo(none), 'ping')
})

test('getHost: the daemon answers the sandbox host names; a private sandbox needs its traffic token', async () => {
  const host = open.getHost(8000)
  assert.equal(host, `8000-${open.sandboxId}.sandbox.test`)
  await serve(open, host)
  assert.deepEqual(await byHost(host, '/hello.txt'), [200, `hello from ${open.sandboxId}`])
  // The sandbox plane answers its own host name (the SDK's sandbox URL
  // when E2B_SANDBOX_URL is not set).
  const envd = await byHost(open.getHost(49983), '/files?path=/tmp/www/hello.txt', { 'X-Access-Token': open.envdAccessToken })
  assert.deepEqual(envd, [200, `hello from ${open.sandboxId}`])
  assert.equal((await byHost(`8000-nosuchsandbox.sandbox.test`, '/'))[0], 502)

  const priv = await create({ network: { allowPublicTraffic: false } })
  assert.match(priv.trafficAccessToken, /^[0-9a-f]{48}$/)
  const ph = priv.getHost(8000)
  await serve(priv, ph, { 'E2b-Traffic-Access-Token': priv.trafficAccessToken })
  assert.equal((await byHost(ph, '/hello.txt'))[0], 403)
  assert.equal((await byHost(ph, '/hello.txt', { 'E2b-Traffic-Access-Token': open.envdAccessToken }))[0], 403)
  assert.equal((await priv.getInfo()).network.allowPublicTraffic, false)
})

test('options agentjail cannot honour, and bad entries, fail clearly', async () => {
  const fails = async (p, re) => {
    await assert.rejects(p, (e) => {
      assert.ok(e instanceof SandboxError, e)
      assert.match(e.message, re)
      return true
    })
  }
  await fails(Sandbox.create('base', { network: { denyOut: ['example.com'] } }), /400.*domains can only be allowed/)
  await fails(Sandbox.create('base', { network: { allowOut: ['bad host!'] } }), /400.*allowOut\[0\]/)
  await fails(Sandbox.create('base', { network: { egressProxy: { address: 'proxy.example.com:1080' } } }), /501.*egressProxy/)
  await fails(Sandbox.create('base', { network: { httpsPorts: [3000] } }), /501.*httpsPorts/)
  await fails(listed.updateNetwork({ denyOut: ['*.example.com'] }), /400/)
  // The failed update changed nothing.
  assert.equal(await get(listed, 'http://other.test/'), OK)
  const id = open.sandboxId
  await open.kill()
  await assert.rejects(Sandbox.updateNetwork(id, { allowOut: [inet] }), SandboxNotFoundError)
})
