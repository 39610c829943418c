// Volumes (Volume) with the official SDK against an agentjail daemon: a
// volume mounted into two sandboxes, its content API (write, read, list,
// stat, metadata, mkdir, remove), links a sandbox leaves there that must
// not lead the daemon out of it, bad mounts, a volume in use, destroy.
//
// Needs E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL and E2B_VOLUME_API_URL.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import { Sandbox, Volume, VolumeNotFoundError } from 'e2b'

const run = async (sbx, cmd) => (await sbx.commands.run(cmd)).stdout

test('a volume is shared by sandboxes and served by its content API, never beyond itself', async () => {
  const name = 'aj-vol-' + Date.now()
  const vol = await Volume.create(name)
  assert.ok(vol.volumeId && vol.token)
  await assert.rejects(Volume.create(name), /already exists/)

  await vol.writeFile('/seed/hello.txt', 'from the API\n')
  const a = await Sandbox.create({ volumeMounts: { '/data': vol } })
  const b = await Sandbox.create({ volumeMounts: { '/mnt/v': name } })
  try {
    assert.equal(await run(a, 'cat /data/seed/hello.txt'), 'from the API\n')
    await run(a, 'echo from-a > /data/a.txt && mkdir /data/dir && echo x > /data/dir/x && ln -s /etc/passwd /data/escape && ln -s ../../../../../.. /data/up')
    assert.equal(await run(b, 'cat /mnt/v/a.txt'), 'from-a\n')
    assert.deepEqual((await a.getInfo()).volumeMounts, [{ name, path: '/data' }])

    assert.equal(await vol.readFile('/a.txt'), 'from-a\n')
    const names = (await vol.list('/')).map((e) => e.name).sort()
    assert.deepEqual(names, ['a.txt', 'dir', 'escape', 'seed', 'up'])
    assert.deepEqual((await vol.list('/', { depth: 2 })).map((e) => e.path).sort(),
      ['/a.txt', '/dir', '/dir/x', '/escape', '/seed', '/seed/hello.txt', '/up'])
    const link = await vol.getInfo('/escape')
    assert.equal(link.type, 'symlink')
    assert.equal(link.target, '/etc/passwd')

    // The links lead nowhere outside the volume: not to the host's files.
    const host = fs.readFileSync('/etc/passwd', 'utf8')
    for (const p of ['/escape', '/up/etc/passwd']) {
      const got = await vol.readFile(p).catch((e) => e)
      assert.ok(got instanceof Error, `reading ${p} through a link gave ${String(got).slice(0, 40)}`)
    }
    await assert.rejects(vol.writeFile('/escape', 'overwritten'))
    await assert.rejects(vol.writeFile('/up/tmp/aj-volume-escape', 'x'))
    assert.equal(fs.readFileSync('/etc/passwd', 'utf8'), host)
    assert.equal(fs.existsSync('/tmp/aj-volume-escape'), false)

    const st = await vol.updateMetadata('/a.txt', { mode: 0o600 })
    assert.equal(st.mode, 0o600)
    assert.equal((await vol.makeDir('/made')).type, 'directory')
    await vol.remove('/dir')
    assert.equal(await vol.exists('/dir'), false)
    assert.equal(await run(b, 'ls /mnt/v | sort | tr "\\n" " "'), 'a.txt escape made seed up ')

    // A mounted volume is not destroyed.
    await assert.rejects(Volume.destroy(vol.volumeId), /mounted by sandbox/)

    // Paused and resumed, a sandbox has its volume again, with what was
    // written meanwhile.
    assert.equal(await b.pause(), true)
    await vol.writeFile('/while-paused.txt', 'written while paused\n')
    const resumed = await Sandbox.connect(b.sandboxId)
    assert.equal(await run(resumed, 'cat /mnt/v/while-paused.txt'), 'written while paused\n')
  } finally {
    await a.kill()
    await b.kill()
  }
  assert.ok((await Volume.list()).some((v) => v.name === name))
  assert.equal(await Volume.destroy(vol.volumeId), true)
  await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
})

test('bad mounts and wrong tokens are refused', async () => {
  const vol = await Volume.create('aj-vol-bad-' + Date.now())
  try {
    await assert.rejects(Sandbox.create({ volumeMounts: { relative: vol } }), /clean absolute path/)
    await assert.rejects(Sandbox.create({ volumeMounts: { '/': vol } }), /clean absolute path/)
    await assert.rejects(Sandbox.create({ volumeMounts: { '/data': 'aj-no-such-volume' } }), /not found/)
    const r = await fetch(`${process.env.E2B_VOLUME_API_URL}/volumecontent/${vol.volumeId}/file?path=/x`, { headers: { Authorization: 'Bearer wrong' } })
    assert.equal(r.status, 401)
    const other = new Volume(vol.volumeId, vol.name, 'wrong', vol.domain)
    await assert.rejects(other.readFile('/x'))
  } finally {
    await Volume.destroy(vol.volumeId)
  }
})
