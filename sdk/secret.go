package sdk

import (
	"context"
	"fmt"
	"slices"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/vault"
)

// Secret fetches one of the module's declared secrets from the vault. The request carries
// the client's xkey (made at Connect, held in memory only) and the value comes back sealed to
// it: it never crosses the bus in the clear and never enters a stream.
func (c *Client) Secret(ctx context.Context, name string) (string, error) {
	return c.SecretVersion(ctx, name, 0)
}

// SecretVersion fetches a given version of a declared secret (0: the current one); an
// earlier version is readable during the grace period after a rotation.
func (c *Client) SecretVersion(ctx context.Context, name string, version int) (string, error) {
	self := c.declared()
	if !slices.Contains(self.Secrets, name) {
		return "", fmt.Errorf("%w: module %s does not declare secret %q (it declares %v); add it to secrets: in its manifest and re-register",
			ErrNotDeclared, self.Module, name, self.Secrets)
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ctx, stop := c.watch(ctx, api.VaultToolSubject(api.VaultVerbFetch, api.VaultModuleCaller(self.Module)))
	defer stop()
	xkey, xpub, err := c.xkeys()
	if err != nil {
		return "", err
	}
	var s api.Secret
	if _, err := vault.CallWith(ctx, c.nc, xkey, api.VaultVerbFetch, api.VaultModuleCaller(self.Module), api.VaultRequest{XKey: xpub, Name: name, Version: version}, &s); err != nil {
		if r := Refused(ctx); r != nil {
			return "", fmt.Errorf("fetch secret %s: %w; does the manifest declare secrets:?", name, r)
		}
		return "", err
	}
	return s.Value, nil
}
