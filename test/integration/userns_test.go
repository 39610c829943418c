package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestUserNamespace runs a jail whose root is mapped to an unprivileged
// host uid range: the jail's root works in its own homes, and what it
// writes belongs, on the host, to the mapped uid rather than to root.
func TestUserNamespace(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"process": map[string]any{"namespaces": map[string]any{"user": true}}}})
	res := d.shAs(t, j.ID, "root", "cat /proc/self/uid_map; touch /root/made-by-root && echo ok")
	f := strings.Fields(res.Stdout)
	if res.ExitCode != 0 || len(f) < 4 || f[0] != "0" || f[1] == "0" || f[3] != "ok" {
		t.Fatalf("root in a user-namespaced jail: %s", &res)
	}
	st, err := os.Stat(filepath.Join(d.dir, "jails", j.ID, "rootfs", "upper", "root", "made-by-root"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid == 0 || strings.TrimSpace(f[1]) != strconv.Itoa(int(uid)) {
		t.Fatalf("a file made by the jail's root is owned by host uid %d, want the mapped %s", uid, f[1])
	}
	if res := d.shAs(t, j.ID, "", "id -u; echo hi > /workspace/x && cat /workspace/x"); res.Stdout != "1000\nhi\n" {
		t.Fatalf("the default user in a user-namespaced jail: %s", &res)
	}
}
