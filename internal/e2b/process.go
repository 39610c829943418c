package e2b

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/e2b/envd/process"
	"github.com/agentjail/agentjail/internal/e2b/envd/process/processconnect"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/model"
)

// defaultKeepalive is the keepalive interval of a stream whose client
// named none (Keepalive-Ping-Interval, in seconds).
const defaultKeepalive = 50 * time.Second

// startTimeout bounds starting a command or attaching to one.
const startTimeout = 30 * time.Second

// processService serves process.Process on the sandbox's jail.
type processService struct {
	s *Service
}

var _ processconnect.ProcessHandler = (*processService)(nil)

func (p *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	s, sb := p.s, sandboxFrom(ctx)
	m := req.Msg
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd: required"))
	}
	er := model.ExecRequest{Cmd: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: cfg.GetEnvs(), Cwd: cfg.GetCwd(), User: basicUser(req.Header())}
	if env := sb.snapshot().ExecEnv; len(env) > 0 {
		er.Env = maps.Clone(env)
		maps.Copy(er.Env, cfg.GetEnvs())
	}
	// Connect-Timeout-Ms is the command's lifetime, not the stream's.
	if dl, ok := ctx.Deadline(); ok {
		er.TimeoutMs = max(1, time.Until(dl).Milliseconds())
	}
	var pty *model.TerminalRequest
	if m.Pty != nil {
		pty = &model.TerminalRequest{Rows: int(m.GetPty().GetSize().GetRows()), Cols: int(m.GetPty().GetSize().GetCols()), Term: cfg.GetEnvs()["TERM"]}
	}
	ctx, done, err := sb.openStream(ctx)
	if err != nil {
		return s.rpcError(err)
	}
	defer done()
	if er.Cwd != "" {
		cwd, err := s.resolvePath(ctx, sb, er.Cwd, er.User)
		if err != nil {
			return s.rpcError(err)
		}
		er.Cwd = cwd
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
	proc, err := s.jails.StartProcess(sctx, sb.snapshot().JailID, er, m.GetStdin(), pty)
	cancel()
	if err != nil {
		return s.rpcError(err)
	}
	pid := uint32(proc.Started().Pid)
	sb.mu.Lock()
	sb.rec.Procs[pid] = procMeta{Cmd: cfg.GetCmd(), Args: cfg.GetArgs(), Envs: cfg.GetEnvs(), Cwd: cfg.GetCwd(), Tag: m.GetTag(), PTY: pty != nil}
	sb.mu.Unlock()
	// Saved off the request's path: it is for daemon restarts (tags,
	// configs), and the command's output is already on its way.
	go s.persist(sb)
	return follow(ctx, s, req.Header(), proc, pty != nil, func(ev *process.ProcessEvent) error {
		return st.Send(&process.StartResponse{Event: ev})
	})
}

func (p *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], st *connect.ServerStream[process.ConnectResponse]) error {
	s, sb := p.s, sandboxFrom(ctx)
	pid, err := p.pid(ctx, sb, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	ctx, done, err := sb.openStream(ctx)
	if err != nil {
		return s.rpcError(err)
	}
	defer done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
	proc, err := s.jails.AttachProcess(sctx, sb.snapshot().JailID, pid)
	cancel()
	if err != nil {
		return s.rpcError(err)
	}
	sb.mu.Lock()
	isPTY := sb.rec.Procs[uint32(pid)].PTY
	sb.mu.Unlock()
	return follow(ctx, s, req.Header(), proc, isPTY, func(ev *process.ProcessEvent) error {
		return st.Send(&process.ConnectResponse{Event: ev})
	})
}

// follow streams an attached command: start, its output (with
// keepalives while idle), then its end; it detaches (the command keeps
// running) when the client goes away or the sandbox is paused or killed.
func follow(ctx context.Context, s *Service, h http.Header, proc *initclient.Process, pty bool, send func(*process.ProcessEvent) error) error {
	defer proc.Close()
	pid := uint32(proc.Started().Pid)
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		return err
	}
	interval := defaultKeepalive
	if v, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		interval = time.Duration(v) * time.Second
	}
	type chunk struct {
		t    initproto.MsgType
		b    []byte
		err  error
		exit initproto.ExitStatus
	}
	ch := make(chan chunk, 16)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			t, b, err := proc.Next()
			c := chunk{t: t, b: append([]byte(nil), b...), err: err}
			if errors.Is(err, io.EOF) {
				c.exit, _ = proc.Exit()
			}
			select {
			case ch <- c:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	keep := time.NewTimer(interval)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			proc.Close()
			if errors.Is(context.Cause(ctx), errSandboxGone) {
				return s.rpcError(errSandboxGone)
			}
			return s.rpcError(ctx.Err())
		case <-keep.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			keep.Reset(interval)
		case c := <-ch:
			switch {
			case errors.Is(c.err, io.EOF):
				if c.exit.TimedOut {
					return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the command's timeout (timeoutMs) expired; it was killed"))
				}
				return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(c.exit)}})
			case c.err != nil:
				return s.rpcError(c.err)
			}
			var data process.ProcessEvent_DataEvent
			switch {
			case pty:
				data.Output = &process.ProcessEvent_DataEvent_Pty{Pty: c.b}
			case c.t == initproto.MsgStderr:
				data.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: c.b}
			default:
				data.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: c.b}
			}
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &data}}); err != nil {
				return err
			}
			keep.Reset(interval)
		}
	}
}

// endEvent is envd's end event: Go's ProcessState ExitCode and String.
func endEvent(st initproto.ExitStatus) *process.ProcessEvent_EndEvent {
	if st.Signal != "" {
		status := "signal: " + syscall.Signal(unix.SignalNum(st.Signal)).String()
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: status, Error: &status}
	}
	status := "exit status " + strconv.Itoa(st.Code)
	ev := &process.ProcessEvent_EndEvent{ExitCode: int32(st.Code), Exited: true, Status: status}
	if st.Code != 0 {
		ev.Error = &status
	}
	return ev
}

// pid resolves a selector (a pid, or the tag given at Start).
func (p *processService) pid(ctx context.Context, sb *sandbox, sel *process.ProcessSelector) (int, error) {
	if sel == nil {
		return 0, connect.NewError(connect.CodeInvalidArgument, errors.New("process: a pid or tag is required"))
	}
	if tag, ok := sel.GetSelector().(*process.ProcessSelector_Tag); ok {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		for pid, m := range sb.rec.Procs {
			if m.Tag == tag.Tag {
				return int(pid), nil
			}
		}
		return 0, connect.NewError(connect.CodeNotFound, errors.New("no process has tag "+strconv.Quote(tag.Tag)))
	}
	if sel.GetPid() == 0 {
		return 0, connect.NewError(connect.CodeInvalidArgument, errors.New("process: a pid or tag is required"))
	}
	return int(sel.GetPid()), nil
}

func (p *processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	s, sb := p.s, sandboxFrom(ctx)
	cmds, err := s.jails.Commands(ctx, sb.snapshot().JailID)
	if err != nil {
		return nil, s.rpcError(err)
	}
	live := map[uint32]bool{}
	out := &process.ListResponse{}
	sb.mu.Lock()
	for _, c := range cmds {
		pid := uint32(c.Pid)
		live[pid] = true
		info := &process.ProcessInfo{Pid: pid, Config: &process.ProcessConfig{}}
		if m, ok := sb.rec.Procs[pid]; ok {
			info.Config = &process.ProcessConfig{Cmd: m.Cmd, Args: m.Args, Envs: m.Envs}
			if m.Cwd != "" {
				info.Config.Cwd = &m.Cwd
			}
			if m.Tag != "" {
				info.Tag = &m.Tag
			}
		} else if len(c.Argv) > 0 {
			cwd := c.Cwd
			info.Config = &process.ProcessConfig{Cmd: c.Argv[0], Args: c.Argv[1:], Cwd: &cwd}
		}
		out.Processes = append(out.Processes, info)
	}
	for pid := range sb.rec.Procs {
		if !live[pid] {
			delete(sb.rec.Procs, pid)
		}
	}
	sb.mu.Unlock()
	return connect.NewResponse(out), nil
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	s, sb := p.s, sandboxFrom(ctx)
	pid, err := p.pid(ctx, sb, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	data := req.Msg.GetInput().GetStdin()
	if data == nil {
		data = req.Msg.GetInput().GetPty()
	}
	if err := s.jails.ProcessInput(ctx, sb.snapshot().JailID, pid, data, false); err != nil {
		return nil, s.rpcError(err)
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (p *processService) StreamInput(ctx context.Context, st *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	s, sb := p.s, sandboxFrom(ctx)
	pid := 0
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			n, err := p.pid(ctx, sb, ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			pid = n
		case *process.StreamInputRequest_Data:
			if pid == 0 {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start event naming the process"))
			}
			data := ev.Data.GetInput().GetStdin()
			if data == nil {
				data = ev.Data.GetInput().GetPty()
			}
			if err := s.jails.ProcessInput(ctx, sb.snapshot().JailID, pid, data, false); err != nil {
				return nil, s.rpcError(err)
			}
		}
	}
	if err := st.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	s, sb := p.s, sandboxFrom(ctx)
	pid, err := p.pid(ctx, sb, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := s.jails.ProcessInput(ctx, sb.snapshot().JailID, pid, nil, true); err != nil {
		return nil, s.rpcError(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	s, sb := p.s, sandboxFrom(ctx)
	pid, err := p.pid(ctx, sb, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	sig := "SIGKILL"
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	case process.Signal_SIGNAL_SIGKILL:
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("signal: SIGNAL_SIGTERM or SIGNAL_SIGKILL"))
	}
	if err := s.jails.SignalProcess(ctx, sb.snapshot().JailID, pid, sig); err != nil {
		return nil, s.rpcError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (p *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	s, sb := p.s, sandboxFrom(ctx)
	pid, err := p.pid(ctx, sb, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty == nil {
		return connect.NewResponse(&process.UpdateResponse{}), nil
	}
	size := req.Msg.GetPty().GetSize()
	if err := s.jails.ResizeProcess(ctx, sb.snapshot().JailID, pid, int(size.GetRows()), int(size.GetCols())); err != nil {
		return nil, s.rpcError(err)
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
