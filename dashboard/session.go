package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// A session is a signed cookie, not a row in the node's memory: it names its mode, its
// operator key and when it expires, and the node's session key signs it, so it survives a
// restart of the node. Logging out revokes it (the store keeps the revoked ids until they
// would have expired), and a change of the operator's key ends every session signed under
// the old one.

// SessionStore keeps what sessions need across the node's restarts: the key they are signed
// with, and the sessions logged out before they expire.
type SessionStore interface {
	// SessionKey returns the key sessions are signed with, made once and kept.
	SessionKey() ([]byte, error)
	// Revoke records that session id is logged out; it need not be kept after until.
	Revoke(id string, until time.Time) error
	// Revoked reports whether session id was logged out.
	Revoked(id string) bool
}

// sessionClaims is what a session's cookie says, signed.
type sessionClaims struct {
	ID       string `json:"i"`
	Mode     string `json:"m"`
	Expires  int64  `json:"e"` // Unix seconds
	Operator string `json:"o"` // the operator's key that signed the login
}

// sessionVersion starts every session cookie: a later format is told apart by it.
const sessionVersion = "s1"

// signSession returns the cookie value of claims for node under key.
func signSession(key []byte, node string, c sessionClaims) string {
	body, _ := json.Marshal(c)
	payload := base64.RawURLEncoding.EncodeToString(body)
	return sessionVersion + "." + payload + "." + base64.RawURLEncoding.EncodeToString(sessionMAC(key, node, payload))
}

func sessionMAC(key []byte, node, payload string) []byte {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "meshnode-ui-session:%s:%s", node, payload)
	return m.Sum(nil)
}

// Errors of reading a session cookie.
var (
	errSessionForged  = errors.New("session not signed by this node")
	errSessionExpired = errors.New("session expired")
)

// openSession checks value's signature under key for node and its expiry at now, and returns
// what it claims.
func openSession(key []byte, node, value string, now time.Time) (sessionClaims, error) {
	var c sessionClaims
	version, rest, ok := strings.Cut(value, ".")
	payload, mac, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || version != sessionVersion {
		return c, errSessionForged
	}
	got, err := base64.RawURLEncoding.DecodeString(mac)
	if err != nil || !hmac.Equal(got, sessionMAC(key, node, payload)) {
		return c, errSessionForged
	}
	body, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil || json.Unmarshal(body, &c) != nil || c.ID == "" {
		return c, errSessionForged
	}
	if !now.Before(time.Unix(c.Expires, 0)) {
		return c, errSessionExpired
	}
	return c, nil
}

// csrfOf is session id's CSRF token: derived, so nothing per session is stored.
func csrfOf(key []byte, id string) string {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "meshnode-ui-csrf:%s", id)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// sessionsBucket is the node store's bucket of the console's sessions: "key", and
// "revoked.<id>" with the time it may be forgotten.
var sessionsBucket = []byte("dashboard-sessions")

// BoltSessions keeps the sessions' key and revocations in the node's store, db.
func BoltSessions(db *bolt.DB) SessionStore { return &boltSessions{db: db} }

type boltSessions struct {
	db *bolt.DB

	mu  sync.Mutex
	key []byte // read or made once: every request checks its cookie against it
}

func (s *boltSessions) SessionKey() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.key != nil {
		return s.key, nil
	}
	var key []byte
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(sessionsBucket)
		if err != nil {
			return err
		}
		if k := b.Get([]byte("key")); len(k) == 32 {
			key = append([]byte(nil), k...)
			return nil
		}
		key = make([]byte, 32)
		rand.Read(key)
		return b.Put([]byte("key"), key)
	})
	if err != nil {
		return nil, fmt.Errorf("the console's session key in the node's store: %w", err)
	}
	s.key = key
	return key, nil
}

func (s *boltSessions) Revoke(id string, until time.Time) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(sessionsBucket)
		if err != nil {
			return err
		}
		now := time.Now().Unix()
		var over [][]byte // what no longer needs keeping: its session would have expired
		c := b.Cursor()
		for k, v := c.Seek([]byte("revoked.")); k != nil && strings.HasPrefix(string(k), "revoked."); k, v = c.Next() {
			if len(v) == 8 && int64(binary.BigEndian.Uint64(v)) < now {
				over = append(over, append([]byte(nil), k...))
			}
		}
		for _, k := range over {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return b.Put([]byte("revoked."+id), binary.BigEndian.AppendUint64(nil, uint64(until.Unix())))
	})
}

func (s *boltSessions) Revoked(id string) bool {
	revoked := false
	s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(sessionsBucket); b != nil {
			revoked = b.Get([]byte("revoked."+id)) != nil
		}
		return nil
	})
	return revoked
}

// memorySessions is a SessionStore in memory, for a dashboard given none: its sessions end
// with the process.
type memorySessions struct {
	mu      sync.Mutex
	key     []byte
	revoked map[string]time.Time
}

func (m *memorySessions) SessionKey() ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.key == nil {
		m.key = make([]byte, 32)
		rand.Read(m.key)
	}
	return m.key, nil
}

func (m *memorySessions) Revoke(id string, until time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.revoked == nil {
		m.revoked = map[string]time.Time{}
	}
	for k, t := range m.revoked {
		if time.Now().After(t) {
			delete(m.revoked, k)
		}
	}
	m.revoked[id] = until
	return nil
}

func (m *memorySessions) Revoked(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.revoked[id]
	return ok
}
