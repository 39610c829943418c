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
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "include/kernel.h"

#include "observe.h"

char LICENSE[] SEC("license") = "GPL";

/* Load-time configuration (set from Go before loading): which arguments of
 * each syscall are decoded (SPEC_* in observe.h). */
const volatile u32 argspec[MAX_SYSCALLS];

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

/* The plumbing processes (host tgids): the children of a jail's init (its
 * shims), and the children of those until they execute (the command). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_PLUMBING);
	__type(key, u32);
	__type(value, u8);
} plumbing SEC(".maps");

/* A syscall in flight: what sys_enter saw, for sys_exit to complete. */
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

static __always_inline void fill_hdr(struct hdr *h, u32 kind, u64 cg, u64 ts)
{
	u64 id = bpf_get_current_pid_tgid();

	h->kind = kind;
	h->flags = 0;
	h->cgroup = cg;
	h->ts = ts;
	h->tgid = id >> 32;
	h->tid = (u32)id;
	bpf_get_current_comm(h->comm, sizeof(h->comm));
}

static __always_inline void task_ns_hdr(struct hdr *h, struct task_struct *t)
{
	ns_ids(t, &h->ns_tgid, &h->ns_tid);
}

static __always_inline void fill_sys(struct sys_ev *e, u64 cg, struct task_struct *t,
				     struct pending *p, s64 ret, u64 now)
{
	fill_hdr(&e->h, EV_SYSCALL, cg, p->ts);
	if (!p->ns_valid) {
		ns_ids(t, &p->ns_tgid, &p->ns_tid);
		p->ns_valid = 1;
	}
	e->h.ns_tgid = p->ns_tgid;
	e->h.ns_tid = p->ns_tid;
	e->nr = p->nr;
	e->len0 = 0;
	e->len1 = 0;
	e->args[0] = p->args[0];
	e->args[1] = p->args[1];
	e->args[2] = p->args[2];
	e->args[3] = p->args[3];
	e->args[4] = p->args[4];
	e->args[5] = p->args[5];
	e->ret = ret;
	e->dur = now ? now - p->ts : 0;
	e->aux[0] = -1;
	e->aux[1] = -1;
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
	u64 cg = bpf_get_current_cgroup_id();
	struct watch *w = bpf_map_lookup_elem(&watched, &cg);
	struct task_struct *t;
	struct pending *p;
	u32 nr, tgid;

	if (!w)
		return 0;
	if (!(w->flags & W_SYSCALLS) || id < 0 || id >= MAX_SYSCALLS)
		return 0;
	nr = (u32)id;
	tgid = bpf_get_current_pid_tgid() >> 32;
	t = bpf_get_current_task_btf();
	if (tgid == w->init_tgid) {
		/* Init's calls are recorded on the threads it marks only; the
		 * marks themselves are not recorded. */
		if (nr == NR_PRCTL && regs->di == INIT_RECORD_OPTION) {
			p = bpf_task_storage_get(&inflight, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
			if (p)
				p->record = regs->si != 0;
			return 0;
		}
		p = bpf_task_storage_get(&inflight, t, 0, 0);
		if (!p || !p->record)
			return 0;
	}
	if (!(w->mask[(nr >> 6) & 7] & (1ULL << (nr & 63))))
		return 0;
	/* A plumbing process's execve is kept: it starts the command. */
	if (nr != NR_EXECVE && nr != NR_EXECVEAT && bpf_map_lookup_elem(&plumbing, &tgid))
		return 0;

	p = bpf_task_storage_get(&inflight, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!p)
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

	/* The task's own storage only: a task that sys_enter did not record
	 * (every untraced host process) has none, and one it recorded carries
	 * its cgroup; the watch is looked up again only to count a record the
	 * ring had no room for. A call entered before its jail was unwatched
	 * is recorded and left out by the reader. */
	p = bpf_task_storage_get(&inflight, t, 0, 0);
	if (!p || !p->active)
		return 0;
	p->active = 0;
	/* An execve that left its caller plumbing started a shim (or failed
	 * to start a command). */
	if (p->nr == NR_EXECVE || p->nr == NR_EXECVEAT) {
		u32 tgid = bpf_get_current_pid_tgid() >> 32;
		if (bpf_map_lookup_elem(&plumbing, &tgid))
			return 0;
	}
	emit_syscall(p->cg, t, p, ret, bpf_ktime_get_ns());
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_fork, struct task_struct *parent, struct task_struct *child)
{
	u64 cg = bpf_get_current_cgroup_id();
	struct watch *w = bpf_map_lookup_elem(&watched, &cg);
	struct task_struct *rparent;
	struct fork_ev *e;
	u32 level, ptgid, ctgid;
	u8 one = 1;

	if (!w)
		return 0;
	ptgid = BPF_CORE_READ(parent, tgid);
	ctgid = BPF_CORE_READ(child, tgid);
	if (ctgid != ptgid && (ptgid == w->init_tgid || bpf_map_lookup_elem(&plumbing, &ptgid)))
		bpf_map_update_elem(&plumbing, &ctgid, &one, BPF_ANY);
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
	u32 tgid;
	long n;

	if (!w)
		return 0;
	/* The thread id may have changed: forget the cached namespace ids. */
	st = bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0, 0);
	if (st)
		st->ns_valid = 0;
	/* Init only starts shims; a shim's child that executes is the
	 * command, which is recorded from here on. */
	tgid = BPF_CORE_READ(p, tgid);
	if (BPF_CORE_READ(p, real_parent, tgid) != w->init_tgid)
		bpf_map_delete_elem(&plumbing, &tgid);
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
	struct task_struct *rparent;
	struct exit_ev *e;
	u32 tgid;

	if (!w)
		return 0;
	if (group_dead) {
		tgid = BPF_CORE_READ(p, tgid);
		bpf_map_delete_elem(&plumbing, &tgid);
	}
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
