package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nkeys"
)

// siteKeyPrefix keys a site's identity (issue 42): a node outside the mesh's cluster that
// links to it as a leafnode, with its own JetStream domain.
const siteKeyPrefix = "identity.site."

// SiteIdentity is a site's record: the key its link to the hub authenticates with, and when
// it enrolled.
type SiteIdentity struct {
	PublicKey string    `json:"public_key"`
	Enrolled  time.Time `json:"enrolled"`
}

func checkSiteIdentity(value []byte) error {
	var id SiteIdentity
	if err := json.Unmarshal(value, &id); err != nil {
		return fmt.Errorf("not a site identity: %w", err)
	}
	if !nkeys.IsValidPublicUserKey(id.PublicKey) {
		return fmt.Errorf("%.40q is not an nkey user public key", id.PublicKey)
	}
	return nil
}

// applySite folds a site's identity into the mirror; r.mu is held.
func (r *Registry) applySite(name string, value []byte, put bool) {
	var id SiteIdentity
	if put && json.Unmarshal(value, &id) == nil {
		if r.sites == nil {
			r.sites = map[string]SiteIdentity{}
		}
		r.sites[name] = id
		return
	}
	delete(r.sites, name)
}

// SetSite records a site's identity.
func (r *Registry) SetSite(ctx context.Context, name string, id SiteIdentity) error {
	b, _ := json.Marshal(id)
	if _, err := r.kv.Put(ctx, siteKeyPrefix+name, b); err != nil {
		return fmt.Errorf("record site %s: %w", name, err)
	}
	r.mu.Lock()
	r.applySite(name, b, true)
	r.changed()
	r.mu.Unlock()
	return nil
}

// RemoveSite forgets a site: its link is refused from then on.
func (r *Registry) RemoveSite(ctx context.Context, name string) error {
	if err := r.kv.Delete(ctx, siteKeyPrefix+name); err != nil {
		return fmt.Errorf("forget site %s: %w", name, err)
	}
	r.mu.Lock()
	r.applySite(name, nil, false)
	r.changed()
	r.mu.Unlock()
	return nil
}

// Site returns a site's identity.
func (r *Registry) Site(name string) (SiteIdentity, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	id, ok := r.sites[name]
	return id, ok
}

// SiteByKey returns the name of the site whose link authenticates with publicKey.
func (r *Registry) SiteByKey(publicKey string) (string, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for name, id := range r.sites {
		if id.PublicKey == publicKey {
			return name, true
		}
	}
	return "", false
}

// Sites returns the names of the mesh's sites, sorted (empty, not nil, when none).
func (r *Registry) Sites() []string {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return append([]string{}, slices.Sorted(maps.Keys(r.sites))...)
}
