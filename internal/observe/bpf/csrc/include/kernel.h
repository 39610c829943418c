/* Minimal kernel type declarations for the observation programs.
 *
 * Only the members the programs read are declared. Every struct carries
 * preserve_access_index, so member offsets are relocated against the running
 * kernel's BTF at load time (CO-RE); the layout written here does not have to
 * match the kernel's.
 */
#ifndef AGENTJAIL_KERNEL_H
#define AGENTJAIL_KERNEL_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed int s32;
typedef signed long long s64;
typedef _Bool bool;

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct pt_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	unsigned long ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

struct qstr {
	union {
		struct {
			u32 hash;
			u32 len;
		};
		u64 hash_len;
	};
	const unsigned char *name;
};

struct dentry {
	struct dentry *d_parent;
	struct qstr d_name;
};

struct vfsmount {
	struct dentry *mnt_root;
};

struct mount {
	struct mount *mnt_parent;
	struct dentry *mnt_mountpoint;
	struct vfsmount mnt;
};

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
};

struct fs_struct {
	struct path root;
	struct path pwd;
};

struct upid {
	int nr;
	void *ns;
};

struct pid {
	unsigned int level;
	struct upid numbers[1];
};

struct mm_struct {
	unsigned long arg_start;
	unsigned long arg_end;
};

typedef struct {
	int counter;
} atomic_t;

struct files_struct {
	atomic_t count;
};

struct kernfs_node {
	u64 id;
};

struct cgroup {
	struct kernfs_node *kn;
};

struct css_set {
	struct cgroup *dfl_cgrp;
};

struct task_struct {
	int pid;
	int tgid;
	int exit_code;
	struct task_struct *real_parent;
	struct task_struct *group_leader;
	struct pid *thread_pid;
	struct mm_struct *mm;
	struct fs_struct *fs;
	struct files_struct *files;
	struct css_set *cgroups;
	char comm[16];
};

struct linux_binprm {
	const char *filename;
};

#pragma clang attribute pop

#endif
