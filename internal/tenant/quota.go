package tenant

import (
	"fmt"
	"path/filepath"
	"sort"
	"sync"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// Quota is what one tenant may hold at once. A zero field is no limit.
type Quota struct {
	// Jails is the number of jails (in any state).
	Jails int `json:"jails,omitempty"`
	// MemoryBytes is the sum of the jails' memory limits.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// DiskBytes is the sum of the jails' writable-layer sizes.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// Snapshots is the number of snapshots.
	Snapshots int `json:"snapshots,omitempty"`
}

// Usage is what a tenant holds, or what a request would add.
type Usage struct {
	Jails       int   `json:"jails"`
	MemoryBytes int64 `json:"memory_bytes"`
	DiskBytes   int64 `json:"disk_bytes"`
	Snapshots   int   `json:"snapshots"`
}

// Add returns u + v.
func (u Usage) Add(v Usage) Usage {
	return Usage{u.Jails + v.Jails, u.MemoryBytes + v.MemoryBytes, u.DiskBytes + v.DiskBytes, u.Snapshots + v.Snapshots}
}

// Admit returns nil when tenant t, holding used, may add more under q.
// Otherwise it names the first limit crossed: errdefs.ErrForbidden (403)
// when more alone exceeds the limit (it can never be admitted), else
// errdefs.ErrQuota (429: it can be once something is freed).
func (q Quota) Admit(t string, used, more Usage) error {
	limits := []struct {
		what        string
		limit, used int64
		more        int64
		unit        string
	}{
		{"jails", int64(q.Jails), int64(used.Jails), int64(more.Jails), ""},
		{"memory", q.MemoryBytes, used.MemoryBytes, more.MemoryBytes, " bytes"},
		{"disk", q.DiskBytes, used.DiskBytes, more.DiskBytes, " bytes"},
		{"snapshots", int64(q.Snapshots), int64(used.Snapshots), int64(more.Snapshots), ""},
	}
	for _, l := range limits {
		if l.limit <= 0 || l.more <= 0 || l.used+l.more <= l.limit {
			continue
		}
		if l.more > l.limit {
			return errdefs.Forbiddenf("quota: tenant %s may hold at most %d%s of %s; this request alone needs %d%s", t, l.limit, l.unit, l.what, l.more, l.unit)
		}
		return errdefs.New(errdefs.ErrQuota, "quota: tenant %s holds %d%s of its %d%s of %s; this request needs %d%s more (free some first)", t, l.used, l.unit, l.limit, l.unit, l.what, l.more, l.unit)
	}
	return nil
}

// QuotaFile is the quota store's file in the data directory.
const QuotaFile = "quotas.json"

// Quotas holds the tenants' quotas, kept in one JSON file (mode 0600).
// It is safe for concurrent use.
type Quotas struct {
	path string
	mu   sync.RWMutex
	m    map[string]Quota
}

// OpenQuotas opens (or starts) the quotas kept at dataDir/quotas.json.
func OpenQuotas(dataDir string) (*Quotas, error) {
	q := &Quotas{path: filepath.Join(dataDir, QuotaFile), m: map[string]Quota{}}
	if err := atomicfile.ReadJSON(q.path, &q.m); err != nil {
		return nil, fmt.Errorf("quotas: %w", err)
	}
	return q, nil
}

// Get returns tenant t's quota (zero: no limits). A nil store has none.
func (q *Quotas) Get(t string) Quota {
	if q == nil {
		return Quota{}
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	return q.m[Of(t)]
}

// Set replaces tenant t's quota (a zero quota removes it).
func (q *Quotas) Set(t string, v Quota) error {
	if v.Jails < 0 || v.MemoryBytes < 0 || v.DiskBytes < 0 || v.Snapshots < 0 {
		return errdefs.Unprocessablef("quota: limits must not be negative (0 is no limit)")
	}
	t = Of(t)
	q.mu.Lock()
	defer q.mu.Unlock()
	old, had := q.m[t]
	if v == (Quota{}) {
		delete(q.m, t)
	} else {
		q.m[t] = v
	}
	if err := q.saveLocked(); err != nil {
		if had {
			q.m[t] = old
		} else {
			delete(q.m, t)
		}
		return err
	}
	return nil
}

// List returns the tenants that have a quota, sorted.
func (q *Quotas) List() []string {
	q.mu.RLock()
	defer q.mu.RUnlock()
	out := make([]string, 0, len(q.m))
	for t := range q.m {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

func (q *Quotas) saveLocked() error {
	if err := atomicfile.WriteJSON(q.path, q.m, 0o600); err != nil {
		return fmt.Errorf("quotas: %w", err)
	}
	return nil
}

// Status is a tenant's quota and what it holds (GET /quotas/{tenant}).
type Status struct {
	Tenant string `json:"tenant"`
	Limits Quota  `json:"limits"`
	Usage  Usage  `json:"usage"`
}
