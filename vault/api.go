package vault

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/meshnode/meshnode/api"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// nodeOnly reports whether only the nodes may ask verb (and need no xkey: nothing secret
// is answered).
func nodeOnly(verb string) bool {
	return verb == api.VaultVerbProvision || verb == api.VaultVerbUnprovision
}

// ErrRefused means the vault refused the request; the error says why.
var ErrRefused = errors.New("vault refused")

// Call sends req as caller for verb and opens the sealed reply, if any, into out. It makes a
// one-time xkey for the reply, so only this call can open it.
func Call(ctx context.Context, nc *nats.Conn, verb, caller string, req api.VaultRequest, out any) ([]api.VaultMeta, error) {
	xkp, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, err
	}
	defer xkp.Wipe()
	req.XKey, _ = xkp.PublicKey()
	return CallWith(ctx, nc, xkp, verb, caller, req, out)
}

// CallWith is Call with the caller's own xkey (req.XKey must be its public key).
func CallWith(ctx context.Context, nc *nats.Conn, xkp Opener, verb, caller string, req api.VaultRequest, out any) ([]api.VaultMeta, error) {
	b, _ := json.Marshal(req)
	subject := api.VaultToolSubject(verb, caller)
	msg, err := nc.RequestWithContext(ctx, subject, b)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("no vault answers %s: is the node ready (`meshnode status`)?", subject)
	}
	if err != nil {
		return nil, fmt.Errorf("vault %s: %w", verb, err)
	}
	var reply api.VaultReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, fmt.Errorf("vault %s answered %q: %w", verb, msg.Data, err)
	}
	if reply.Error != "" {
		return nil, fmt.Errorf("%w: %s", ErrRefused, reply.Error)
	}
	if reply.Sealed != nil && out != nil {
		plain, err := Unseal(xkp, reply.Sender, reply.Sealed)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(plain, out); err != nil {
			return nil, fmt.Errorf("vault %s: sealed reply: %w", verb, err)
		}
	}
	return reply.Meta, nil
}

// IntakeKey asks the vault, as caller (the operator or a node), for its intake xkey.
func IntakeKey(ctx context.Context, nc *nats.Conn, caller string) (string, error) {
	msg, err := nc.RequestWithContext(ctx, api.VaultToolSubject(api.VaultVerbIntake, caller), []byte("{}"))
	if errors.Is(err, nats.ErrNoResponders) {
		return "", fmt.Errorf("no vault answers %s: is the node ready (`meshnode status`)?", api.VaultVerbIntake)
	}
	if err != nil {
		return "", fmt.Errorf("vault %s: %w", api.VaultVerbIntake, err)
	}
	var reply api.VaultReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return "", fmt.Errorf("vault %s answered %q: %w", api.VaultVerbIntake, msg.Data, err)
	}
	if reply.Error != "" || !nkeys.IsValidPublicCurveKey(reply.PublicKey) {
		return "", fmt.Errorf("%w: %s", ErrRefused, reply.Error)
	}
	return reply.PublicKey, nil
}

// Give seals value to the vault's intake key into req, for a mint or rotate that sets it
// instead of a random one: the value travels sealed, and no stream ever holds it.
func Give(ctx context.Context, nc *nats.Conn, caller string, req *api.VaultRequest, value []byte) error {
	key, err := IntakeKey(ctx, nc, caller)
	if err != nil {
		return err
	}
	req.Sealed, req.Sender, err = Seal(key, value)
	return err
}
