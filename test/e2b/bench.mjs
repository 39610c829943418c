// The SDK side of the E2B benchmarks (test/integration's BenchmarkE2B*):
// one operation per line read on stdin, its time in ms as one JSON line.
//   create   Sandbox.create() then commands.run('true') (the sandbox is
//            killed after the measure)
//   run      commands.run('true') in a sandbox kept between lines
//   rest-create, rest-run  the same through agentjail's own REST API
//            (POST /jails, POST /jails/{id}/exec of the command the SDK
//            sends), from this same Node process: the floor the SDK path
//            adds to (AGENTJAIL_URL, AGENTJAIL_TOKEN)
//   template-build IMAGE NAME [start]  Template.build() of a template
//            from IMAGE (with a start command when "start"); answers the
//            time and the template's image
//   template-create NAME  Sandbox.create(NAME) then commands.run('true')
//   rest-image-create REF  POST /jails of the image REF, then the exec
//   quit     kill the kept sandbox and jail and exit
import { Sandbox, Template, waitForFile } from 'e2b'
import readline from 'node:readline'

const api = process.env.AGENTJAIL_URL
const headers = { Authorization: `Bearer ${process.env.AGENTJAIL_TOKEN}`, 'Content-Type': 'application/json' }
const sdkArgv = ['/bin/bash', '-l', '-c', 'true']
let n = 0

async function rest(method, path, body) {
  const r = await fetch(api + path, { method, headers, body: body && JSON.stringify(body) })
  const text = await r.text()
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text}`)
  return text ? JSON.parse(text) : null
}

async function restExec(id) {
  const r = await rest('POST', `/jails/${id}/exec`, { cmd: sdkArgv })
  if (r.exit_code !== 0) throw new Error(`exec exited ${r.exit_code}`)
}

let kept
let keptJail
for await (const line of readline.createInterface({ input: process.stdin })) {
  const [op, ...args] = line.trim().split(/\s+/)
  try {
    if (op === 'template-build') {
      const [image, name, start] = args
      let t = Template().fromImage(image).runCmd('echo built > /built.txt')
      if (start === 'start') t = t.setStartCmd('touch /tmp/started; exec sleep 100000', waitForFile('/tmp/started'))
      const t0 = performance.now()
      const info = await Template.build(t, name)
      const ms = performance.now() - t0
      console.log(JSON.stringify({ ms, image: `agentjail.template/${info.templateId}:${info.buildId}` }))
    } else if (op === 'template-create') {
      const t0 = performance.now()
      const s = await Sandbox.create(args[0])
      const r = await s.commands.run('true')
      const ms = performance.now() - t0
      if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`)
      await s.kill()
      console.log(JSON.stringify({ ms }))
    } else if (op === 'rest-image-create') {
      const t0 = performance.now()
      const j = await rest('POST', '/jails', { name: `e2b-bench-${process.pid}-${n++}`, isolation: { filesystem: { rootfs: 'image:' + args[0] } } })
      await restExec(j.id)
      const ms = performance.now() - t0
      await rest('DELETE', `/jails/${j.id}`)
      console.log(JSON.stringify({ ms }))
    } else if (op === 'create') {
      const t0 = performance.now()
      const s = await Sandbox.create()
      const r = await s.commands.run('true')
      const ms = performance.now() - t0
      if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`)
      await s.kill()
      console.log(JSON.stringify({ ms }))
    } else if (op === 'run') {
      kept ??= await Sandbox.create({ timeoutMs: 3_600_000 })
      const t0 = performance.now()
      const r = await kept.commands.run('true')
      const ms = performance.now() - t0
      if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`)
      console.log(JSON.stringify({ ms }))
    } else if (op === 'rest-create') {
      const t0 = performance.now()
      const j = await rest('POST', '/jails', { name: `e2b-bench-${process.pid}-${n++}` })
      await restExec(j.id)
      const ms = performance.now() - t0
      await rest('DELETE', `/jails/${j.id}`)
      console.log(JSON.stringify({ ms }))
    } else if (op === 'rest-run') {
      keptJail ??= (await rest('POST', '/jails', { name: `e2b-bench-${process.pid}-kept` })).id
      const t0 = performance.now()
      await restExec(keptJail)
      console.log(JSON.stringify({ ms: performance.now() - t0 }))
    } else if (op === 'quit') {
      if (kept) await kept.kill()
      if (keptJail) await rest('DELETE', `/jails/${keptJail}`)
      break
    } else {
      throw new Error(`unknown operation ${op}`)
    }
  } catch (e) {
    console.log(JSON.stringify({ error: String(e) }))
  }
}
