package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"testing"
	"time"
)

// sdkBench drives test/e2b/bench.mjs: the official SDK timing its own
// operations in a Node process kept between them.
type sdkBench struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func newSDKBench(b *testing.B, d *daemon) *sdkBench {
	dir := e2bProject(b)
	cmd := exec.Command("node", "bench.mjs")
	cmd.Dir = dir
	cmd.Env = append(e2bEnv(d, e2bKey(b, d)), "AGENTJAIL_URL=http://"+d.addr, "AGENTJAIL_TOKEN="+d.token)
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	s := &sdkBench{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	b.Cleanup(func() {
		fmt.Fprintln(in, "quit")
		in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			<-done
		}
	})
	return s
}

// op runs one operation and returns the time the SDK measured.
func (s *sdkBench) op(b *testing.B, name string) time.Duration {
	b.Helper()
	d, _ := s.opImage(b, name)
	return d
}

// opImage runs one operation and returns the time the SDK measured and
// the image it names (template-build).
func (s *sdkBench) opImage(b *testing.B, name string) (time.Duration, string) {
	b.Helper()
	if _, err := fmt.Fprintln(s.in, name); err != nil {
		b.Fatal(err)
	}
	if !s.out.Scan() {
		b.Fatalf("bench.mjs ended: %v", s.out.Err())
	}
	var res struct {
		Ms    float64 `json:"ms"`
		Image string  `json:"image"`
		Error string  `json:"error"`
	}
	if err := json.Unmarshal(s.out.Bytes(), &res); err != nil || res.Error != "" {
		b.Fatalf("bench.mjs %s: %s %v", name, s.out.Text(), err)
	}
	return time.Duration(res.Ms * float64(time.Millisecond)), res.Image
}

// sdkArgv is what the SDK's commands.run('true') asks the sandbox to run:
// a login shell (sourcing /etc/profile costs several ms by itself).
var sdkArgv = []string{"/bin/bash", "-l", "-c", "true"}

// The E2B benchmarks compare the SDK's path with the daemon's own REST API
// doing the same (a create served by a ready jail, then an exec of the
// command the SDK sends), both timed in the same Node process, so that
// the ratio is what the E2B surface adds; go-ms is the same REST sequence
// timed from Go (the Node runtime's own share is the difference). The
// operations alternate, each create starting with the ready pool full.

// BenchmarkE2BCreateToRun times Sandbox.create() then commands.run('true')
// until done, against REST create then first exec.
func BenchmarkE2BCreateToRun(b *testing.B) {
	d := newDaemon(b, "--warm-jails", "2")
	sdk := newSDKBench(b, d)
	var ours, ref, goRef []time.Duration
	b.ResetTimer()
	for range b.N {
		for _, op := range []string{"create", "rest-create", "go"} {
			b.StopTimer()
			d.waitWarm(b)
			b.StartTimer()
			switch op {
			case "create":
				ours = append(ours, sdk.op(b, op))
			case "rest-create":
				ref = append(ref, sdk.op(b, op))
			default:
				goRef = append(goRef, d.timeCreateExec(b, map[string]any{"name": uniqueName(b)}, sdkArgv))
			}
		}
	}
	b.StopTimer()
	reportRatio(b, ours, ref, 1.5)
	b.ReportMetric(ms(median(goRef)), "go-ms")
}

// BenchmarkE2BRunTrue times commands.run('true') in a running sandbox
// against the REST exec of the same command in a running jail.
func BenchmarkE2BRunTrue(b *testing.B) {
	d := shared(b)
	sdk := newSDKBench(b, d)
	j := d.createJail(b, nil)
	sdk.op(b, "run") // creates the sandbox
	sdk.op(b, "rest-run")
	var ours, ref, goRef []time.Duration
	b.ResetTimer()
	for range b.N {
		ours = append(ours, sdk.op(b, "run"))
		ref = append(ref, sdk.op(b, "rest-run"))
		start := time.Now()
		res := d.exec(b, j.ID, execReq{Cmd: sdkArgv})
		goRef = append(goRef, time.Since(start))
		if res.ExitCode != 0 {
			b.Fatalf("exec: %s", &res)
		}
	}
	b.StopTimer()
	reportRatio(b, ours, ref, 1.5)
	b.ReportMetric(ms(median(goRef)), "go-ms")
}

// BenchmarkE2BTemplateCreate times Sandbox.create() of a template built
// with Template.build() (a jail of its image), then commands.run('true'),
// against REST create of a jail of the same image, then the exec; and,
// beside them, the create of a template with a start command (a restore
// of its snapshot, the command running) and each template's build.
func BenchmarkE2BTemplateCreate(b *testing.B) {
	e := newImageEnv(b)
	base := e.pushSDKImage(b, "test/bench-base:1")
	sdk := newSDKBench(b, e.d)
	build, image := sdk.opImage(b, "template-build "+base+" bench-plain")
	buildStarted, _ := sdk.opImage(b, "template-build "+base+" bench-started start")
	var ours, ref, started []time.Duration
	b.ResetTimer()
	for range b.N {
		ours = append(ours, sdk.op(b, "template-create bench-plain"))
		ref = append(ref, sdk.op(b, "rest-image-create "+image))
		started = append(started, sdk.op(b, "template-create bench-started"))
	}
	b.StopTimer()
	reportRatio(b, ours, ref, 1.5)
	b.ReportMetric(ms(median(started)), "start-cmd-ms")
	b.ReportMetric(ms(build), "build-ms")
	b.ReportMetric(ms(buildStarted), "build-start-cmd-ms")
}

// reportRatio reports agentjail's and the reference's medians, their ratio
// and the ratio's target.
func reportRatio(b *testing.B, ours, ref []time.Duration, target float64) {
	mo, mr := median(ours), median(ref)
	b.ReportMetric(ms(mo), "ms")
	b.ReportMetric(ms(mr), "ref-ms")
	b.ReportMetric(float64(mo)/float64(mr), "x-ref")
	b.ReportMetric(target, "target-x")
}
