package kubetest

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
)

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// Leftovers lists what is left on this host of the jails ids: mounts
// naming them, and their cgroup directories in any hierarchy (a process
// left in a jail keeps its cgroup).
func Leftovers(ids ...string) []string {
	var out []string
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			for _, id := range ids {
				if strings.Contains(sc.Text(), id) {
					out = append(out, "mount: "+sc.Text())
				}
			}
		}
		f.Close()
	}
	for _, id := range ids {
		for _, pat := range []string{filepath.Join(cgroupRoot, "*", "agentjail-"+id), filepath.Join(cgroupRoot, "agentjail-"+id)} {
			m, _ := filepath.Glob(pat)
			for _, d := range m {
				out = append(out, "cgroup: "+d)
			}
		}
	}
	return out
}
