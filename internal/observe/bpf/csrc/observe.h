/* Records and constants shared by the observation programs and their Go
 * decoder (bpf2go turns the record structs into Go types). */
#ifndef AGENTJAIL_OBSERVE_H
#define AGENTJAIL_OBSERVE_H

#define MAX_SYSCALLS 512
#define MAX_WATCHED 4096
#define STR_MAX 512
#define SOCKADDR_MAX 128
#define ARGV_MAX 4096
#define CWD_MAX 1024
#define NAME_BUF 256
#define CWD_DEPTH 48

#define NR_EXIT 60
#define NR_EXIT_GROUP 231
#define NR_EXECVE 59
#define NR_EXECVEAT 322
#define RUN_SLOTS 2
#define RUN_MAX (1U << 30)

/* The jail's init marks a thread whose calls are recorded (1) or no longer
 * (0) with prctl(INIT_RECORD_OPTION, on): an option no kernel knows (the
 * call fails with EINVAL) that the sys_enter program reads from init alone.
 * initproto.RecordOption is the same number. */
#define NR_PRCTL 157
#define INIT_RECORD_OPTION 0x4147524aUL

/* Record kinds (hdr.kind). */
enum ev_kind {
	EV_SYSCALL = 1,
	EV_FORK = 2,
	EV_EXEC = 3,
	EV_EXIT = 4,
};

/* watch.flags */
enum watch_flag {
	W_SYSCALLS = 1, /* record syscalls whose bit is set in mask */
	W_PROC = 2,     /* record fork, exec and exit */
};

/* fork_ev.fflags */
enum fork_flag {
	FORK_THREAD = 1,       /* the child is a thread of the parent's process */
	FORK_SHARED_FILES = 2, /* the child shares the parent's fd table */
};

/* argspec[nr]: which arguments of syscall nr are decoded. Argument
 * indexes are 1-based, 0 meaning none. */
#define SPEC_P1(s) ((s) & 7)            /* first path */
#define SPEC_P2(s) (((s) >> 3) & 7)     /* second path */
#define SPEC_SA(s) (((s) >> 6) & 7)     /* socket address */
#define SPEC_SALEN(s) (((s) >> 9) & 7)  /* its length */
#define SPEC_SALEN_PTR (1 << 12)        /* the length argument points to the length */
#define SPEC_FDPAIR(s) (((s) >> 13) & 7) /* int[2] of fds filled on success */
#define SPEC_NOSTR_OK (1 << 16)         /* no strings when the call returns 0 (exec) */

/* One watched cgroup. */
struct watch {
	u32 flags;
	u32 init_tgid; /* the jail's init (host tgid); 0 when unknown */
	u64 lost;    /* records that did not fit in the ring */
	u64 mask[8]; /* syscalls to record, bit nr */
};

struct hdr {
	u32 kind;
	u32 flags;
	u64 cgroup;
	u64 ts; /* CLOCK_MONOTONIC ns */
	u32 tgid;
	u32 tid;
	u32 ns_tgid;
	u32 ns_tid;
	char comm[16];
};

/* A syscall, or a run of identical ones (count > 1): then h.ts is the
 * first call's start, last_ts the last one's and dur their summed time. */
struct sys_ev {
	struct hdr h;
	u32 nr;
	u16 len0;
	u16 len1;
	u64 args[6];
	s64 ret;
	u64 dur;
	s32 aux[2];
	u64 last_ts;
	u32 count;
	u32 pad;
};

struct sys_ev1 {
	struct sys_ev e;
	char s0[STR_MAX];
};

struct sys_ev2 {
	struct sys_ev e;
	char s0[STR_MAX];
	char s1[STR_MAX];
};

struct fork_ev {
	struct hdr h;
	u32 child_tgid;
	u32 child_tid;
	u32 child_ns_tgid;
	u32 child_ns_tid;
	u32 ppid;
	u32 ns_ppid;
	u32 fflags;
	u32 pad;
};

struct exec_ev {
	struct hdr h;
	u32 old_tid;
	u32 uid;
	u32 gid;
	u32 ppid;
	u32 ns_ppid;
	u16 file_len;
	u16 argv_len;
	u16 cwd_len;
	u16 argv_trunc;
	u32 pad;
	char file[STR_MAX];
	char argv[ARGV_MAX];
	char cwd[CWD_MAX + NAME_BUF];
};

struct exit_ev {
	struct hdr h;
	s32 exit_code;
	u32 group_dead;
	u32 ppid;
	u32 ns_ppid;
};

#endif
