// SPDX-License-Identifier: GPL-2.0-only
/*
 * Kernel side of agentjail's observation layer.
 *
 * One set of programs serves every jail. Each program first looks the
 * current task's cgroup id (cgroup v2) up in `watched`; tasks of cgroups that
 * are not watched leave after that lookup. Records go to one ring buffer
 * without wake-ups (BPF_RB_NO_WAKEUP): the consumer polls the ring on a short
 * period and drains it whenever it holds data. A record that does not fit in
 * the ring is counted in its jail's `lost` counter.
 *
 * The jail's own plumbing is left out of the syscall stream: the processes
 * its init starts for its work (command shims) and each child a shim forks,
 * until that child executes the command. Which processes these are is
 * followed by ancestry, so no process the jail's user starts can join them.
 * Init's own calls are left out too, but for those of the threads it marks
 * while they work on files for the files API (INIT_RECORD_OPTION).
 *
 * Runs of identical calls are counted here instead of crossing the ring one
 * by one. A task whose descriptor table is its own keeps up to RUN_SLOTS
 * runs (number, arguments, return value): the first call of a run is
 * recorded at once, as any other; its repetitions only add to the run's
 * count, last start and summed duration. The repetitions are recorded as
 * one counted record when the task enters a call that is never counted
 * (one that may change what a descriptor means), when a call takes the
 * place of a run, when a run is older than hold_ns, when the task leaves a
 * CPU (it blocked, or another task runs) and when it exits: so they wait in
 * the kernel no longer than the task keeps running on its CPU, and every
 * call that changes a private descriptor table comes after the repetitions
 * made before it.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "include/kernel.h"

#include "observe.h"

char LICENSE[] SEC("license") = "GPL";

/* Load-time configuration (set from Go before loading): which arguments of
 * each syscall are decoded (SPEC_* in observe.h), which calls may be
 * counted in runs (bit nr), and how long a run is held at most. */
const volatile u32 argspec[MAX_SYSCALLS];
const volatile u64 coalesce_mask[MAX_SYSCALLS / 64];
const volatile u64 hold_ns = 5000000;

/* A filter before the watch table, set from Go: bit (id % WATCH_BITS) is
 * set while a cgroup with that id is watched. Most tasks of the host leave
 * at this test, without a call. */
#define WATCH_BITS 4096
u64 watch_bits[WATCH_BITS / 64];

/* Counts the changes of the watch table, set from Go after each one. */
u32 watch_epoch;

static __always_inline int maybe_watched(u64 cg)
{
	return (watch_bits[(cg >> 6) & (WATCH_BITS / 64 - 1)] >> (cg & 63)) & 1;
}

/* cgroup_of returns the id of t's cgroup v2: bpf_get_current_cgroup_id()
 * without the call, for the programs every syscall of the host runs. */
static __always_inline u64 cgroup_of(struct task_struct *t)
{
	return t->cgroups->dfl_cgrp->kn->id;
}

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_WATCHED);
	__type(key, u64);
	__type(value, struct watch);
} watched SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} events SEC(".maps");

/* A run of identical calls: the first was recorded, count repetitions
 * since, the earliest starting at ts, the latest at last_ts. */
struct run {
	u64 args[6];
	s64 ret;
	u64 cg;
	u64 ts;
	u64 last_ts;
	u64 dur;
	char comm[16];
	u32 nr;
	u32 count;
};

/* A task's state: the syscall in flight (what sys_enter saw, for sys_exit
 * to complete) and its runs. */
struct pending {
	u64 ts;
	u64 cg; /* the watched cgroup it was entered in */
	u64 args[6];
	u32 nr;
	u32 active;
	u32 ns_tgid;
	u32 ns_tid;
	u32 ns_valid;
	u32 record; /* a thread of init marked as recorded */
	/* A thread of a plumbing process: a child of a jail's init (a
	 * shim), or of a plumbing process until it executes (the command). */
	u32 plumbing;
	u32 nruns;
	struct run runs[RUN_SLOTS];
	/* A copy of the watch of cgroup wcg, as it was at watch_epoch
	 * wepoch: sys_enter looks the table up only when either changed. */
	u64 wcg;
	u32 wepoch;
	u32 wflags;
	u32 winit;
	u32 wpad;
	u64 wmask[8];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pending);
} inflight SEC(".maps");

/* Record types are only ever used through pointers into the ring, which
 * leaves them out of the object's BTF; these unused globals keep them in,
 * for bpf2go to generate their Go counterparts (-type). */
const struct sys_ev *unused_sys_ev __attribute__((unused));
const struct fork_ev *unused_fork_ev __attribute__((unused));
const struct exec_ev *unused_exec_ev __attribute__((unused));
const struct exit_ev *unused_exit_ev __attribute__((unused));

static __always_inline void count_lost(struct watch *w)
{
	__sync_fetch_and_add(&w->lost, 1);
}

/* count_lost_cg counts a lost record of cgroup cg, if it is still watched. */
static __always_inline void count_lost_cg(u64 cg)
{
	struct watch *w = bpf_map_lookup_elem(&watched, &cg);

	if (w)
		count_lost(w);
}

/* pid_at returns the number of pid p in the namespace at level, or 0 when p
 * is not visible there. */
static __always_inline u32 pid_at(struct pid *p, u32 level)
{
	struct upid up = {};
	u64 addr;

	if (!p || BPF_CORE_READ(p, level) < level)
		return 0;
	addr = (u64)p + bpf_core_field_offset(struct pid, numbers) +
	       (u64)level * bpf_core_type_size(struct upid);
	bpf_probe_read_kernel(&up, sizeof(up), (void *)addr);
	return up.nr;
}

static __always_inline u32 pid_level(struct task_struct *t)
{
	return BPF_CORE_READ(t, thread_pid, level);
}

static __always_inline void ns_ids(struct task_struct *t, u32 *ns_tgid, u32 *ns_tid)
{
	u32 level = pid_level(t);

	*ns_tid = pid_at(BPF_CORE_READ(t, thread_pid), level);
	*ns_tgid = pid_at(BPF_CORE_READ(t, group_leader, thread_pid), level);
}

/* fill_ids fills a record header of the current task but for its command
 * name and namespace ids. */
static __always_inline void fill_ids(struct hdr *h, u32 kind, u64 cg, u64 ts)
{
	u64 id = bpf_get_current_pid_tgid();

	h->kind = kind;
	h->flags = 0;
	h->cgroup = cg;
	h->ts = ts;
	h->tgid = id >> 32;
	h->tid = (u32)id;
}

static __always_inline void fill_hdr(struct hdr *h, u32 kind, u64 cg, u64 ts)
{
	fill_ids(h, kind, cg, ts);
	bpf_get_current_comm(h->comm, sizeof(h->comm));
}

static __always_inline void task_ns_hdr(struct hdr *h, struct task_struct *t)
{
	ns_ids(t, &h->ns_tgid, &h->ns_tid);
}

/* fill_call fills a syscall record of the current task t but for its
 * command name: a call, or a run of calls (count and last_ts are then set
 * by the caller). */
static __always_inline void fill_call(struct sys_ev *e, struct task_struct *t, struct pending *p,
				      u64 cg, u64 ts, u32 nr, const u64 *args, s64 ret, u64 dur)
{
	fill_ids(&e->h, EV_SYSCALL, cg, ts);
	if (!p->ns_valid) {
		ns_ids(t, &p->ns_tgid, &p->ns_tid);
		p->ns_valid = 1;
	}
	e->h.ns_tgid = p->ns_tgid;
	e->h.ns_tid = p->ns_tid;
	e->nr = nr;
	e->len0 = 0;
	e->len1 = 0;
	e->args[0] = args[0];
	e->args[1] = args[1];
	e->args[2] = args[2];
	e->args[3] = args[3];
	e->args[4] = args[4];
	e->args[5] = args[5];
	e->ret = ret;
	e->dur = dur;
	e->aux[0] = -1;
	e->aux[1] = -1;
	e->last_ts = 0;
	e->count = 0;
	e->pad = 0;
}

static __always_inline void fill_sys(struct sys_ev *e, u64 cg, struct task_struct *t,
				     struct pending *p, s64 ret, u64 now)
{
	fill_call(e, t, p, cg, p->ts, p->nr, p->args, ret, now ? now - p->ts : 0);
	bpf_get_current_comm(e->h.comm, sizeof(e->h.comm));
}

/* emit_run records the repetitions of run r of the current task t. */
static __always_inline void emit_run(struct task_struct *t, struct pending *p, struct run *r)
{
	struct sys_ev *e;

	if (!r->count)
		return;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		struct watch *w = bpf_map_lookup_elem(&watched, &r->cg);

		if (w)
			__sync_fetch_and_add(&w->lost, 1);
		return;
	}
	fill_call(e, t, p, r->cg, r->ts, r->nr, r->args, r->ret, r->dur);
	__builtin_memcpy(e->h.comm, r->comm, sizeof(e->h.comm));
	e->last_ts = r->last_ts;
	e->count = r->count;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	r->count = 0;
}

/* emit_runs records the repetitions the current task t holds; its runs
 * stay, for its next calls to count. */
static __always_inline void emit_runs(struct task_struct *t, struct pending *p)
{
	if (p->nruns > 0)
		emit_run(t, p, &p->runs[0]);
	if (p->nruns > 1)
		emit_run(t, p, &p->runs[1]);
}

/* flush_runs records the repetitions the current task t holds and forgets
 * its runs. */
static __always_inline void flush_runs(struct task_struct *t, struct pending *p)
{
	emit_runs(t, p);
	p->nruns = 0;
}

static __always_inline int coalescible(u32 nr)
{
	return (coalesce_mask[(nr >> 6) & (MAX_SYSCALLS / 64 - 1)] >> (nr & 63)) & 1;
}

static __always_inline int same_args(const u64 *a, const u64 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] &&
	       a[5] == b[5];
}

/* own_files reports whether no other task shares t's descriptor table. */
static __always_inline int own_files(struct task_struct *t)
{
	struct files_struct *f = t->files;

	return f && f->count.counter == 1;
}

/* hold counts the call p completed at sys_exit (ret, ended at now) into a
 * run of the current task t, and reports whether it did: a repetition,
 * which is not recorded now. A call that starts a run is recorded by the
 * caller. */
static __always_inline int hold(struct task_struct *t, struct pending *p, s64 ret, u64 now)
{
	struct run *r;
	u32 i;

	if (!coalescible(p->nr) || !own_files(t)) {
		flush_runs(t, p);
		return 0;
	}
	for (i = 0; i < RUN_SLOTS; i++) {
		if (i >= p->nruns)
			break;
		r = &p->runs[i];
		if (r->nr != p->nr || r->ret != ret || r->cg != p->cg || !same_args(r->args, p->args))
			continue;
		if (!r->count)
			r->ts = p->ts;
		r->count++;
		r->last_ts = p->ts;
		r->dur += now - p->ts;
		if (p->ts - r->ts >= hold_ns || r->count >= RUN_MAX)
			emit_run(t, p, r);
		return 1;
	}
	if (p->nruns >= RUN_SLOTS)
		flush_runs(t, p);
	r = &p->runs[p->nruns & (RUN_SLOTS - 1)];
	r->nr = p->nr;
	r->cg = p->cg;
	r->ret = ret;
	__builtin_memcpy(r->args, p->args, sizeof(r->args));
	r->count = 0;
	r->dur = 0;
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	p->nruns++;
	return 0;
}

static __always_inline u64 arg_at(struct pending *p, u32 idx)
{
	/* idx is 1-based; 0 means "none". */
	switch (idx) {
	case 1: return p->args[0];
	case 2: return p->args[1];
	case 3: return p->args[2];
	case 4: return p->args[3];
	case 5: return p->args[4];
	case 6: return p->args[5];
	}
	return 0;
}

static __always_inline u16 read_path(char *dst, u64 uptr)
{
	long n;

	if (!uptr)
		return 0;
	n = bpf_probe_read_user_str(dst, STR_MAX, (const void *)uptr);
	return n > 0 ? (u16)n : 0;
}

static __always_inline u16 read_sockaddr(char *dst, struct pending *p, u32 spec, s64 ret)
{
	u64 addr = arg_at(p, SPEC_SA(spec));
	u64 lenarg = arg_at(p, SPEC_SALEN(spec));
	u32 len = 0;

	if (!addr)
		return 0;
	if (spec & SPEC_SALEN_PTR) {
		/* The kernel filled the address and its length on return. */
		if (ret < 0 || !lenarg)
			return 0;
		bpf_probe_read_user(&len, sizeof(len), (const void *)lenarg);
	} else {
		len = (u32)lenarg;
	}
	if (len > SOCKADDR_MAX)
		len = SOCKADDR_MAX;
	barrier_var(len);
	len &= SOCKADDR_MAX * 2 - 1;
	if (len == 0)
		return 0;
	if (bpf_probe_read_user(dst, len, (const void *)addr))
		return 0;
	return (u16)len;
}

static __always_inline void emit_syscall(u64 cg, struct task_struct *t, struct pending *p, s64 ret,
					 u64 now)
{
	u32 nr = p->nr & (MAX_SYSCALLS - 1);
	u32 spec = argspec[nr];
	int strings = 1;

	if ((spec & SPEC_NOSTR_OK) && ret == 0)
		strings = 0;

	if (strings && SPEC_P2(spec)) {
		struct sys_ev2 *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
		if (!e) {
			count_lost_cg(cg);
			return;
		}
		fill_sys(&e->e, cg, t, p, ret, now);
		e->e.len0 = read_path(e->s0, arg_at(p, SPEC_P1(spec)));
		e->e.len1 = read_path(e->s1, arg_at(p, SPEC_P2(spec)));
		bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
		return;
	}
	if (strings && (SPEC_P1(spec) || SPEC_SA(spec))) {
		struct sys_ev1 *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
		if (!e) {
			count_lost_cg(cg);
			return;
		}
		fill_sys(&e->e, cg, t, p, ret, now);
		if (SPEC_P1(spec))
			e->e.len0 = read_path(e->s0, arg_at(p, SPEC_P1(spec)));
		else
			e->e.len0 = read_sockaddr(e->s0, p, spec, ret);
		bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
		return;
	}

	struct sys_ev *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost_cg(cg);
		return;
	}
	fill_sys(e, cg, t, p, ret, now);
	if (SPEC_FDPAIR(spec) && ret == 0) {
		s32 fds[2] = {-1, -1};
		u64 ptr = arg_at(p, SPEC_FDPAIR(spec));
		if (ptr && !bpf_probe_read_user(fds, sizeof(fds), (const void *)ptr)) {
			e->aux[0] = fds[0];
			e->aux[1] = fds[1];
		}
	}
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter, struct pt_regs *regs, long id)
{
	struct task_struct *t = bpf_get_current_task_btf();
	u64 cg = cgroup_of(t);
	struct watch *w;
	struct pending *p;
	u32 nr, tgid, epoch;

	if (!maybe_watched(cg))
		return 0;
	p = bpf_task_storage_get(&inflight, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!p)
		return 0;
	/* The epoch is read before the table: a change after it is seen at
	 * the next call. */
	epoch = watch_epoch;
	if (p->wcg != cg || p->wepoch != epoch) {
		w = bpf_map_lookup_elem(&watched, &cg);
		if (!w)
			return 0;
		p->wcg = cg;
		p->wepoch = epoch;
		p->wflags = w->flags;
		p->winit = w->init_tgid;
		__builtin_memcpy(p->wmask, w->mask, sizeof(p->wmask));
	}
	if (!(p->wflags & W_SYSCALLS) || id < 0 || id >= MAX_SYSCALLS)
		return 0;
	nr = (u32)id;
	tgid = t->tgid;
	if (tgid == p->winit) {
		/* Init's calls are recorded on the threads it marks only; the
		 * marks themselves are not recorded. */
		if (nr == NR_PRCTL && regs->di == INIT_RECORD_OPTION) {
			p->record = regs->si != 0;
			return 0;
		}
		if (!p->record)
			return 0;
	}
	if (!(p->wmask[(nr >> 6) & 7] & (1ULL << (nr & 63))))
		return 0;
	/* A plumbing process's execve is kept: it starts the command. */
	if (p->plumbing && nr != NR_EXECVE && nr != NR_EXECVEAT)
		return 0;
	p->ts = bpf_ktime_get_ns();
	p->cg = cg;
	p->nr = nr;
	p->args[0] = regs->di;
	p->args[1] = regs->si;
	p->args[2] = regs->dx;
	p->args[3] = regs->r10;
	p->args[4] = regs->r8;
	p->args[5] = regs->r9;
	p->active = 1;
	/* A call that is never counted in runs (it may change what a
	 * descriptor means) ends the runs: their repetitions come before it. */
	if (p->nruns && !coalescible(nr))
		flush_runs(t, p);

	/* exit and exit_group never return: record them now. */
	if (nr == NR_EXIT || nr == NR_EXIT_GROUP) {
		p->active = 0;
		emit_syscall(cg, t, p, 0, 0);
	}
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit, struct pt_regs *regs, long ret)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct pending *p;
	u64 now;

	/* The task's own storage only: a task that sys_enter did not record
	 * has none, and one it recorded carries its cgroup; the watch is
	 * looked up again only to count a record the ring had no room for. A
	 * call entered before its jail was unwatched is recorded and left out
	 * by the reader, unless the filter already left it out here. */
	if (!maybe_watched(cgroup_of(t)))
		return 0;
	p = bpf_task_storage_get(&inflight, t, 0, 0);
	if (!p || !p->active)
		return 0;
	p->active = 0;
	/* An execve that left its caller plumbing started a shim (or failed
	 * to start a command). */
	if (p->plumbing)
		return 0;
	now = bpf_ktime_get_ns();
	if (hold(t, p, ret, now))
		return 0;
	emit_syscall(p->cg, t, p, ret, now);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_fork, struct task_struct *parent, struct task_struct *child)
{
	u64 cg = bpf_get_current_cgroup_id();
	struct watch *w = bpf_map_lookup_elem(&watched, &cg);
	struct task_struct *rparent;
	struct pending *ps, *cs;
	struct fork_ev *e;
	u32 level, ptgid, ctgid, plumbing;

	if (!w || !child)
		return 0;
	ptgid = BPF_CORE_READ(parent, tgid);
	ctgid = BPF_CORE_READ(child, tgid);
	/* The parent is the current task. A thread is plumbing where its
	 * process is; a new process where its parent is init or plumbing. */
	ps = bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0, 0);
	plumbing = ps && ps->plumbing;
	if (ctgid != ptgid && ptgid == w->init_tgid)
		plumbing = 1;
	if (plumbing) {
		cs = bpf_task_storage_get(&inflight, child, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (cs)
			cs->plumbing = 1;
	}
	if (!(w->flags & W_PROC))
		return 0;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost(w);
		return 0;
	}
	fill_hdr(&e->h, EV_FORK, cg, bpf_ktime_get_ns());
	task_ns_hdr(&e->h, parent);
	e->child_tgid = BPF_CORE_READ(child, tgid);
	e->child_tid = BPF_CORE_READ(child, pid);
	ns_ids(child, &e->child_ns_tgid, &e->child_ns_tid);
	rparent = BPF_CORE_READ(child, real_parent);
	e->ppid = BPF_CORE_READ(rparent, tgid);
	level = pid_level(child);
	e->ns_ppid = pid_at(BPF_CORE_READ(rparent, group_leader, thread_pid), level);
	e->fflags = 0;
	if (e->child_tgid == BPF_CORE_READ(parent, tgid))
		e->fflags |= FORK_THREAD;
	if (BPF_CORE_READ(child, files) == BPF_CORE_READ(parent, files))
		e->fflags |= FORK_SHARED_FILES;
	e->pad = 0;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

/* Scratch space of the working-directory walk (one per CPU). */
struct cwd_buf {
	char b[CWD_MAX + NAME_BUF];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cwd_buf);
} cwd_scratch SEC(".maps");

struct cwd_walk {
	struct dentry *d;
	struct vfsmount *mnt;
	struct dentry *root;
	struct vfsmount *rootmnt;
	u64 mnt_off;
	u32 off;
	u32 truncated;
};

/* One step of the walk from the working directory up to the task's root:
 * appends the current component (NUL-terminated) or crosses a mount. */
static long cwd_step(u32 i, struct cwd_walk *w)
{
	u32 zero = 0;
	struct cwd_buf *buf = bpf_map_lookup_elem(&cwd_scratch, &zero);
	/* Copies of the walk's pointers: BPF_CORE_READ must not see w itself,
	 * which is not a kernel type. */
	struct dentry *d = w->d;
	struct vfsmount *mnt = w->mnt;
	struct dentry *parent;
	long n;

	if (!buf)
		return 1;
	if (d == w->root && mnt == w->rootmnt)
		return 1;
	if (d == BPF_CORE_READ(mnt, mnt_root)) {
		struct mount *m = (struct mount *)((u64)mnt - w->mnt_off);
		struct mount *pm = BPF_CORE_READ(m, mnt_parent);

		if (pm == m)
			return 1;
		w->d = BPF_CORE_READ(m, mnt_mountpoint);
		w->mnt = (struct vfsmount *)((u64)pm + w->mnt_off);
		return 0;
	}
	parent = BPF_CORE_READ(d, d_parent);
	if (parent == d)
		return 1;
	n = bpf_probe_read_kernel_str(buf->b + (w->off & (CWD_MAX - 1)), NAME_BUF,
				      BPF_CORE_READ(d, d_name.name));
	if (n <= 0)
		return 1;
	w->off += n;
	if (w->off >= CWD_MAX) {
		w->truncated = 1;
		return 1;
	}
	w->d = parent;
	return 0;
}

/* cwd_of copies the components of t's working directory into dst, leaf
 * first, each NUL-terminated, stopping at t's root; it returns the bytes
 * used (CWD_MAX when the path was truncated). */
static __always_inline u16 cwd_of(struct task_struct *t, char *dst)
{
	struct fs_struct *fs = BPF_CORE_READ(t, fs);
	struct cwd_walk w = {
		.d = BPF_CORE_READ(fs, pwd.dentry),
		.mnt = BPF_CORE_READ(fs, pwd.mnt),
		.root = BPF_CORE_READ(fs, root.dentry),
		.rootmnt = BPF_CORE_READ(fs, root.mnt),
		.mnt_off = bpf_core_field_offset(struct mount, mnt),
	};
	u32 zero = 0;
	struct cwd_buf *buf;

	bpf_loop(CWD_DEPTH, cwd_step, &w, 0);
	buf = bpf_map_lookup_elem(&cwd_scratch, &zero);
	if (!buf)
		return 0;
	if (w.truncated)
		w.off = CWD_MAX;
	bpf_probe_read_kernel(dst, CWD_MAX, buf->b);
	return w.off > CWD_MAX ? CWD_MAX : w.off;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(sched_exec, struct task_struct *p, int old_pid, struct linux_binprm *bprm)
{
	u64 cg = bpf_get_current_cgroup_id();
	struct watch *w = bpf_map_lookup_elem(&watched, &cg);
	struct task_struct *rparent;
	struct pending *st;
	struct exec_ev *e;
	u64 start, end, len, ugid;
	long n;

	if (!w)
		return 0;
	/* The thread id may have changed: forget the cached namespace ids.
	 * Init only starts shims; a shim's child that executes is the
	 * command, which is recorded from here on. */
	st = bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0, 0);
	if (st) {
		st->ns_valid = 0;
		if (BPF_CORE_READ(p, real_parent, tgid) != w->init_tgid)
			st->plumbing = 0;
	}
	if (!(w->flags & W_PROC))
		return 0;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost(w);
		return 0;
	}
	fill_hdr(&e->h, EV_EXEC, cg, bpf_ktime_get_ns());
	task_ns_hdr(&e->h, p);
	e->old_tid = old_pid;
	ugid = bpf_get_current_uid_gid();
	e->uid = (u32)ugid;
	e->gid = ugid >> 32;
	rparent = BPF_CORE_READ(p, real_parent);
	e->ppid = BPF_CORE_READ(rparent, tgid);
	e->ns_ppid = pid_at(BPF_CORE_READ(rparent, group_leader, thread_pid), pid_level(p));

	n = bpf_probe_read_kernel_str(e->file, STR_MAX, BPF_CORE_READ(bprm, filename));
	e->file_len = n > 0 ? n : 0;

	start = BPF_CORE_READ(p, mm, arg_start);
	end = BPF_CORE_READ(p, mm, arg_end);
	len = end > start ? end - start : 0;
	e->argv_trunc = len >= ARGV_MAX;
	if (len >= ARGV_MAX)
		len = ARGV_MAX - 1;
	barrier_var(len);
	len &= ARGV_MAX - 1;
	e->argv_len = 0;
	if (len > 0 && !bpf_probe_read_user(e->argv, len, (const void *)start))
		e->argv_len = len;

	e->cwd_len = cwd_of(p, e->cwd);
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(sched_exit, struct task_struct *p, bool group_dead)
{
	u64 cg = bpf_get_current_cgroup_id();
	struct watch *w = bpf_map_lookup_elem(&watched, &cg);
	struct task_struct *t = bpf_get_current_task_btf();
	struct task_struct *rparent;
	struct pending *st;
	struct exit_ev *e;

	if (!w)
		return 0;
	st = bpf_task_storage_get(&inflight, t, 0, 0);
	if (st)
		flush_runs(t, st);
	if (!(w->flags & W_PROC))
		return 0;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost(w);
		return 0;
	}
	fill_hdr(&e->h, EV_EXIT, cg, bpf_ktime_get_ns());
	task_ns_hdr(&e->h, p);
	e->exit_code = BPF_CORE_READ(p, exit_code);
	e->group_dead = group_dead;
	rparent = BPF_CORE_READ(p, real_parent);
	e->ppid = BPF_CORE_READ(rparent, tgid);
	e->ns_ppid = pid_at(BPF_CORE_READ(rparent, group_leader, thread_pid), pid_level(p));
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

/* A task leaving its CPU records the repetitions it holds: it blocked, or
 * another task runs, so they would wait for as long. The switch happens on the task's own CPU, while it is
 * still the current task; tasks of cgroups not watched leave at the filter,
 * as at every syscall. */
SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	struct pending *p;

	if (!prev || !maybe_watched(cgroup_of(prev)))
		return 0;
	p = bpf_task_storage_get(&inflight, prev, 0, 0);
	if (p)
		emit_runs(prev, p);
	return 0;
}
