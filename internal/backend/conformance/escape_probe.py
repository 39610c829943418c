import ctypes, errno, hashlib, json, os, signal, socket, stat as st, struct, sys, time

args = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def arg(a):
    if a is None:
        return ctypes.c_void_p(0)
    if isinstance(a, bytes):
        return ctypes.c_char_p(a)
    if isinstance(a, int):
        return ctypes.c_long(a)
    return a

def sys_call(nr, *a):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[arg(x) for x in a])
    return r, ctypes.get_errno()

DENIED = (errno.EPERM, errno.EACCES, errno.ENOSYS, errno.EROFS)

def denied(name, nr, *a):
    r, e = sys_call(nr, *a)
    if r >= 0:
        return True, "%s succeeded (returned %d)" % (name, r)
    if e not in DENIED:
        return True, "%s passed the permission check: %s" % (name, errno.errorcode.get(e, e))
    return False, "%s: %s" % (name, errno.errorcode.get(e, e))

def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

results = []

def attempt(name, fn):
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        try:
            escaped, detail = fn()
        except Exception as ex:
            escaped, detail = False, "%s: %s" % (type(ex).__name__, ex)
        os.write(wr, json.dumps({"escaped": bool(escaped), "detail": str(detail)}).encode())
        os._exit(0)
    os.close(wr)
    data = b""
    while True:
        chunk = os.read(rd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(rd)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        out = {"escaped": False, "detail": "killed by signal %d" % os.WTERMSIG(status)}
    else:
        out = json.loads(data or b'{"escaped": false, "detail": "no report"}')
    out["name"] = name
    results.append(out)

# x86_64 syscall numbers.
SYS = dict(mount=165, umount2=166, pivot_root=155, chroot=161, unshare=272, clone=56,
           ptrace=101, init_module=175, finit_module=313, bpf=321, setns=308, reboot=169,
           clock_settime=227, settimeofday=164, fsopen=430, open_tree=428,
           open_by_handle_at=304, iopl=172, ioperm=173, kexec_load=246, swapon=167,
           mknodat=259, keyctl=250, add_key=248, process_vm_readv=310)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID = 0x20000, 0x10000000, 0x40000000, 0x20000000
MS_BIND, MS_REMOUNT, MNT_DETACH = 4096, 32, 2

attempt("mount tmpfs", lambda: denied("mount", SYS["mount"], b"none", b"/tmp", b"tmpfs", 0, None))
attempt("mount proc", lambda: denied("mount", SYS["mount"], b"proc", b"/tmp", b"proc", 0, None))
attempt("mount cgroup2", lambda: denied("mount", SYS["mount"], b"none", b"/tmp", b"cgroup2", 0, None))
attempt("remount /usr read-write", lambda: denied("mount", SYS["mount"], None, b"/usr", None, MS_REMOUNT | MS_BIND, None))
attempt("umount /usr", lambda: denied("umount2", SYS["umount2"], b"/usr", MNT_DETACH))
attempt("umount /proc", lambda: denied("umount2", SYS["umount2"], b"/proc", MNT_DETACH))
attempt("pivot_root", lambda: denied("pivot_root", SYS["pivot_root"], b"/tmp", b"/tmp"))
attempt("fsopen", lambda: denied("fsopen", SYS["fsopen"], b"tmpfs", 0))
attempt("open_tree", lambda: denied("open_tree", SYS["open_tree"], -100, b"/", 1))
attempt("chroot", lambda: denied("chroot", SYS["chroot"], b"/tmp"))

def unshare(flag, label):
    def fn():
        return denied("unshare(%s)" % label, SYS["unshare"], flag)
    return fn
attempt("unshare user namespace", unshare(CLONE_NEWUSER, "CLONE_NEWUSER"))
attempt("unshare mount namespace", unshare(CLONE_NEWNS, "CLONE_NEWNS"))
attempt("unshare net namespace", unshare(CLONE_NEWNET, "CLONE_NEWNET"))
attempt("unshare user+mount namespaces", unshare(CLONE_NEWUSER | CLONE_NEWNS, "CLONE_NEWUSER|CLONE_NEWNS"))

def clone_userns():
    r, e = sys_call(SYS["clone"], CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0)
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
        return True, "clone(CLONE_NEWUSER) made a child in a new user namespace"
    return e not in DENIED, "clone(CLONE_NEWUSER): %s" % errno.errorcode.get(e, e)
attempt("clone into a user namespace", clone_userns)

def see_host_pids():
    out = []
    for pid in args["host_pids"]:
        p = "/proc/%d" % pid
        if os.path.exists(p):
            try:
                cmd = open(p + "/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            except OSError as ex:
                cmd = str(ex)
            out.append("pid %d visible: %s" % (pid, cmd))
    # A host process visible under the same pid would show the host's cmdline.
    for pid in args["host_pids"]:
        try:
            cmd = open("/proc/%d/cmdline" % pid, "rb").read()
        except OSError:
            continue
        if b"agentjail" in cmd and b"serve" in cmd:
            out.append("the daemon is visible as pid %d" % pid)
    return bool(out), "; ".join(out) or "host pids invisible"
attempt("see host processes", see_host_pids)

def ptrace_pids():
    out = []
    for pid in args["host_pids"] + args.get("other_pids", []):
        r, e = sys_call(SYS["ptrace"], 16, pid, 0, 0)  # PTRACE_ATTACH
        if r == 0:
            out.append("ptrace attached to pid %d" % pid)
            sys_call(SYS["ptrace"], 17, pid, 0, 0)  # PTRACE_DETACH
        # One byte from an address that is likely unmapped: EFAULT means
        # the permission check passed.
        buf = ctypes.create_string_buffer(8)
        local = ctypes.create_string_buffer(struct.pack("PN", ctypes.addressof(buf), 1))
        remote = ctypes.create_string_buffer(struct.pack("PN", 0x10000, 1))
        r, e = sys_call(SYS["process_vm_readv"], pid, local, 1, remote, 1, 0)
        if r >= 0 or e == errno.EFAULT:
            out.append("process_vm_readv of pid %d passed the permission check" % pid)
        try:
            os.kill(pid, 0)
            out.append("may signal pid %d" % pid)
        except OSError:
            pass
    return bool(out), "; ".join(out) or "ptrace, process_vm_readv and kill refused for every host and other-jail pid"
attempt("ptrace or signal a host or other-jail process", ptrace_pids)

def keys():
    r, e = sys_call(SYS["add_key"], b"user", b"agentjail-probe", b"x", 1, -2)  # KEY_SPEC_SESSION_KEYRING
    if r >= 0:
        return True, "add_key returned serial %d" % r
    if e not in DENIED:
        return True, "add_key passed the permission check: %s" % errno.errorcode.get(e, e)
    r2, e2 = sys_call(SYS["keyctl"], 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the user keyring
    if r2 >= 0:
        return True, "keyctl reached the user keyring %d" % r2
    return False, "add_key: %s; keyctl: %s" % (errno.errorcode.get(e, e), errno.errorcode.get(e2, e2))
attempt("kernel keyrings (add_key, keyctl)", keys)

def host_files():
    out = []
    paths = []
    for f in args["host_files"]:
        paths.append((f["path"], f["sha256"]))
        paths.append(("/proc/1/root" + f["path"], f["sha256"]))
        paths.append(("/proc/1/root/../../.." + f["path"], f["sha256"]))
        paths.append(("/proc/self/root/../../.." + f["path"], f["sha256"]))
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                paths.append(("/proc/%s/root%s" % (pid, f["path"]), f["sha256"]))
                paths.append(("/proc/%s/cwd/../../../../..%s" % (pid, f["path"]), f["sha256"]))
    for p, want in paths:
        try:
            if sha(p) == want:
                out.append("read %s" % p)
        except OSError:
            pass
    return bool(out), "; ".join(out) or "none of %d paths reached a host file" % len(paths)
attempt("read host and other-jail files through /proc/*/root", host_files)

def write_proc_sys():
    out = []
    for p in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/modprobe",
              "/proc/sys/kernel/hostname", "/proc/sys/net/ipv4/ip_forward"):
        try:
            cur = open(p).read()
        except OSError:
            cur = None
        try:
            fd = os.open(p, os.O_WRONLY)
        except OSError:
            continue
        try:
            # Write back what is there: a success changes nothing.
            if cur is not None and p != "/proc/sys/vm/drop_caches":
                os.write(fd, cur.encode())
                out.append("wrote %s" % p)
            else:
                out.append("opened %s for writing" % p)
        except OSError:
            pass
        finally:
            os.close(fd)
    return bool(out), "; ".join(out) or "/proc/sys is not writable"
attempt("write /proc/sys", write_proc_sys)

def open_writable(paths):
    out = []
    for p in paths:
        try:
            fd = os.open(p, os.O_WRONLY)
        except OSError:
            continue
        mode = os.fstat(fd).st_mode
        os.close(fd)
        # A masked path is a bind of /dev/null (a char device): harmless.
        if st.S_ISREG(mode):
            out.append("opened %s for writing" % p)
    return out

def sysrq():
    out = open_writable(["/proc/sysrq-trigger"])
    return bool(out), "; ".join(out) or "/proc/sysrq-trigger is not writable"
attempt("write /proc/sysrq-trigger", sysrq)

def sysfs():
    cands = ["/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled",
             "/sys/class/net/lo/mtu", "/sys/power/state", "/sys/kernel/profiling",
             "/sys/module/loop/parameters/max_part"]
    for root, dirs, files in os.walk("/sys/block"):
        for f in files:
            cands.append(os.path.join(root, f))
        break
    out = open_writable(cands)
    return bool(out), "; ".join(out) or "/sys is not writable"
attempt("write /sys", sysfs)

def load_module():
    buf = ctypes.create_string_buffer(b"\x7fELF" + b"\0" * 60)
    esc1, d1 = denied("init_module", SYS["init_module"], buf, 64, b"")
    fd = os.open("/proc/self/exe", os.O_RDONLY)
    try:
        esc2, d2 = denied("finit_module", SYS["finit_module"], fd, b"", 0)
    finally:
        os.close(fd)
    return esc1 or esc2, d1 + "; " + d2
attempt("load a kernel module", load_module)

def bpf():
    # BPF_MAP_CREATE of a one-entry array.
    attr = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 4, 1) + b"\0" * 112)
    r, e = sys_call(SYS["bpf"], 0, attr, 128)
    if r >= 0:
        os.close(r)
        return True, "bpf(BPF_MAP_CREATE) returned fd %d" % r
    return False, "bpf: %s" % errno.errorcode.get(e, e)
attempt("bpf()", bpf)

def raw_sockets():
    out = []
    for fam, typ, proto, label in ((socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, "AF_INET raw"),
                                   (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6, "AF_INET6 raw"),
                                   (socket.AF_PACKET, socket.SOCK_RAW, 0x0300, "AF_PACKET raw")):
        try:
            s = socket.socket(fam, typ, proto)
            s.close()
            out.append("opened an %s socket" % label)
        except OSError:
            pass
    return bool(out), "; ".join(out) or "raw sockets refused"
attempt("raw sockets", raw_sockets)

def mknod_disk():
    major, minor = args["disk"]
    path = "/tmp/agentjail-probe-disk-%d" % os.getpid()
    try:
        os.mknod(path, 0o600 | 0o060000, os.makedev(major, minor))
    except OSError as ex:
        return False, "mknod: %s" % ex
    try:
        fd = os.open(path, os.O_RDONLY)
        data = os.read(fd, 512)
        os.close(fd)
        return True, "read %d bytes of the host disk %d:%d" % (len(data), major, minor)
    except OSError as ex:
        return True, "mknod of a block device succeeded (open: %s)" % ex
    finally:
        os.unlink(path)
attempt("mknod a host disk", mknod_disk)

def leave_cgroup():
    before = open("/proc/self/cgroup").read()
    out = []
    cands = ["/sys/fs/cgroup/cgroup.procs"]
    for root, dirs, files in os.walk("/sys/fs/cgroup"):
        if "cgroup.procs" in files:
            cands.append(os.path.join(root, "cgroup.procs"))
        if root.count("/") > 5:
            dirs[:] = []
    for c in cands + [c.rsplit("/", 1)[0] + "/../cgroup.procs" for c in cands]:
        # Only an existing cgroup.procs counts: /sys/fs/cgroup itself may be
        # a jail-private tmpfs where any file can be created.
        try:
            fd = os.open(c, os.O_WRONLY)
        except OSError:
            continue
        d = os.path.dirname(c)
        try:
            if os.path.exists(d + "/cgroup.controllers") or os.path.exists(d + "/tasks"):
                os.write(fd, str(os.getpid()).encode())
                out.append("wrote own pid to %s" % c)
        except OSError:
            pass
        finally:
            os.close(fd)
    after = open("/proc/self/cgroup").read()
    if after != before:
        out.append("cgroup changed from %r to %r" % (before, after))
    return bool(out), "; ".join(out) or "no cgroup.procs writable (%d tried)" % len(cands)
attempt("move out of the jail cgroup", leave_cgroup)

def do_setns():
    out = []
    for ns in ("net", "mnt", "pid", "uts", "ipc", "cgroup", "user"):
        try:
            fd = os.open("/proc/1/ns/" + ns, os.O_RDONLY)
        except OSError:
            continue
        r, e = sys_call(SYS["setns"], fd, 0)
        os.close(fd)
        if r == 0:
            out.append("setns into /proc/1/ns/%s succeeded" % ns)
    return bool(out), "; ".join(out) or "setns refused"
attempt("setns", do_setns)

# LINUX_REBOOT_CMD_CAD_OFF: harmless even where it is allowed.
attempt("reboot", lambda: denied("reboot", SYS["reboot"], 0xfee1dead, 672274793, 0, None))

def set_clock():
    ts = ctypes.create_string_buffer(struct.pack("qq", int(time.time()), 0))
    esc1, d1 = denied("clock_settime", SYS["clock_settime"], 0, ts)
    tv = ctypes.create_string_buffer(struct.pack("qq", int(time.time()), 0))
    esc2, d2 = denied("settimeofday", SYS["settimeofday"], tv, None)
    return esc1 or esc2, d1 + "; " + d2
attempt("set the clock", set_clock)

def shocker():
    # open_by_handle_at with a guessed root inode handle (CVE-2014-3519).
    fh = ctypes.create_string_buffer(struct.pack("Ii", 8, 1) + struct.pack("II", 2, 0))
    fd = os.open("/", os.O_RDONLY)
    try:
        return denied("open_by_handle_at", SYS["open_by_handle_at"], fd, fh, 0)
    finally:
        os.close(fd)
attempt("open_by_handle_at", shocker)
attempt("iopl", lambda: denied("iopl", SYS["iopl"], 3))
attempt("ioperm", lambda: denied("ioperm", SYS["ioperm"], 0x80, 1, 1))
attempt("kexec_load", lambda: denied("kexec_load", SYS["kexec_load"], 0, 0, None, 0))
attempt("swapon", lambda: denied("swapon", SYS["swapon"], b"/tmp", 0))

print(json.dumps(results))
