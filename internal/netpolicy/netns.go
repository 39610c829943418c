package netpolicy

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// inNetns runs fn on an OS thread that has entered the network namespace
// at path. If the thread cannot return to the original namespace it is
// left locked, so the runtime retires it instead of reusing it.
func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening netns %s: %w", path, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering netns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}
