package embedbus

import (
	"encoding/base64"
	"sync"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// Identity is what the bus knows of a key allowed to connect.
type Identity struct {
	// Name is how the connection appears in server events and logs, e.g. "module:billing".
	Name string
	// Permissions is what the connection may publish and subscribe to. Nil means everything:
	// only the operator holds such a key.
	Permissions *manifest.Permissions
	// PublishDeny are subjects the connection may never publish on, whatever Permissions
	// allow (a deny wins in nats-server): how a wide allow, such as the node's own JetStream
	// API, is kept off what belongs to another part (the vault's bucket).
	PublishDeny []string
	// System admits the key to the server's system account when it connects under the name
	// SystemConnection: the operator's, so NATS's own tools (`nats server report jetstream`)
	// work with it.
	System bool
	// Leaf admits the key only as a site's leafnode connection, never as a client. Its
	// Permissions are the link's, from the site's side: Publish is what the site may send
	// into this server, Subscribe what it may receive from it.
	Leaf bool
	// SubscribeDeny are subjects the connection may never receive, whatever Permissions
	// allow.
	SubscribeDeny []string
}

// SystemConnection is the connection name under which a key the Directory marks System
// connects to the system account instead: `nats --nkey operator.nk --connection-name
// meshnode-system server report jetstream`.
const SystemConnection = "meshnode-system"

// Directory answers who a public key is. The bus asks it under nats-server's locks, for every
// connection: it must answer from memory and never make a NATS call. name is the connection's
// name as the client set it: instances of one module share a key, and a seat's holder is one
// instance, so the name is part of what decides the permissions.
type Directory interface {
	Identity(publicKey, name string) (Identity, bool)
}

// authenticator is the bus's CustomClientAuthentication: a client proves it holds an nkey
// by signing the server's nonce, and gets exactly the permissions its Directory entry names.
// It keeps nothing per connection: a change of authority finds the connections to kick from
// the server's own list (Bus.connections).
type authenticator struct {
	dir Directory
	// sysKey is the public key of the node's own system-account connection (minted per
	// start, never leaves the process); sysAccount is the server's system account.
	sysKey     string
	sysAccount func() *server.Account
	// complete, hold and closed hold an unknown key at the door while the directory is
	// incomplete (Config.Complete); closed ends every hold (the bus closes).
	complete <-chan struct{}
	hold     time.Duration
	closed   chan struct{}
	stopOnce sync.Once
	// bars are the keys refused until a time (Bus.Bar).
	bars bars
}

// stop ends every hold: the bus closes (nats-server's Shutdown waits for a held Check).
func (a *authenticator) stop() { a.stopOnce.Do(func() { close(a.closed) }) }

var _ server.Authentication = (*authenticator)(nil)

func newAuthenticator(dir Directory) *authenticator {
	return &authenticator{dir: dir}
}

// Check is called by nats-server for each new client connection.
func (a *authenticator) Check(c server.ClientAuthentication) bool {
	kind := c.Kind()
	if kind != server.CLIENT && kind != server.LEAF {
		return false
	}
	opts := c.GetOpts()
	if opts == nil || opts.Nkey == "" || opts.Sig == "" {
		return false
	}
	if a.bars.barred(opts.Nkey, time.Now()) {
		return false
	}
	kp, err := nkeys.FromPublicKey(opts.Nkey)
	if err != nil {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(opts.Sig)
	if err != nil {
		if sig, err = base64.StdEncoding.DecodeString(opts.Sig); err != nil {
			return false
		}
	}
	nonce := c.GetNonce()
	if len(nonce) == 0 || kp.Verify(nonce, sig) != nil {
		return false
	}
	if a.sysKey != "" && opts.Nkey == a.sysKey {
		c.RegisterUser(&server.User{Username: "system", Account: a.sysAccount()})
		return true
	}
	id, ok := a.dir.Identity(opts.Nkey, opts.Name)
	if !ok && a.wait() {
		id, ok = a.dir.Identity(opts.Nkey, opts.Name)
	}
	if !ok || id.Leaf != (kind == server.LEAF) {
		return false
	}
	if id.System && opts.Name == SystemConnection {
		c.RegisterUser(&server.User{Username: id.Name + "-system", Account: a.sysAccount()})
		return true
	}
	c.RegisterUser(&server.User{Username: id.Name, Permissions: serverPermissions(id)})
	return true
}

// wait waits, up to the hold, for the directory to be complete, and reports whether it is.
// It blocks only the connecting client's own read loop: nats-server stopped the client's
// authentication timer when its CONNECT arrived, and the client's own connect timeout
// usually ends the attempt first (nats.go 2 s, async-nats 5 s), which it retries like a
// server that is not there.
func (a *authenticator) wait() bool {
	if a.complete == nil {
		return false
	}
	select {
	case <-a.complete:
		return true
	default:
	}
	t := time.NewTimer(a.hold)
	defer t.Stop()
	select {
	case <-a.complete:
		return true
	case <-t.C:
	case <-a.closed:
	}
	return false
}

// serverPermissions turns an identity's derived permissions into nats-server's. Allow lists only: anything
// not listed is denied, the JetStream API included.
// The identity's PublishDeny and SubscribeDeny are added to the deny lists.
func serverPermissions(id Identity) *server.Permissions {
	p := id.Permissions
	if p == nil {
		return nil
	}
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: append([]string{}, p.Publish...)},
		Subscribe: &server.SubjectPermission{Allow: make([]string, 0, len(p.Subscribe))},
	}
	for _, s := range p.Subscribe {
		entry := s.Subject
		if s.Queue != "" {
			entry += " " + s.Queue
		}
		sp.Subscribe.Allow = append(sp.Subscribe.Allow, entry)
	}
	// AllowResponses adds nothing: where a connection may answer is in p.Publish. Not
	// nats-server's ResponsePermission, which lets a connection answer on whatever reply
	// subject a request names, past every allow and deny list.
	if len(sp.Publish.Allow) == 0 {
		// An empty allow list means "no restriction" to nats-server; deny everything instead.
		sp.Publish = &server.SubjectPermission{Deny: []string{">"}}
	} else if len(id.PublishDeny) > 0 {
		sp.Publish.Deny = append([]string{}, id.PublishDeny...)
	}
	if len(sp.Subscribe.Allow) == 0 {
		sp.Subscribe = &server.SubjectPermission{Deny: []string{">"}}
	} else if len(id.SubscribeDeny) > 0 {
		sp.Subscribe.Deny = append([]string{}, id.SubscribeDeny...)
	}
	return sp
}
