package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/backend/vm/qmp"
	"github.com/agentjail/agentjail/internal/backend/vm/vmproto"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/netns"
	"github.com/agentjail/agentjail/internal/storage"
)

// Files of a checkpoint in its directory.
const (
	// stateFile is the machine's device state and memory (QEMU's
	// migration stream).
	stateFile = "machine.state"
	// machineFile is the machine the state belongs to (savedMachine).
	machineFile = "machine.json"
)

// migrateTimeout bounds saving or loading a machine's state.
const migrateTimeout = 2 * time.Minute

// savedMachine is what a restore needs to make the same machine again:
// QEMU loads a state only into a machine of the same shape, booted from
// the same images.
type savedMachine struct {
	CPUs   int    `json:"cpus"`
	MemMiB int    `json:"mem_mib"`
	Kernel string `json:"kernel"`
	Initrd string `json:"initrd"`
	Lower  string `json:"lower"`
	Usr    string `json:"usr,omitempty"`
	MAC    string `json:"mac,omitempty"`
}

var _ backend.Checkpointer = (*Backend)(nil)

// Checkpoint implements backend.Checkpointer: the machine is paused, its
// disk reflink-copied and its state (devices and memory) saved, then it
// runs on. Only whole-machine checkpoints exist: the disk alone, written
// by a running guest, would not be consistent.
func (b *Backend) Checkpoint(ctx context.Context, inst backend.Instance, opts backend.CheckpointOptions) (backend.CheckpointResult, error) {
	if !opts.Processes {
		return backend.CheckpointResult{}, backend.Unsupported(config.LevelVM, "snapshot a jail's filesystem alone",
			"the disk belongs to the running machine; take a full snapshot (mode full)")
	}
	p := b.paths(inst)
	spec, err := b.machine(ctx, inst)
	if err != nil {
		return backend.CheckpointResult{}, err
	}
	saved := savedMachine{CPUs: spec.cpus, MemMiB: spec.memMiB, Kernel: spec.kernel, Initrd: spec.initrd, Lower: spec.lower, Usr: spec.usr}
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	q, err := qmp.Dial(ctx, filepath.Join(p.run, qmpSock))
	if err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("jail %s: the machine's monitor: %w", inst.Name, err)
	}
	defer q.Close()
	// The guest leaves its control session, so that the saved machine
	// waits for a new one (the daemon's next connection, here or in a
	// restored copy).
	sess := b.session(inst)
	var rep vmproto.Reply
	if err := sess.request(ctx, vmproto.KindPark, struct{}{}, &rep); err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("jail %s: %w", inst.Name, err)
	}
	// No new session until the machine runs again: a connection made
	// meanwhile (an exec, the event stream) would wake the guest in the
	// saved state, where its restored copies would find it.
	release, err := sess.hold(ctx)
	if err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("jail %s: %w", inst.Name, err)
	}
	defer release()
	sess.close()
	t0 := time.Now()
	if err := q.Run(ctx, "stop", nil); err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("jail %s: pause the machine: %w", inst.Name, err)
	}
	res, err := func() (backend.CheckpointResult, error) {
		if err := storage.CloneFile(b.opts.Pool.DiskPath(inst.ID), opts.DiskImage); err != nil {
			return backend.CheckpointResult{}, fmt.Errorf("jail %s: copy the disk: %w", inst.Name, err)
		}
		state := filepath.Join(opts.Dir, stateFile)
		if err := q.Run(ctx, "migrate", map[string]any{"uri": "exec:cat > " + shellQuote(state)}); err != nil {
			return backend.CheckpointResult{}, fmt.Errorf("jail %s: save the machine: %w", inst.Name, err)
		}
		if err := q.WaitMigration(ctx, 10*time.Millisecond); err != nil {
			return backend.CheckpointResult{}, fmt.Errorf("jail %s: save the machine: %w", inst.Name, err)
		}
		fi, err := os.Stat(state)
		if err != nil {
			return backend.CheckpointResult{}, err
		}
		data, err := json.Marshal(saved)
		if err != nil {
			return backend.CheckpointResult{}, err
		}
		if err := atomicfile.WriteFile(filepath.Join(opts.Dir, machineFile), data, 0o600); err != nil {
			return backend.CheckpointResult{}, err
		}
		return backend.CheckpointResult{ProcessBytes: fi.Size()}, nil
	}()
	// The jail runs on, whatever happened.
	if cerr := q.Run(context.WithoutCancel(ctx), "cont", nil); cerr != nil {
		err = errors.Join(err, fmt.Errorf("jail %s: resume the machine: %w", inst.Name, cerr))
	}
	res.Frozen = time.Since(t0)
	return res, err
}

// Restore implements backend.Checkpointer: a new machine of the saved
// shape loads the saved state on a copy of the saved disk, joins the
// jail's own network, and runs on; the guest then takes the new
// network, clock and host name.
func (b *Backend) Restore(ctx context.Context, inst backend.Instance, src backend.RestoreSource) (st backend.Status, err error) {
	if !src.Processes {
		return backend.Status{}, backend.Unsupported(config.LevelVM, "restore a filesystem snapshot", "vm snapshots are whole machines")
	}
	p := b.paths(inst)
	defer func() {
		if err != nil {
			if derr := b.Destroy(context.WithoutCancel(ctx), inst); derr != nil {
				b.opts.Log.Error("releasing a failed restore", "jail", inst.ID, "err", derr)
			}
		}
	}()
	data, err := os.ReadFile(filepath.Join(src.Dir, machineFile))
	if err != nil {
		return backend.Status{}, fmt.Errorf("the snapshot's machine: %w", err)
	}
	var saved savedMachine
	if err := json.Unmarshal(data, &saved); err != nil {
		return backend.Status{}, fmt.Errorf("the snapshot's machine: %w", err)
	}
	for _, f := range []string{saved.Kernel, saved.Initrd, saved.Lower, saved.Usr} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return backend.Status{}, fmt.Errorf("the snapshot's machine booted from %s, which is gone (the guest kernel, the daemon or the host's /usr changed since): %w", f, err)
		}
	}
	if err := storage.CloneFile(src.DiskImage, b.opts.Pool.DiskPath(inst.ID)); err != nil {
		return backend.Status{}, fmt.Errorf("jail disk: %w", err)
	}
	if err := os.MkdirAll(p.run, 0o700); err != nil {
		return backend.Status{}, err
	}
	if err := netns.Create(p.netns); err != nil {
		return backend.Status{}, fmt.Errorf("network namespace: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	att, err := b.net.Attach(ctx, inst, p.netns)
	if err != nil {
		return backend.Status{}, err
	}
	spec := machineSpec{
		dir: p.run, accel: b.accel, kernel: saved.Kernel, initrd: saved.Initrd, tscKHz: b.tscKHz,
		cpus: saved.CPUs, memMiB: saved.MemMiB, lower: saved.Lower, usr: saved.Usr,
		upper: b.opts.Pool.DiskPath(inst.ID), incoming: true,
	}
	resume := vmproto.Resume{
		UnixNano: time.Now().UnixNano(), Hostname: inst.Hostname,
		ResolvConf: att.ResolvConf, CAPEM: att.CAPEM, CAPath: att.CAPath,
	}
	pid, err := b.launch(ctx, inst, spec, att, &resume)
	if err != nil {
		return backend.Status{}, err
	}
	q, err := qmp.Dial(ctx, filepath.Join(p.run, qmpSock))
	if err != nil {
		return backend.Status{}, fmt.Errorf("the machine's monitor: %w", err)
	}
	defer q.Close()
	state := filepath.Join(src.Dir, stateFile)
	if err := q.Run(ctx, "migrate-incoming", map[string]any{"uri": "exec:cat " + shellQuote(state)}); err != nil {
		return backend.Status{}, fmt.Errorf("load the machine: %w", err)
	}
	if err := q.WaitMigration(ctx, 10*time.Millisecond); err != nil {
		return backend.Status{}, fmt.Errorf("load the machine: %w", err)
	}
	st = backend.Status{Running: true, Pid: pid}
	if inst.OnCreated != nil {
		if err := inst.OnCreated(st); err != nil {
			return backend.Status{}, err
		}
	}
	if err := q.Run(ctx, "cont", nil); err != nil {
		return backend.Status{}, fmt.Errorf("resume the machine: %w", err)
	}
	sess := b.session(inst)
	var rep vmproto.Reply
	if err := sess.request(ctx, vmproto.KindResume, &resume, &rep); err != nil {
		return backend.Status{}, fmt.Errorf("resume the guest: %w%s", err, consoleTail(p.run))
	}
	sess.markReady()
	return st, nil
}

// Recover implements backend.Checkpointer: a checkpoint interrupted by a
// daemon crash may have left the machine paused; it runs on.
func (b *Backend) Recover(ctx context.Context, inst backend.Instance) error {
	pid, err := readPid(b.paths(inst).run)
	if err != nil || pid == 0 {
		return err
	}
	q, err := qmp.Dial(ctx, filepath.Join(b.paths(inst).run, qmpSock))
	if err != nil {
		return fmt.Errorf("jail %s: the machine's monitor: %w", inst.Name, err)
	}
	defer q.Close()
	status, err := q.Status(ctx)
	if err != nil {
		return err
	}
	switch status {
	case "paused", "postmigrate", "finish-migrate":
		if status == "finish-migrate" {
			// A save still at work: let it end first.
			if err := q.WaitMigration(ctx, 10*time.Millisecond); err != nil {
				b.opts.Log.Warn("an interrupted machine save", "jail", inst.ID, "err", err)
			}
		}
		return q.Run(ctx, "cont", nil)
	}
	return nil
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, `'\''`...)
			continue
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}
