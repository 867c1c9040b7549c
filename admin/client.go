// Package admin is the operator's side of the controller's registry tools: register, rotate
// a key, remove, list. The CLI, the bench and the tests call it; the controller answers.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// ErrRefused means the controller refused a request; the error says why.
var ErrRefused = errors.New("refused")

// Registered is the outcome of a registration.
type Registered struct {
	api.RegisterReply
	// Seed is the new module's nkey seed, opened from the sealed reply; nil on
	// re-registration (the module keeps its key).
	Seed []byte
}

// Register asks the controller to register the manifest in yamlText. A new module's seed
// comes back sealed to a one-time xkey made here, and is opened before returning.
func Register(ctx context.Context, nc *nats.Conn, yamlText []byte) (*Registered, error) {
	return register(ctx, nc, yamlText, false)
}

// RotateKey re-registers the manifest in yamlText, of a module already registered, with a new
// key minted by the vault in place of the old one: the way back from a lost seed. The old
// key stops working (its connections are kicked); the new seed is returned as Register
// returns a new module's.
func RotateKey(ctx context.Context, nc *nats.Conn, yamlText []byte) (*Registered, error) {
	return register(ctx, nc, yamlText, true)
}

func register(ctx context.Context, nc *nats.Conn, yamlText []byte, rotate bool) (*Registered, error) {
	if err := manifest.CheckSize(len(yamlText)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	xkp, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, err
	}
	defer xkp.Wipe()
	xpub, _ := xkp.PublicKey()
	var reply api.RegisterReply
	err = call(ctx, nc, api.RegisterSubject, api.RegisterRequest{Manifest: string(yamlText), XKey: xpub, RotateKey: rotate}, &reply)
	if errors.Is(err, ErrRefused) && len(reply.Refusals) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrRefused, manifest.Refusals(reply.Refusals))
	}
	if err != nil {
		return nil, err
	}
	out := &Registered{RegisterReply: reply}
	if reply.Created || reply.Rotated {
		plain, err := vault.Unseal(xkp, reply.SenderXKey, reply.SealedSeed)
		if err != nil {
			return nil, err
		}
		var id api.Identity
		if err := json.Unmarshal(plain, &id); err != nil {
			return nil, fmt.Errorf("register: sealed identity: %w", err)
		}
		if id.PublicKey != reply.PublicKey {
			return nil, fmt.Errorf("register: the sealed identity is %s, the registration %s", id.PublicKey, reply.PublicKey)
		}
		out.Seed = []byte(id.Seed)
	}
	return out, nil
}

// Remove asks the controller to remove a module.
func Remove(ctx context.Context, nc *nats.Conn, req api.RemoveRequest) (api.RemoveReply, error) {
	var reply api.RemoveReply
	err := call(ctx, nc, api.RemoveSubject, req, &reply)
	return reply, err
}

// Pin asks the controller to move a module to a version of a seat's protocol.
func Pin(ctx context.Context, nc *nats.Conn, req api.PinRequest) (api.PinReply, error) {
	var reply api.PinReply
	err := call(ctx, nc, api.PinSubject, req, &reply)
	return reply, err
}

// Deploy asks the controller to set a module's deployment.
func Deploy(ctx context.Context, nc *nats.Conn, req api.DeployRequest) (api.DeployReply, error) {
	return deployCall(ctx, nc, api.DeploySubject, req)
}

// Undeploy asks the controller to stop a module on some nodes, or everywhere.
func Undeploy(ctx context.Context, nc *nats.Conn, req api.UndeployRequest) (api.DeployReply, error) {
	return deployCall(ctx, nc, api.UndeploySubject, req)
}

func deployCall(ctx context.Context, nc *nats.Conn, subject string, req any) (api.DeployReply, error) {
	var reply api.DeployReply
	err := call(ctx, nc, subject, req, &reply)
	return reply, err
}

// Ps asks the controller what runs where.
func Ps(ctx context.Context, nc *nats.Conn) ([]api.Process, error) {
	var reply api.PsReply
	if err := call(ctx, nc, api.PsSubject, struct{}{}, &reply); err != nil {
		return nil, err
	}
	return reply.Processes, nil
}

// Builds asks the controller for the latest builds of the cascade.
func Builds(ctx context.Context, nc *nats.Conn) ([]api.Build, error) {
	var reply api.BuildsReply
	if err := call(ctx, nc, api.BuildsSubject, struct{}{}, &reply); err != nil {
		return nil, err
	}
	return reply.Builds, nil
}

// List asks the controller for every registered module, a page at a time.
func List(ctx context.Context, nc *nats.Conn) ([]api.ModuleInfo, error) {
	out := []api.ModuleInfo{}
	var after string
	for {
		var reply api.ListReply
		if err := call(ctx, nc, api.ListSubject, api.ListRequest{After: after}, &reply); err != nil {
			return nil, err
		}
		out = append(out, reply.Modules...)
		if reply.Next == "" {
			return out, nil
		}
		if reply.Next <= after {
			return nil, fmt.Errorf("%s: the page after %q starts again at %q", api.ListSubject, after, reply.Next)
		}
		after = reply.Next
	}
}

// call asks the controller's tool on subject and decodes its answer into reply; an answer
// that says an error is ErrRefused, with reply decoded all the same.
func call(ctx context.Context, nc *nats.Conn, subject string, req, reply any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	msg, err := nc.RequestWithContext(ctx, subject, b)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%w: no controller answers %s; is the node ready (`meshnode status`), and is some node a candidate for mesh-controller (mesh-seats)?", err, subject)
	}
	if err != nil {
		if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
			return fmt.Errorf("%s: %w (these credentials may not administer the mesh; use the operator's seed)", subject, last)
		}
		return fmt.Errorf("%s: %w", subject, err)
	}
	if err := json.Unmarshal(msg.Data, reply); err != nil {
		return fmt.Errorf("%s answered %q: %w", subject, msg.Data, err)
	}
	// Every controller reply says a refusal in its "error" (reply holds the rest).
	var refused struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(msg.Data, &refused) == nil && refused.Error != "" {
		return fmt.Errorf("%w: %s", ErrRefused, refused.Error)
	}
	return nil
}

// Provisions asks the controller for every deployed consumer's provisions.
func Provisions(ctx context.Context, nc *nats.Conn) ([]api.Provision, error) {
	var reply api.ProvisionsReply
	if err := call(ctx, nc, api.ProvisionsSubject, struct{}{}, &reply); err != nil {
		return nil, err
	}
	return reply.Provisions, nil
}

// Provide chooses the seat that provides a module's required interface.
func Provide(ctx context.Context, nc *nats.Conn, req api.ProvideRequest) (api.ProvideReply, error) {
	var reply api.ProvideReply
	err := call(ctx, nc, api.ProvideSubject, req, &reply)
	return reply, err
}
