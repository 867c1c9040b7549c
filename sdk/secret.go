package sdk

import (
	"context"
	"fmt"

	"github.com/meshnode/meshnode/vault"
)

// Secret fetches one of the module's declared secrets from the vault. The request carries
// the client's xkey (made at Connect, held in memory only) and the value comes back sealed to
// it: it never crosses the bus in the clear and never enters a stream.
func (c *Client) Secret(ctx context.Context, name string) (string, error) {
	self := c.declared()
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var s vault.Secret
	if _, err := vault.CallWith(ctx, c.nc, c.xkey, vault.VerbFetch, self.Module, vault.Request{XKey: c.xpub, Name: name}, &s); err != nil {
		if perr := c.refusal(vault.ToolSubject(vault.VerbFetch, self.Module)); perr != nil {
			return "", fmt.Errorf("%w; does the manifest declare secrets:?", perr)
		}
		return "", err
	}
	return s.Value, nil
}
