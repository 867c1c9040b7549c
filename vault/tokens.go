package vault

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/meshca"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/nats-io/nuid"
)

// TokenPrefix starts every join token, so a pasted token is recognisable.
const TokenPrefix = "MNJ1."

// tokenRecord is a join token at rest: its public key and limits — never its seed, which
// exists only in the bearer string.
type tokenRecord struct {
	ID        string    `json:"id"`
	PublicKey string    `json:"public_key"`
	MeshID    string    `json:"mesh_id"`
	Created   time.Time `json:"created"`
	Expires   time.Time `json:"expires"`
	Uses      int       `json:"uses"`
	Used      int       `json:"used"`
	Enrolled  []string  `json:"enrolled,omitempty"` // nodes that joined with it
}

// Bearer is what a join token string decodes to.
type Bearer struct {
	MeshID string   `json:"mesh_id"`
	ID     string   `json:"id"`
	Seed   string   `json:"seed"` // the token's own nkey: it may request enrol, nothing else
	Addrs  []string `json:"addrs"`
	// Expect is the number of servers the mesh was founded with: a joining node refuses a
	// single-node mesh's token before it is spent.
	Expect int `json:"expect,omitempty"`
	// CA is the mesh's CA certificate (DER): a client port off loopback is TLS, and the
	// joining node verifies it with this before it has anything else of the mesh.
	CA []byte `json:"ca,omitempty"`
}

// ParseToken decodes a join token string.
func ParseToken(s string) (Bearer, error) {
	var b Bearer
	raw, ok := strings.CutPrefix(strings.TrimSpace(s), TokenPrefix)
	if !ok {
		return b, fmt.Errorf("not a join token: it starts with %q; make one with `meshnode token create`", TokenPrefix)
	}
	data, err := base64.RawURLEncoding.DecodeString(raw)
	if err != nil {
		return b, fmt.Errorf("join token is damaged: %w", err)
	}
	if err := json.Unmarshal(data, &b); err != nil || b.ID == "" || b.Seed == "" {
		return b, errors.New("join token is damaged: copy it whole")
	}
	return b, nil
}

func (b Bearer) String() string {
	data, _ := json.Marshal(b)
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(data)
}

// apply folds one bucket entry into the mirror.
func (v *Vault) apply(e jetstream.KeyValueEntry) {
	if strings.HasPrefix(e.Key(), "secret.") {
		v.applyRecord(e)
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	var r tokenRecord
	if e.Operation() == jetstream.KeyValuePut {
		err := json.Unmarshal(e.Value(), &r)
		if err == nil {
			err = checkToken(e.Key(), r)
		}
		if err == nil {
			v.tokens[r.PublicKey] = r
			return
		}
		// Anything may sit in the bucket: a record that is no token authenticates nobody,
		// and what the key held before is gone from the bucket too.
		v.log.Error("vault token record refused: skipped", "key", e.Key(), "revision", e.Revision(), "err", err)
	}
	for pub, t := range v.tokens {
		if "token."+t.ID == e.Key() {
			delete(v.tokens, pub)
		}
	}
}

// checkToken validates a token record read from the bucket under key: the mirror lets its
// public key connect and request enrol.<id>, so every field that decides it must hold.
func checkToken(key string, r tokenRecord) error {
	switch {
	case r.ID == "" || key != "token."+r.ID:
		return fmt.Errorf("id %q does not match the key", r.ID)
	case !nkeys.IsValidPublicUserKey(r.PublicKey):
		return fmt.Errorf("public key %q is not a user nkey", r.PublicKey)
	case r.Expires.IsZero():
		return errors.New("no expiry")
	case r.Uses < 1:
		return fmt.Errorf("uses %d: a token is used at least once", r.Uses)
	case r.Used < 0:
		return fmt.Errorf("used %d is negative", r.Used)
	}
	return nil
}

// enrolledAs returns a live join token a node of this name enrolled with: two nodes that
// enrol under one name at about the same time must not both pass (the registry knows a
// server only once it has started).
func (v *Vault) enrolledAs(node string) (tokenRecord, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, t := range v.tokens {
		if time.Now().Before(t.Expires) && slices.Contains(t.Enrolled, node) {
			return t, true
		}
	}
	return tokenRecord{}, false
}

// TokenID returns the id of the live join token whose key is publicKey: the bus lets that
// key request enrol.<id> and nothing else. A used-up or expired token does not authenticate:
// a bearer credential that has done its one thing opens nothing more.
func (v *Vault) TokenID(publicKey string) (string, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	t, ok := v.tokens[publicKey]
	if !ok || t.Used >= t.Uses || !time.Now().Before(t.Expires) {
		return "", false
	}
	return t.ID, true
}

// token mints a join token.
func (v *Vault) token(ctx context.Context, req api.VaultRequest) (*api.Token, error) {
	ttl := DefaultTokenTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("ttl %q is not a positive duration", req.TTL)
		}
		ttl = d
	}
	uses := req.Uses
	if uses == 0 {
		uses = 1
	}
	if uses < 0 {
		return nil, fmt.Errorf("uses %d: a token is used at least once", uses)
	}
	kp, err := MintUser()
	if err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	now := time.Now().UTC()
	r := tokenRecord{ID: strings.ToLower(nuid.Next()), PublicKey: pub, MeshID: v.cfg.MeshID, Created: now, Expires: now.Add(ttl), Uses: uses}
	b, _ := json.Marshal(r)
	if _, err := v.kv.Create(ctx, "token."+r.ID, b); err != nil {
		return nil, err
	}
	// The bus authenticates tokens from the mirror: answer once it holds this one, so the
	// token works the moment its bearer has it.
	for {
		v.mu.RLock()
		_, ok := v.tokens[pub]
		v.mu.RUnlock()
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("token %s: the vault's mirror did not see it: %w", r.ID, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	v.event(ctx, "token-created", map[string]any{"id": r.ID, "expires": r.Expires, "uses": uses})
	bearer := Bearer{MeshID: v.cfg.MeshID, ID: r.ID, Seed: string(seed), Addrs: v.cfg.Addrs()}
	if v.cfg.Enrolment != nil {
		e := v.cfg.Enrolment()
		bearer.Expect, bearer.CA = e.Expect, e.CA
	}
	return &api.Token{ID: r.ID, Token: bearer.String(), Expires: r.Expires, Uses: uses}, nil
}

// enrol trades a join token for what a joining node needs. Every check (mesh, expiry, uses,
// the node's name, the xkey to seal to) comes before the token is consumed: a join refused
// for any of them leaves it as it was. A reply lost on the way back is not noticed here.
func (v *Vault) enrol(ctx context.Context, id string, req api.VaultRequest) (*api.Enrolment, error) {
	e, err := v.kv.Get(ctx, "token."+id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("join token %s is not known to mesh %s", id, v.cfg.MeshID)
	}
	if err != nil {
		return nil, err
	}
	var r tokenRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, err
	}
	switch {
	case req.MeshID != "" && req.MeshID != r.MeshID:
		return nil, fmt.Errorf("join token %s is for mesh %s, not mesh %s", id, r.MeshID, req.MeshID)
	case time.Now().After(r.Expires):
		return nil, fmt.Errorf("join token %s expired at %s; make a new one with `meshnode token create`", id, r.Expires.Format(time.RFC3339))
	case r.Used >= r.Uses:
		return nil, fmt.Errorf("join token %s is used up (%d of %d uses, by %s); make a new one with `meshnode token create`", id, r.Used, r.Uses, strings.Join(r.Enrolled, ", "))
	case req.Node == "":
		return nil, errors.New("enrol names no node")
	}
	if _, err := nkeys.FromPublicKey(req.XKey); err != nil || !nkeys.IsValidPublicCurveKey(req.XKey) {
		return nil, errors.New("enrol carries no xkey to seal the enrolment to")
	}
	if other, ok := v.enrolledAs(req.Node); ok && req.SiteKey == "" {
		return nil, fmt.Errorf("a node named %s enrolled with join token %s and may still be starting: join with another --name (a name is a server's raft identity), or wait until that token expires at %s",
			req.Node, other.ID, other.Expires.Format(time.RFC3339))
	}
	var out api.Enrolment
	switch {
	case req.SiteKey != "" && v.cfg.EnrolSite == nil:
		return nil, fmt.Errorf("mesh %s takes no sites: this server does not serve enrolments of sites", v.cfg.MeshID)
	case req.SiteKey != "":
		if out, err = v.cfg.EnrolSite(ctx, req.Node, req.SiteKey); err != nil {
			return nil, err
		}
	default:
		if v.cfg.Admit != nil {
			if err := v.cfg.Admit(req.Node); err != nil {
				return nil, err
			}
		}
		out = v.cfg.Enrolment()
	}
	r.Used++
	r.Enrolled = append(r.Enrolled, req.Node)
	b, _ := json.Marshal(r)
	if _, err := v.kv.Update(ctx, "token."+id, b, e.Revision()); err != nil {
		return nil, fmt.Errorf("join token %s changed meanwhile; try again", id)
	}
	// Into the mirror at once: the next enrol checks names against it.
	v.mu.Lock()
	v.tokens[r.PublicKey] = r
	v.mu.Unlock()
	if req.SiteKey != "" {
		v.event(ctx, "enrolled", map[string]any{"token": id, "node": req.Node, "site": true})
	} else {
		v.event(ctx, "enrolled", map[string]any{"token": id, "node": req.Node})
	}
	return &out, nil
}

// Enrol trades a join token for the mesh's enrolment, as the joining node named node: it
// connects to the addresses the token names with the token's own key, asks enrol, and opens
// the reply with xkp (the joining node's xkey). Each refusal says which: a foreign or
// unknown token is refused at connect, an expired or used-up one by the vault.
func Enrol(ctx context.Context, token, node string, xkp nkeys.KeyPair) (*api.Enrolment, error) {
	return enrolWith(ctx, token, xkp, api.VaultRequest{Node: node})
}

// EnrolSite is Enrol for a site named site (issue 42) whose link authenticates with key (an
// nkey user public key): its enrolment carries the mesh's id, CA and the hub servers' leafnode
// URLs, and no secret of the mesh's.
func EnrolSite(ctx context.Context, token, site, key string, xkp nkeys.KeyPair) (*api.Enrolment, error) {
	return enrolWith(ctx, token, xkp, api.VaultRequest{Node: site, SiteKey: key})
}

// enrolWith is Enrol's and EnrolSite's: req names the node, and the site's key if it is one.
func enrolWith(ctx context.Context, token string, xkp nkeys.KeyPair, req api.VaultRequest) (*api.Enrolment, error) {
	node := req.Node
	b, err := ParseToken(token)
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed([]byte(b.Seed))
	if err != nil {
		return nil, errors.New("join token is damaged: its key does not parse")
	}
	pub, _ := kp.PublicKey()
	xpub, _ := xkp.PublicKey()
	var last, refused error // a refusal says more than an address that did not answer
	for _, addr := range b.Addrs {
		nc, err := nats.Connect(addr, trustCA(b.CA), nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix("_INBOX."+pub),
			nats.MaxReconnects(0), nats.Name("enrol-"+node))
		if err != nil {
			if errors.Is(err, nats.ErrAuthorization) {
				refused = fmt.Errorf("the bus at %s refused join token %s: it is used up, expired, or not a token of the mesh there (the token is for mesh %s); make a new one with `meshnode token create`", addr, b.ID, b.MeshID)
			} else {
				last = fmt.Errorf("join token %s: contact %s: %w", b.ID, addr, err)
			}
			continue
		}
		var out api.Enrolment
		req.XKey, req.MeshID = xpub, b.MeshID
		_, err = CallWith(ctx, nc, xkp, api.VaultVerbEnrol, b.ID, req, &out)
		nc.Close()
		if err != nil {
			return nil, err
		}
		return &out, nil
	}
	if refused != nil {
		return nil, refused
	}
	if last == nil {
		last = fmt.Errorf("join token %s names no address to contact", b.ID)
	}
	return nil, last
}

// trustCA is the nats option that verifies a TLS client port against the CA certificate der
// (a join token's), and connects plainly to a plain one; nothing without one.
func trustCA(der []byte) nats.Option {
	return func(o *nats.Options) error {
		if len(der) == 0 {
			return nil
		}
		pool, err := meshca.PoolOf(der)
		if err != nil {
			return fmt.Errorf("join token is damaged: its CA certificate: %w", err)
		}
		meshca.ClientOptions(o, pool)
		return nil
	}
}
