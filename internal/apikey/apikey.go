// Package apikey is the daemon's store of API keys: keys it issues, each
// with a tenant and a role, kept hashed with argon2id in one JSON file
// under the data directory, and checked fast on every request.
//
// A key is shown once, when it is made: "aj_" + its id (12 hex digits) +
// "_" + a 256-bit random secret (base64url). The store keeps the id, the
// key's name, tenant, role and creation time, and an argon2id hash of the
// secret. Verify looks the id up and compares the hash; a key verified once
// is then remembered (a SHA-256 of the whole key, in memory only), so later
// checks of the same key cost a map look-up and one SHA-256 — well under
// 0.05 ms — while a guess at a secret always pays the argon2id price.
//
// The store is small on purpose: Create, List, Get, Remove, Verify.
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/argon2"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/lazyre"
)

// Role is what a key may do.
type Role string

// The roles. Admin may do everything, across tenants; user may read and
// change its own tenant's resources; viewer may only read them.
const (
	RoleAdmin  Role = "admin"
	RoleUser   Role = "user"
	RoleViewer Role = "viewer"
)

// Valid reports whether r is one of the roles.
func (r Role) Valid() bool { return r == RoleAdmin || r == RoleUser || r == RoleViewer }

// CanWrite reports whether the role may change resources.
func (r Role) CanWrite() bool { return r == RoleAdmin || r == RoleUser }

// Key is a key's record, without its secret.
type Key struct {
	// ID identifies the key; it is also the key's visible prefix.
	ID string `json:"id"`
	// Name is a label given at creation (may be empty).
	Name string `json:"name,omitempty"`
	// Tenant is the tenant the key acts for.
	Tenant string `json:"tenant"`
	// Role is admin, user or viewer.
	Role      Role      `json:"role"`
	CreatedAt time.Time `json:"created_at"`
}

// Prefix is how every key begins.
const Prefix = "aj_"

// DefaultTenant is the tenant of keys made without one.
const DefaultTenant = "default"

// argon2id parameters (RFC 9106's second recommendation, with one pass:
// the secrets are random, not passwords).
const (
	argonTime    = 1
	argonMemory  = 64 << 10 // KiB
	argonThreads = 2
	argonKeyLen  = 32
	saltLen      = 16
	secretLen    = 32
)

// maxHashing bounds the argon2id computations running at once (each
// takes 64 MiB), so that a flood of wrong keys cannot exhaust the daemon.
const maxHashing = 2

var (
	idRE     = lazyre.New(`^[0-9a-f]{12}$`)
	tenantRE = lazyre.New(`^[a-z0-9][a-z0-9_.-]{0,62}$`)
)

// stored is a key's record in the file.
type stored struct {
	Key
	Salt string `json:"salt"` // base64
	Hash string `json:"hash"` // base64 argon2id of the secret
}

// Store holds the keys of one data directory. It is safe for concurrent use.
type Store struct {
	path string
	mu   sync.RWMutex
	keys map[string]*stored
	// verified maps a key id to the SHA-256 of the whole key once it has
	// been verified; Remove forgets it.
	verified map[string][sha256.Size]byte
	hashing  chan struct{}
}

// FileName is the store's file in the data directory.
const FileName = "api-keys.json"

// Open opens (or starts) the store kept at dataDir/api-keys.json (mode
// 0600).
func Open(dataDir string) (*Store, error) {
	s := &Store{path: filepath.Join(dataDir, FileName), keys: map[string]*stored{},
		verified: map[string][sha256.Size]byte{}, hashing: make(chan struct{}, maxHashing)}
	var list []*stored
	if err := atomicfile.ReadJSON(s.path, &list); err != nil {
		return nil, fmt.Errorf("api keys: %w", err)
	}
	for _, k := range list {
		s.keys[k.ID] = k
	}
	return s, nil
}

// Create makes a key for tenant (DefaultTenant when empty) with role (user
// when empty) and returns its record and the key itself, which is not
// kept and cannot be shown again.
func (s *Store) Create(name, tenant string, role Role) (Key, string, error) {
	if tenant == "" {
		tenant = DefaultTenant
	}
	if role == "" {
		role = RoleUser
	}
	if !tenantRE().MatchString(tenant) {
		return Key{}, "", errdefs.Invalidf("tenant: %q must be 1 to 63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit", tenant)
	}
	if !role.Valid() {
		return Key{}, "", errdefs.Invalidf("role: %q must be admin, user or viewer", role)
	}
	if len(name) > 200 || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return Key{}, "", errdefs.Invalidf("name: at most 200 printable characters")
	}
	var idb [6]byte
	secret := make([]byte, secretLen)
	salt := make([]byte, saltLen)
	for _, b := range [][]byte{idb[:], secret, salt} {
		if _, err := rand.Read(b); err != nil {
			return Key{}, "", err
		}
	}
	k := &stored{
		Key:  Key{ID: hex.EncodeToString(idb[:]), Name: name, Tenant: tenant, Role: role, CreatedAt: time.Now().UTC().Truncate(time.Second)},
		Salt: base64.StdEncoding.EncodeToString(salt),
	}
	sec := base64.RawURLEncoding.EncodeToString(secret)
	k.Hash = base64.StdEncoding.EncodeToString(hash(sec, salt))
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.keys[k.ID]; dup {
		return Key{}, "", errdefs.Conflictf("key id %s collides; try again", k.ID)
	}
	s.keys[k.ID] = k
	if err := s.saveLocked(); err != nil {
		delete(s.keys, k.ID)
		return Key{}, "", err
	}
	return k.Key, Prefix + k.ID + "_" + sec, nil
}

func hash(secret string, salt []byte) []byte {
	return argon2.IDKey([]byte(secret), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
}

// List returns every key's record, oldest first.
func (s *Store) List() []Key {
	s.mu.RLock()
	out := make([]Key, 0, len(s.keys))
	for _, k := range s.keys {
		out = append(out, k.Key)
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].ID < out[j].ID
		}
		return out[i].CreatedAt.Before(out[j].CreatedAt)
	})
	return out
}

// Get returns the record of key id (errdefs.ErrNotFound when none).
func (s *Store) Get(id string) (Key, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	k, ok := s.keys[id]
	if !ok {
		return Key{}, errdefs.NotFoundf("no API key with id %q", id)
	}
	return k.Key, nil
}

// Remove deletes key id; it stops working at once (errdefs.ErrNotFound
// when none).
func (s *Store) Remove(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.keys[id]
	if !ok {
		return errdefs.NotFoundf("no API key with id %q", id)
	}
	delete(s.keys, id)
	delete(s.verified, id)
	if err := s.saveLocked(); err != nil {
		s.keys[id] = k
		return err
	}
	return nil
}

// Verify returns the record of the key token, or errdefs.ErrUnauthorized
// when it is not a key of the store (malformed, unknown or removed).
func (s *Store) Verify(token string) (Key, error) {
	id, secret, ok := parse(token)
	if !ok {
		return Key{}, errdefs.New(errdefs.ErrUnauthorized, "not an agentjail API key (they look like %s<id>_<secret>)", Prefix)
	}
	sum := sha256.Sum256([]byte(token))
	s.mu.RLock()
	k, known := s.keys[id]
	seen, cached := s.verified[id]
	s.mu.RUnlock()
	if !known {
		return Key{}, errdefs.New(errdefs.ErrUnauthorized, "unknown or removed API key %s%s", Prefix, id)
	}
	if cached && subtle.ConstantTimeCompare(seen[:], sum[:]) == 1 {
		return k.Key, nil
	}
	salt, err1 := base64.StdEncoding.DecodeString(k.Salt)
	want, err2 := base64.StdEncoding.DecodeString(k.Hash)
	if err1 != nil || err2 != nil {
		return Key{}, fmt.Errorf("api key %s: corrupt record in %s", id, s.path)
	}
	s.hashing <- struct{}{}
	got := hash(secret, salt)
	<-s.hashing
	if subtle.ConstantTimeCompare(got, want) != 1 {
		return Key{}, errdefs.New(errdefs.ErrUnauthorized, "wrong secret for API key %s%s", Prefix, id)
	}
	s.mu.Lock()
	if _, still := s.keys[id]; still {
		s.verified[id] = sum
	}
	s.mu.Unlock()
	return k.Key, nil
}

// parse splits "aj_<id>_<secret>".
func parse(token string) (id, secret string, ok bool) {
	rest, ok := strings.CutPrefix(token, Prefix)
	if !ok {
		return "", "", false
	}
	id, secret, ok = strings.Cut(rest, "_")
	if !ok || !idRE().MatchString(id) || len(secret) != base64.RawURLEncoding.EncodedLen(secretLen) {
		return "", "", false
	}
	return id, secret, true
}

// saveLocked writes the store atomically (s.mu held).
func (s *Store) saveLocked() error {
	list := make([]*stored, 0, len(s.keys))
	for _, k := range s.keys {
		list = append(list, k)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
	if err := atomicfile.WriteJSON(s.path, list, 0o600); err != nil {
		return fmt.Errorf("api keys: %w", err)
	}
	return nil
}
