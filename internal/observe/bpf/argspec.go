package bpf

// Argument decoding specs for argspec (see SPEC_* in observe.h): which
// arguments of a syscall the kernel side copies as strings or addresses.
const (
	specSALenPtr = 1 << 12
	specNoStrOK  = 1 << 16
)

func specPaths(p1, p2 uint32) uint32 { return p1 | p2<<3 }
func specSockaddr(addr, length uint32, lenIsPtr bool) uint32 {
	s := addr<<6 | length<<9
	if lenIsPtr {
		s |= specSALenPtr
	}
	return s
}
func specFDPair(arg uint32) uint32 { return arg << 13 }

// argSpecs maps x86_64 syscall numbers to their spec. Argument indexes are
// 1-based.
var argSpecs = map[int]uint32{
	2:   specPaths(1, 0),               // open
	4:   specPaths(1, 0),               // stat
	6:   specPaths(1, 0),               // lstat
	21:  specPaths(1, 0),               // access
	59:  specPaths(1, 0) | specNoStrOK, // execve
	76:  specPaths(1, 0),               // truncate
	80:  specPaths(1, 0),               // chdir
	82:  specPaths(1, 2),               // rename
	83:  specPaths(1, 0),               // mkdir
	84:  specPaths(1, 0),               // rmdir
	85:  specPaths(1, 0),               // creat
	86:  specPaths(1, 2),               // link
	87:  specPaths(1, 0),               // unlink
	88:  specPaths(1, 2),               // symlink
	89:  specPaths(1, 0),               // readlink
	90:  specPaths(1, 0),               // chmod
	92:  specPaths(1, 0),               // chown
	94:  specPaths(1, 0),               // lchown
	132: specPaths(1, 0),               // utime
	133: specPaths(1, 0),               // mknod
	137: specPaths(1, 0),               // statfs
	155: specPaths(1, 2),               // pivot_root
	161: specPaths(1, 0),               // chroot
	165: specPaths(1, 2),               // mount
	166: specPaths(1, 0),               // umount2
	188: specPaths(1, 0),               // setxattr
	189: specPaths(1, 0),               // lsetxattr
	191: specPaths(1, 0),               // getxattr
	192: specPaths(1, 0),               // lgetxattr
	194: specPaths(1, 0),               // listxattr
	195: specPaths(1, 0),               // llistxattr
	197: specPaths(1, 0),               // removexattr
	198: specPaths(1, 0),               // lremovexattr
	235: specPaths(1, 0),               // utimes
	254: specPaths(2, 0),               // inotify_add_watch
	257: specPaths(2, 0),               // openat
	258: specPaths(2, 0),               // mkdirat
	259: specPaths(2, 0),               // mknodat
	260: specPaths(2, 0),               // fchownat
	261: specPaths(2, 0),               // futimesat
	262: specPaths(2, 0),               // newfstatat
	263: specPaths(2, 0),               // unlinkat
	264: specPaths(2, 4),               // renameat
	265: specPaths(2, 4),               // linkat
	266: specPaths(1, 3),               // symlinkat
	267: specPaths(2, 0),               // readlinkat
	268: specPaths(2, 0),               // fchmodat
	269: specPaths(2, 0),               // faccessat
	280: specPaths(2, 0),               // utimensat
	303: specPaths(2, 0),               // name_to_handle_at
	316: specPaths(2, 4),               // renameat2
	319: specPaths(1, 0),               // memfd_create (its name)
	322: specPaths(2, 0) | specNoStrOK, // execveat
	332: specPaths(2, 0),               // statx
	428: specPaths(2, 0),               // open_tree
	429: specPaths(2, 4),               // move_mount
	437: specPaths(2, 0),               // openat2
	439: specPaths(2, 0),               // faccessat2
	442: specPaths(2, 0),               // mount_setattr
	452: specPaths(2, 0),               // fchmodat2

	42:  specSockaddr(2, 3, false), // connect
	49:  specSockaddr(2, 3, false), // bind
	44:  specSockaddr(5, 6, false), // sendto
	43:  specSockaddr(2, 3, true),  // accept
	288: specSockaddr(2, 3, true),  // accept4
	45:  specSockaddr(5, 6, true),  // recvfrom

	22:  specFDPair(1), // pipe
	293: specFDPair(1), // pipe2
	53:  specFDPair(4), // socketpair
}

// specHasSockaddr reports whether spec decodes a socket address (rather
// than a path) into the first string.
func specHasSockaddr(spec uint32) bool { return spec&7 == 0 && (spec>>6)&7 != 0 }
