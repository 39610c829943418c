// The E2B wire contract's acceptance scenario (docs/e2b.md), driven with the
// official e2b SDK, unchanged, against an agentjail daemon.
//
// test/integration's TestE2BSDK starts the daemon, issues a key and runs
// `node --test` on this file with:
//   E2B_API_KEY      a key the daemon issued
//   E2B_API_URL      http://127.0.0.1:PORT/e2b
//   E2B_SANDBOX_URL  http://127.0.0.1:PORT/e2b/envd
// The steps share one sandbox and run in order.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  Sandbox, CommandExitError, TimeoutError, InvalidArgumentError, FileNotFoundError,
  SandboxNotFoundError, AuthenticationError, NotFoundError, SandboxError, FileType,
} from 'e2b'

const meta = { suite: 'e2b-compat', run: String(process.pid) }
let sbx
let dir

// until polls cond (an async predicate) every 50 ms for at most ms.
async function until(what, cond, ms = 10000) {
  const end = Date.now() + ms
  for (;;) {
    if (await cond()) return
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

// within fails when p takes longer than ms: nothing may hang.
function within(p, ms = 15000) {
  let t
  return Promise.race([p, new Promise((_, rej) => { t = setTimeout(() => rej(new Error(`no answer within ${ms} ms`)), ms) })])
    .finally(() => clearTimeout(t))
}

test('create with a template, timeout, metadata and envs', async () => {
  sbx = await Sandbox.create('base', { timeoutMs: 120_000, metadata: meta, envs: { FROM_CREATE: 'create', OVER: 'create' } })
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
  dir = `/tmp/e2b-compat-${sbx.sandboxId}`
  const r = await sbx.commands.run(`mkdir -p ${dir} && echo $FROM_CREATE $OVER`, { envs: { OVER: 'cmd' } })
  assert.equal(r.stdout, 'create cmd\n')
})

test('commands, buffered', async () => {
  const hi = await sbx.commands.run('echo hi')
  assert.equal(hi.exitCode, 0)
  assert.equal(hi.stdout, 'hi\n')
  assert.equal(hi.stderr, '')
  await assert.rejects(sbx.commands.run('echo out; echo err 1>&2; exit 3'), (e) => {
    assert.ok(e instanceof CommandExitError, e)
    assert.equal(e.exitCode, 3)
    assert.equal(e.stdout, 'out\n')
    assert.equal(e.stderr, 'err\n')
    return true
  })
  const env = await sbx.commands.run('echo $FOO; pwd', { envs: { FOO: 'bar' }, cwd: '/tmp' })
  assert.equal(env.stdout, 'bar\n/tmp\n')
  await assert.rejects(sbx.commands.run('pwd', { cwd: '/nonexistent/dir' }), InvalidArgumentError)
  const root = await sbx.commands.run('id -u', { user: 'root' })
  assert.equal(root.stdout, '0\n')
  const plain = await sbx.commands.run('id -u')
  assert.notEqual(plain.stdout, '0\n')
  await assert.rejects(sbx.commands.run(`sleep 30; echo never`, { timeoutMs: 1000 }), TimeoutError)
  await until('the timed-out command to be gone', async () =>
    !(await sbx.commands.list()).some((p) => p.args.some((a) => a.includes('sleep 30'))))
})

test('commands, streaming and background', async () => {
  const ticks = []
  const h = await sbx.commands.run('for i in 1 2 3; do echo tick $i; sleep 0.2; done; sleep 60', {
    background: true, onStdout: (d) => ticks.push(d),
  })
  await until('three ticks through onStdout', () => ticks.join('') === 'tick 1\ntick 2\ntick 3\n')
  const list = await sbx.commands.list()
  const mine = list.find((p) => p.pid === h.pid)
  assert.ok(mine, `pid ${h.pid} is not listed: ${JSON.stringify(list)}`)
  assert.equal(mine.cmd, '/bin/bash')
  const second = await sbx.commands.connect(h.pid)
  assert.equal(second.pid, h.pid)
  assert.equal(await h.kill(), true)
  await assert.rejects(h.wait(), (e) => {
    assert.ok(e instanceof CommandExitError, e)
    assert.equal(e.exitCode, -1)
    assert.equal(e.error, 'signal: killed')
    return true
  })
  await assert.rejects(second.wait(), CommandExitError)
  assert.equal(await sbx.commands.kill(h.pid), false)
  await assert.rejects(sbx.commands.connect(999999), NotFoundError)

  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'from stdin\n')
  await sbx.commands.closeStdin(cat.pid)
  const r = await cat.wait()
  assert.equal(r.stdout, 'from stdin\n')
})

test('files', async () => {
  const p = `${dir}/hello.txt`
  await sbx.files.write(p, 'hello world\n')
  assert.equal(await sbx.files.read(p), 'hello world\n')
  const bytes = await sbx.files.read(p, { format: 'bytes' })
  assert.deepEqual(Buffer.from(bytes), Buffer.from('hello world\n'))
  assert.equal((await sbx.commands.run(`cat ${p}`)).stdout, 'hello world\n')

  const multi = await sbx.files.write([
    { path: `${dir}/a/one.txt`, data: 'one' },
    { path: `${dir}/b/two.txt`, data: new Blob(['two']) },
  ])
  assert.deepEqual(multi.map((e) => e.path).sort(), [`${dir}/a/one.txt`, `${dir}/b/two.txt`])
  assert.equal((await sbx.commands.run(`cat ${dir}/a/one.txt ${dir}/b/two.txt`)).stdout, 'onetwo')

  assert.equal(await sbx.files.exists(p), true)
  assert.equal(await sbx.files.exists(`${dir}/missing`), false)
  const info = await sbx.files.getInfo(p)
  assert.equal(info.type, FileType.FILE)
  assert.equal(info.size, 12)
  assert.ok(info.modifiedTime instanceof Date)
  assert.equal(await sbx.files.makeDir(`${dir}/made`), true)
  assert.equal(await sbx.files.makeDir(`${dir}/made`), false)
  const names = (await sbx.files.list(dir)).map((e) => e.name).sort()
  assert.deepEqual(names, ['a', 'b', 'hello.txt', 'made'])
  const moved = await sbx.files.rename(p, `${dir}/made/moved.txt`)
  assert.equal(moved.path, `${dir}/made/moved.txt`)
  await sbx.files.remove(`${dir}/made/moved.txt`)
  assert.equal(await sbx.files.exists(`${dir}/made/moved.txt`), false)
  await sbx.files.remove(`${dir}/never-was`) // like rm -rf: no error
  await assert.rejects(sbx.files.read(`${dir}/missing`), FileNotFoundError)

  // Relative paths are the user's home, as on E2B.
  await sbx.files.write(`rel-${sbx.sandboxId}.txt`, 'in home')
  assert.equal((await sbx.commands.run(`cat "$HOME/rel-${sbx.sandboxId}.txt"`)).stdout, 'in home')
  assert.equal(await sbx.files.read(`~/rel-${sbx.sandboxId}.txt`), 'in home')
  await sbx.files.remove(`rel-${sbx.sandboxId}.txt`)
})

test('watch a directory', async () => {
  const events = []
  const w = await sbx.files.watchDir(`${dir}/made`, (ev) => events.push(ev))
  await sbx.files.write(`${dir}/made/watched.txt`, 'x')
  await until('a create event', () => events.some((e) => e.name === 'watched.txt' && e.type === 'create'))
  await w.stop()
})

test('upload and download through signed URLs, gzip and octet-stream', async () => {
  const target = `${dir}/signed.txt`
  const up = await sbx.uploadUrl(target)
  assert.match(up, /signature=v1_/)
  const form = new FormData()
  form.append('file', new Blob(['signed upload\n']), 'signed.txt')
  const res = await fetch(up, { method: 'POST', body: form })
  assert.equal(res.status, 200, await res.clone().text())
  const down = await sbx.downloadUrl(target)
  assert.equal(await (await fetch(down)).text(), 'signed upload\n')
  const forged = down.replace(/signature=v1_[^&]+/, 'signature=v1_forged')
  assert.equal((await fetch(forged)).status, 401)

  const big = 'x'.repeat(100_000) + '\n'
  await sbx.files.write(`${dir}/gz.txt`, big, { gzip: true })
  assert.equal(await sbx.files.read(`${dir}/gz.txt`, { gzip: true }), big)
  await sbx.files.write(`${dir}/octet.txt`, 'octet', { useOctetStream: true })
  assert.equal(await sbx.files.read(`${dir}/octet.txt`), 'octet')
})

test('pty with input and resize', async () => {
  let out = ''
  const dec = new TextDecoder()
  const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) } })
  await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; echo pty-$((40+2))\n'))
  await until('the terminal output', () => out.includes('pty-42') && out.includes('30 100'))
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('exit 7\n'))
  await assert.rejects(pty.wait(), (e) => e instanceof CommandExitError && e.exitCode === 7)

  const other = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
  assert.equal(await sbx.pty.kill(other.pid), true)
  await assert.rejects(other.wait(), (e) => e instanceof CommandExitError && e.exitCode === -1)
})

test('lifecycle: info, timeout, list, connect', async () => {
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.deepEqual(info.metadata, meta)
  assert.equal(info.state, 'running')
  await sbx.setTimeout(60_000)
  const page = await Sandbox.list({ query: { metadata: meta } }).nextItems()
  assert.deepEqual(page.map((s) => s.sandboxId), [sbx.sandboxId])
  const none = await Sandbox.list({ query: { metadata: { suite: 'no-such-suite' } } }).nextItems()
  assert.equal(none.length, 0)
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.commands.run('echo again')).stdout, 'again\n')
  assert.equal(await sbx.isRunning(), true)
  const [m] = await sbx.getMetrics()
  assert.ok(m.memUsed > 0 && m.memTotal >= m.memUsed && m.cpuCount >= 1, JSON.stringify(m))
})

test('pause and resume keep files and processes', async () => {
  await sbx.files.write(`${dir}/kept.txt`, 'kept across pause\n')
  // The counter replaces its file atomically, so a read never sees it empty.
  const bg = await sbx.commands.run(`sh -c 'i=0; while :; do i=$((i+1)); echo $i > ${dir}/count.new; mv ${dir}/count.new ${dir}/count; sleep 0.1; done'`, { background: true, timeoutMs: 0 })
  const count = async () => Number((await sbx.commands.run(`cat ${dir}/count 2>/dev/null || echo 0`)).stdout)
  await until('the counter to count', async () => (await count()) > 0)
  await bg.disconnect()
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.pause(), false)
  assert.equal((await sbx.getInfo()).state, 'paused')
  assert.equal(await sbx.isRunning(), false)
  await sbx.connect()
  assert.equal((await sbx.getInfo()).state, 'running')
  assert.equal(await sbx.files.read(`${dir}/kept.txt`), 'kept across pause\n')
  assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid), 'the background process survived')
  const before = await count()
  assert.ok(before > 0, 'the counter kept its value')
  await until('the counter to go on', async () => (await count()) > before)
  assert.equal(await sbx.commands.kill(bg.pid), true)
})

test('pause without memory keeps the files, not the processes', async () => {
  const s = await Sandbox.create('base', { timeoutMs: 60_000, metadata: { suite: 'e2b-compat-fs-pause', run: meta.run } })
  try {
    await s.files.write('fs-only.txt', 'on disk\n')
    const bg = await s.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    await bg.disconnect()
    assert.ok((await s.commands.list()).some((p) => p.pid === bg.pid))
    assert.equal(await s.pause({ keepMemory: false }), true)
    await s.connect({ onResume: 'reboot' })
    assert.equal(await s.files.read('fs-only.txt'), 'on disk\n')
    assert.ok(!(await s.commands.list()).some((p) => p.cmd === 'sleep'), 'no process came back')
    // A sandbox paused with its memory cannot start afresh on this daemon.
    assert.equal(await s.pause(), true)
    await assert.rejects(s.connect({ onResume: 'reboot' }), (e) => {
      assert.ok(e instanceof SandboxError, e)
      assert.match(e.message, /501.*keepMemory: false/)
      return true
    })
    await s.connect()
  } finally {
    await s.kill()
  }
})

test('autoResume: a request to a paused sandbox resumes it', async () => {
  const s = await Sandbox.create('base', { timeoutMs: 60_000, metadata: { suite: 'e2b-compat-resume', run: meta.run }, lifecycle: { onTimeout: 'pause', autoResume: true } })
  try {
    await s.files.write('/tmp/resume.txt', 'still here\n')
    assert.deepEqual((await s.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: true })
    assert.equal(await s.pause(), true)
    assert.equal((await s.getInfo()).state, 'paused')
    assert.equal(await within(s.files.read('/tmp/resume.txt'), 60000), 'still here\n')
    assert.equal((await s.getInfo()).state, 'running')
    const detail = await (await fetch(`${process.env.E2B_API_URL}/sandboxes/${s.sandboxId}`, { headers: { 'X-API-KEY': process.env.E2B_API_KEY } })).json()
    assert.equal(detail.agentjail.jails.length, 2, 'the read restored the pause snapshot as the next jail')
  } finally {
    await s.kill()
  }
  // autoResume without pausing at the timeout is refused by the SDK; the
  // API refuses it too.
  const r = await fetch(`${process.env.E2B_API_URL}/v2/sandboxes`, {
    method: 'POST', headers: { 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ templateID: 'base', autoResume: { enabled: true } }),
  })
  assert.equal(r.status, 400)
})

test('fork: branch a running sandbox two ways (extension)', async () => {
  const src = await Sandbox.create('base', { timeoutMs: 60_000, metadata: { suite: 'e2b-compat-fork', run: meta.run } })
  try {
    await src.files.write('/tmp/before-fork.txt', 'shared')
    const forks = await src.fork({ count: 2, timeoutMs: 60_000 })
    assert.equal(forks.length, 2)
    for (const f of forks) {
      assert.ok(!(f instanceof Error), String(f))
      assert.notEqual(f.sandboxId, src.sandboxId)
      assert.equal(await f.files.read('/tmp/before-fork.txt'), 'shared')
    }
    await forks[0].files.write('/tmp/only-in-fork.txt', 'x')
    assert.equal(await forks[1].files.exists('/tmp/only-in-fork.txt'), false)
    assert.equal(await src.files.exists('/tmp/only-in-fork.txt'), false)
    for (const f of forks) assert.equal(await f.kill(), true)

    // A snapshot is a template for new sandboxes.
    const snap = await src.createSnapshot()
    const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
    assert.equal(await fromSnap.files.read('/tmp/before-fork.txt'), 'shared')
    assert.equal(await fromSnap.kill(), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  } finally {
    await src.kill()
  }
})

test('observation report reachable from the sandbox id (extension)', async () => {
  await sbx.commands.run('echo report-marker')
  const api = process.env.E2B_API_URL
  const headers = { 'X-API-KEY': process.env.E2B_API_KEY }
  // The kernel's events reach the record a moment after the command ran.
  await until('the report to show a command run through the SDK', async () => {
    const report = await (await fetch(`${api}/sandboxes/${sbx.sandboxId}/report`, { headers })).json()
    return JSON.stringify(report.processes).includes('report-marker')
  })
  // The jail the sandbox ran in before its pause keeps its report.
  const detail = await (await fetch(`${api}/sandboxes/${sbx.sandboxId}`, { headers })).json()
  assert.equal(detail.agentjail.jails.length, 2)
  const first = await fetch(`${api}/sandboxes/${sbx.sandboxId}/report?jail=${detail.agentjail.jails[0]}`, { headers })
  assert.equal(first.status, 200)
  assert.ok(JSON.stringify((await first.json()).processes).includes('tick'), 'the first jail\'s report shows the tick loop')
})

test('routes agentjail does not support fail clearly, without hanging', async () => {
  await assert.rejects(within(Sandbox.create('base', { mcp: { exa: { apiKey: 'x' } } })), (e) => {
    assert.ok(e instanceof SandboxError, e)
    assert.match(e.message, /not supported/)
    return true
  })
  const raw = await within(fetch(`${process.env.E2B_SANDBOX_URL}/process.Process/List`, {
    method: 'POST', body: '{}',
    headers: { 'Content-Type': 'application/json', 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': 'wrong' },
  }))
  assert.equal(raw.status, 401)
  assert.equal((await raw.json()).code, 401)
})

test('kill and error mapping', async () => {
  const id = sbx.sandboxId
  assert.equal(await sbx.kill(), true)
  assert.equal(await Sandbox.kill(id), false)
  assert.equal(await sbx.isRunning(), false)
  await assert.rejects(Sandbox.getInfo(id), SandboxNotFoundError)
  await assert.rejects(Sandbox.connect(id), SandboxNotFoundError)
  await assert.rejects(Sandbox.create('base', { apiKey: 'aj_000000000000_wrongwrongwrongwrongwrongwrongwrongwrongwro' }), AuthenticationError)
  const key = process.env.E2B_API_KEY
  delete process.env.E2B_API_KEY
  try {
    await assert.rejects(Sandbox.create('base'), AuthenticationError)
  } finally {
    process.env.E2B_API_KEY = key
  }
})
