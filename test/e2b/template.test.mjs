// Template builds (Template.build) with the official SDK against an
// agentjail daemon: a template built from an image with files, env, a work
// dir and a start command left running; sandboxes of it by name and tag;
// uploads cached between builds; an unchanged build reused; tags moved; failures reported with their
// step; a private base image pulled with the template's credentials; bad
// requests refused; deletion.
//
// Needs E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL, AJ_TEST_IMAGE: a busybox
// image the daemon can pull, and AJ_TEST_PRIVATE_IMAGE: the same from a
// registry that wants the user and password AJ_TEST_PRIVATE_AUTH
// (USER:PASSWORD). AJ_TEST_ONE_DAEMON=1 adds what holds on one daemon only:
// a volume mounted in a sandbox of a template (through the Kubernetes
// gateway the two may be on different nodes).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Sandbox, Template, BuildError, Volume, waitForFile } from 'e2b'

const IMAGE = process.env.AJ_TEST_IMAGE
assert.ok(IMAGE, 'AJ_TEST_IMAGE names the image to build from')
const PRIVATE = process.env.AJ_TEST_PRIVATE_IMAGE
const [PRIVATE_USER, PRIVATE_PASSWORD] = (process.env.AJ_TEST_PRIVATE_AUTH ?? '').split(':')
assert.ok(PRIVATE && PRIVATE_PASSWORD, 'AJ_TEST_PRIVATE_IMAGE and AJ_TEST_PRIVATE_AUTH name a private image and its credentials')
const API = process.env.E2B_API_URL
const KEY = process.env.E2B_API_KEY

// The build context: what copy() takes files from.
const ctx = fs.mkdtempSync(path.join(os.tmpdir(), 'aj-template-'))
const put = (p, body, mode) => {
  fs.mkdirSync(path.dirname(path.join(ctx, p)), { recursive: true })
  fs.writeFileSync(path.join(ctx, p), body, { mode })
}
put('app/main.txt', 'main file\n')
put('app/sub/inner.txt', 'inner file\n')
put('app/run.sh', '#!/bin/sh\necho ran\n', 0o755)
put('hello.txt', 'hello file\n')
put('data/a.csv', 'a\n')
put('data/b.csv', 'b\n')
put('data/c.txt', 'c\n')
fs.symlinkSync('main.txt', path.join(ctx, 'app/link.txt'))
after(() => fs.rmSync(ctx, { recursive: true, force: true }))

const api = (method, p, body) =>
  fetch(API + p, { method, headers: { 'X-API-KEY': KEY, 'Content-Type': 'application/json' }, body: body && JSON.stringify(body) })

const appTemplate = () =>
  Template({ fileContextPath: ctx })
    .fromImage(IMAGE)
    .copy('app', '/srv/app')
    .copy('hello.txt', '/etc/greeting/', { mode: 0o600 })
    .copy('data/*.csv', '/data/')
    .setEnvs({ GREETING: 'hi from the template', PATH: '/bin:/usr/bin' })
    .setWorkdir('/srv/app')
    .runCmd('echo "built by $GREETING" > built.txt && echo step output line')
    .setStartCmd('echo started > /tmp/started; exec sleep 100000', waitForFile('/tmp/started'))

const run = async (sbx, cmd) => (await sbx.commands.run(cmd)).stdout

test('a template builds from an image, and its sandboxes start from it with the start command running', async () => {
  const logs = []
  const info = await Template.build(appTemplate(), 'aj-app:v1', { onBuildLogs: (e) => logs.push(e.message) })
  assert.ok(info.templateId && info.buildId, JSON.stringify(info))
  assert.deepEqual(info.tags, ['v1'])
  assert.ok(logs.some((l) => l.includes('step output line')), 'a RUN step\'s output is in the build log:\n' + logs.join('\n'))
  assert.ok(logs.some((l) => l.includes("Uploaded 'app'")), logs.join('\n'))
  assert.equal(await Template.exists('aj-app'), true)
  assert.equal(await Template.exists('aj-missing'), false)

  const sbx = await Sandbox.create('aj-app:v1', { envs: { FROM_CREATE: 'yes' } })
  try {
    assert.equal(await run(sbx, 'pwd'), '/srv/app\n')
    assert.equal(await run(sbx, 'cat built.txt main.txt sub/inner.txt link.txt; ./run.sh; readlink link.txt'),
      'built by hi from the template\nmain file\ninner file\nmain file\nran\nmain.txt\n')
    assert.equal(await run(sbx, 'cat /etc/greeting/hello.txt; stat -c %a /etc/greeting/hello.txt; ls /data'),
      'hello file\n600\na.csv\nb.csv\n')
    assert.equal(await run(sbx, 'echo "$GREETING/$FROM_CREATE"'), 'hi from the template/yes\n')
    // The start command was snapshotted running: it is there at once.
    assert.equal(await run(sbx, 'cat /tmp/started'), 'started\n')
    assert.match(await run(sbx, 'ps -o args'), /sleep 100000/)
  } finally {
    await sbx.kill()
  }
})

test('a sandbox of a template with a start command that mounts a volume runs the start command anew',
  { skip: process.env.AJ_TEST_ONE_DAEMON !== '1' && 'one daemon only' }, async () => {
    const vol = await Volume.create('aj-template-vol')
    try {
      const sbx = await Sandbox.create('aj-app:v1', { volumeMounts: { '/data': vol } })
      try {
        assert.equal(await run(sbx, 'cat /tmp/started; pwd; cat built.txt'), 'started\n/srv/app\nbuilt by hi from the template\n')
        assert.match(await run(sbx, 'ps -o args'), /sleep 100000/)
        await run(sbx, 'echo kept > /data/kept.txt')
        assert.deepEqual((await sbx.getInfo()).volumeMounts, [{ name: 'aj-template-vol', path: '/data' }])
      } finally {
        await sbx.kill()
      }
      const other = await Sandbox.create({ volumeMounts: { '/v': vol } })
      try {
        assert.equal(await run(other, 'cat /v/kept.txt'), 'kept\n')
      } finally {
        await other.kill()
      }
    } finally {
      await Volume.destroy(vol.volumeId)
    }
  })

test('a template without a start command is its image: sandboxes are jails of it', async () => {
  await Template.build(Template().fromImage(IMAGE).setEnvs({ KIND: 'plain' }).runCmd('echo plain > /plain.txt'), 'aj-plain')
  let t0 = performance.now()
  const sbx = await Sandbox.create('aj-plain', { envs: { FROM_CREATE: 'yes' } })
  const plainMs = performance.now() - t0
  t0 = performance.now()
  const started = await Sandbox.create('aj-app:v1')
  const startedMs = performance.now() - t0
  t0 = performance.now()
  const base = await Sandbox.create()
  const baseMs = performance.now() - t0
  try {
    assert.equal(await run(sbx, 'cat /plain.txt; echo "$KIND/$FROM_CREATE"; test -e /tmp/started || echo no start command'),
      'plain\nplain/yes\nno start command\n')
    const info = await (await api('GET', '/sandboxes/' + sbx.sandboxId)).json()
    assert.equal(info.templateID, 'aj-plain')
  } finally {
    await sbx.kill()
    await started.kill()
    await base.kill()
  }
  console.log(`create → ready: template image ${plainMs.toFixed(0)} ms, template with a start command ${startedMs.toFixed(0)} ms, default template ${baseMs.toFixed(0)} ms`)
})

test('a rebuild reuses uploaded files, tags move between builds, and sandboxes follow the tags', async () => {
  const logs = []
  const t = appTemplate().runCmd('echo second > /srv/app/build.txt')
  const info = await Template.build(t, 'aj-app', { onBuildLogs: (e) => logs.push(e.message) })
  assert.deepEqual(info.tags, ['default'])
  assert.ok(logs.some((l) => l.includes("Skipping upload of 'app', already cached")), logs.join('\n'))

  const latest = await Sandbox.create('aj-app')
  const v1 = await Sandbox.create('aj-app:v1')
  try {
    assert.equal(await run(latest, 'cat build.txt'), 'second\n')
    const r = await v1.commands.run('test -e build.txt').catch((e) => e)
    assert.equal(r.exitCode, 1, 'the v1 build has no build.txt')
  } finally {
    await latest.kill()
    await v1.kill()
  }

  const assigned = await Template.assignTags('aj-app:v1', ['prod'])
  assert.deepEqual(assigned.tags, ['prod'])
  const tags = (await Template.getTags(info.templateId)).map((t) => t.tag).sort()
  assert.deepEqual(tags, ['default', 'prod', 'v1'])
  const prod = await Sandbox.create('aj-app:prod')
  try {
    assert.equal((await prod.commands.run('test -e build.txt').catch((e) => e)).exitCode, 1)
  } finally {
    await prod.kill()
  }
  await Template.removeTags('aj-app', 'prod')
  await assert.rejects(Sandbox.create('aj-app:prod'), /no tag "prod"/)
})

test('an unchanged template is not built again: the new build reuses the image and the started snapshot', async () => {
  const logs = []
  const t0 = performance.now()
  await Template.build(appTemplate(), 'aj-app:v2', { onBuildLogs: (e) => logs.push(e.message) })
  const ms = performance.now() - t0
  assert.ok(logs.some((l) => l.includes('Unchanged since build')), logs.join('\n'))
  assert.ok(!logs.some((l) => l.includes('step output line')), 'no step ran:\n' + logs.join('\n'))
  const sbx = await Sandbox.create('aj-app:v2')
  try {
    assert.equal(await run(sbx, 'cat /tmp/started built.txt'), 'started\nbuilt by hi from the template\n')
  } finally {
    await sbx.kill()
  }
  console.log(`an unchanged rebuild: ${ms.toFixed(0)} ms`)
})

test('a failing step fails the build with its output, its step and the line that made it', async () => {
  const logs = []
  const t = Template().fromImage(IMAGE).runCmd('echo about to fail; exit 3')
  const err = await Template.build(t, 'aj-broken', { onBuildLogs: (e) => logs.push(e.message) }).catch((e) => e)
  assert.ok(err instanceof BuildError, String(err))
  assert.match(err.message, /exit code 3/)
  assert.match(err.stack, /template\.test\.mjs/, 'the error points at the runCmd call')
  assert.ok(logs.some((l) => l.includes('about to fail')), logs.join('\n'))
  await assert.rejects(Sandbox.create('aj-broken'), /no finished build/)

  const missing = await Template.build(Template().fromImage(IMAGE.replace(/[^/]+$/, 'nothing-here:1')), 'aj-broken').catch((e) => e)
  assert.ok(missing instanceof BuildError, String(missing))
  assert.match(missing.message, /pulling/)
})

test('a private base image is pulled with the credentials the template gives', async () => {
  const wrong = await Template.build(Template().fromImage(PRIVATE, { username: PRIVATE_USER, password: 'wrong' }), 'aj-private').catch((e) => e)
  assert.ok(wrong instanceof BuildError, String(wrong))
  assert.match(wrong.message, /refused the credentials \(the credentials given\)/)
  const aws = await Template.build(Template().fromAWSRegistry(PRIVATE, { accessKeyId: 'a', secretAccessKey: 'b', region: 'c' }), 'aj-private').catch((e) => e)
  assert.match(String(aws), /AWS keys/)

  const logs = []
  const t = Template().fromImage(PRIVATE, { username: PRIVATE_USER, password: PRIVATE_PASSWORD }).runCmd('echo private > /private.txt')
  await Template.build(t, 'aj-private', { onBuildLogs: (e) => logs.push(e.message) })
  assert.ok(!logs.some((l) => l.includes(PRIVATE_PASSWORD)), 'the password is not in the build log')
  const sbx = await Sandbox.create('aj-private')
  try {
    assert.equal(await run(sbx, 'cat /private.txt'), 'private\n')
  } finally {
    await sbx.kill()
  }
})

test('bad requests are refused with what is wrong', async () => {
  await assert.rejects(Template.build(Template().fromTemplate('base'), 'aj-bad'), /not an image/)
  await assert.rejects(Template.build(Template().fromImage(IMAGE), 'Bad Name'), /not a template name/)
  await assert.rejects(Template.build(Template().fromTemplate('aj-nothing'), 'aj-bad'), /not found/)
  let r = await api('POST', '/v3/templates', { name: 'aj-bad', tags: ['no spaces'] })
  assert.equal(r.status, 400)
  r = await api('GET', '/templates/aliases/aj-app')
  const { templateID } = await r.json()
  r = await fetch(`${API}/templates/${templateID}/files/${'0'.repeat(64)}?token=wrong`, { method: 'PUT', body: 'x' })
  assert.equal(r.status, 401)
  r = await api('GET', `/templates/${templateID}/builds/nothing/status`)
  assert.equal(r.status, 404)
})

test('deleting a template removes it, and its name no longer starts sandboxes', async () => {
  for (const name of ['aj-app', 'aj-broken', 'aj-bad', 'aj-plain', 'aj-private']) {
    const r = await api('DELETE', `/templates/${name}`)
    assert.equal(r.status, 204, await r.text())
  }
  assert.equal(await Template.exists('aj-app'), false)
  await assert.rejects(Sandbox.create('aj-app'), /404/)
  const list = await (await api('GET', '/templates')).json()
  assert.deepEqual(list, [])
})
