package jail

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/model"
)

// TestWarmPoolTarget: the pool's target is the most creates within any
// demandBurst of the last demandWindow, between its base size and its
// maximum.
func TestWarmPoolTarget(t *testing.T) {
	w, err := newWarmPool(2, 5)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_000_000, 0)
	if got := w.target(t0); got != 2 {
		t.Fatalf("no creates: target %d, want the base 2", got)
	}
	// Three creates 4 s apart: the first and the third are 8 s apart,
	// within one burst.
	for i := range 3 {
		w.noteDemand(t0.Add(time.Duration(i) * 4 * time.Second))
	}
	if got := w.target(t0.Add(10 * time.Second)); got != 3 {
		t.Errorf("three creates within 10 s: target %d, want 3", got)
	}
	// Four more spread 11 s apart never make a larger burst.
	for i := range 4 {
		w.noteDemand(t0.Add(30*time.Second + time.Duration(i)*11*time.Second))
	}
	if got := w.target(t0.Add(time.Minute)); got != 3 {
		t.Errorf("after spread-out creates: target %d, want 3", got)
	}
	// A burst of eight is capped at the maximum.
	for range 8 {
		w.noteDemand(t0.Add(2 * time.Minute))
	}
	if got := w.target(t0.Add(2 * time.Minute)); got != 5 {
		t.Errorf("a burst of eight: target %d, want the maximum 5", got)
	}
	for range 2 * maxDemand {
		w.noteDemand(t0.Add(3 * time.Minute))
	}
	if len(w.creates) > maxDemand {
		t.Errorf("the pool remembers %d creates, more than %d", len(w.creates), maxDemand)
	}
	// Once the bursts are older than the window, back to the base size.
	if got := w.target(t0.Add(3*time.Minute + demandWindow + time.Second)); got != 2 {
		t.Errorf("after the window: target %d, want 2", got)
	}
}

// waitPool waits until the pool's status satisfies ok.
func waitPool(t *testing.T, m *Manager, what string, ok func(*model.WarmPool) bool) *model.WarmPool {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st := m.warm.status()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm pool: %s: %+v", what, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWarmPoolFollowsBursts: after a burst of creates the pool grows to
// it (ready jails of the pool's level, started in the background), so
// that the next burst, sequential or concurrent, is served from the pool.
func TestWarmPoolFollowsBursts(t *testing.T) {
	f := newFake("container")
	td := newTestData(t, f.factory())
	td.opts.WarmJails, td.opts.WarmMax = 1, 4
	m := td.open(t)
	ctx := context.Background()
	waitPool(t, m, "one ready", func(st *model.WarmPool) bool { return st.Ready == 1 })
	for i := range 4 {
		if _, err := m.Create(ctx, model.CreateRequest{Name: fmt.Sprintf("first-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	st := waitPool(t, m, "grown to the burst", func(st *model.WarmPool) bool { return st.Ready == 4 })
	if st.Target != 4 || st.Size != 1 || st.Max != 4 {
		t.Errorf("after a burst of 4: %+v", st)
	}
	taken := st.Taken
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, err := m.Create(ctx, model.CreateRequest{Name: fmt.Sprintf("again-%d", i)})
			errs[i] = err
			if err == nil && j.Status != model.StateRunning {
				errs[i] = fmt.Errorf("jail %s is %s", j.Name, j.Status)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := m.warm.status(); st.Taken != taken+4 {
		t.Errorf("the second burst took %d ready jails, want 4 (%+v)", st.Taken-taken, st)
	}
	list, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 8 {
		t.Errorf("the API lists %d jails, want the 8 created", len(list))
	}
}

// TestWarmPoolFailingRefill: while the pool's starts fail (and its filler
// waits to retry), a create of the pool's configuration does not wait for
// it: it starts a jail of its own at once, and once starts work again the
// pool fills.
func TestWarmPoolFailingRefill(t *testing.T) {
	f := newFake("container")
	f.failAt("start", errors.New("injected start failure"))
	td := newTestData(t, f.factory())
	td.opts.WarmJails, td.opts.WarmMax = 1, 1
	m := td.open(t)
	waitPool(t, m, "a failed refill", func(st *model.WarmPool) bool { return st.Error != "" })
	start := time.Now()
	if _, err := m.Create(context.Background(), model.CreateRequest{Name: "while-failing"}); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("create while starts fail: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the create waited %v for the failing refill", took)
	}
	f.failAt("start", nil)
	j, err := m.Create(context.Background(), model.CreateRequest{Name: "after"})
	if err != nil || j.Status != model.StateRunning {
		t.Fatalf("create once starts work: %v %+v", err, j)
	}
	waitPool(t, m, "refilled after the failures", func(st *model.WarmPool) bool { return st.Ready == 1 })
}
