package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

// addClientFlags adds the flags of verbs that talk to a running node over its bus.
func addClientFlags(cmd *cobra.Command) {
	addConfigFlags(cmd)
	cmd.Flags().String("server", "", "NATS URL of the node (default: the node running on --data-dir, from its node.json)")
	cmd.Flags().String("creds", "", "nkey seed file to connect with (default: the operator's, <data-dir>/operator.nk)")
	cmd.Flags().String("ca", "", "the mesh's CA certificate, to verify a node whose client port is TLS (default: <data-dir>/ca.pem, when there is one)")
	addContextFlag(cmd)
}

// addContextFlag adds --context: the saved context a client verb talks to.
func addContextFlag(cmd *cobra.Command) {
	cmd.Flags().String("context", "", "the saved context to use, by `name` (meshnode context ls lists them; env MESHNODE_CONTEXT; default: the selected one)")
}

// clientCA is the CA certificate file a client verb trusts: --ca, or the data dir's ca.pem
// when there is one; "" when neither (a loopback client port is plain).
func clientCA(cmd *cobra.Command) string {
	if ca, _ := firstSet(cmd, "ca", envCA, func(c *cliContext) string { return c.CA }); ca != "" {
		return ca
	}
	if dir, err := clientDataDir(cmd); err == nil {
		if path := filepath.Join(dir, meshca.CAFile); fileExists(path) {
			return path
		}
	}
	return ""
}

// caOptions are the nats options of trusting clientCA.
func caOptions(cmd *cobra.Command) []nats.Option {
	if ca := clientCA(cmd); ca != "" {
		return []nats.Option{sdk.TrustCA(ca)}
	}
	return nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// clientTarget resolves where a client verb connects and with which seed.
func clientTarget(cmd *cobra.Command) (url, creds string, err error) {
	if url, err = firstSet(cmd, "server", envServer, func(c *cliContext) string { return c.Server }); err != nil {
		return "", "", err
	}
	if url != "" {
		if err := checkServerURL(url); err != nil {
			return "", "", err
		}
	}
	if creds, err = firstSet(cmd, "creds", envCreds, func(c *cliContext) string { return c.Creds }); err != nil {
		return "", "", err
	}
	if creds != "" {
		if err := checkSeedFile(creds); err != nil {
			return "", "", err
		}
	}
	if url != "" && creds != "" {
		return url, creds, nil
	}
	dataDir, err := clientDataDir(cmd)
	if err != nil {
		return "", "", err
	}
	if url == "" {
		info, err := datadir.ReadInfo(dataDir)
		if err != nil {
			return "", "", fmt.Errorf("%w; or pass --server URL", err)
		}
		url = info.ClientURL
	}
	if creds == "" {
		creds = filepath.Join(dataDir, datadir.OperatorSeedFile)
		if _, err := os.Stat(creds); errors.Is(err, fs.ErrNotExist) {
			return "", "", fmt.Errorf("no operator seed at %s; pass --creds FILE (or --data-dir of the node)", creds)
		}
	}
	return url, creds, nil
}

// writeJSONLines writes xs as one JSON object per line: every list verb's --json.
func writeJSONLines[T any](w io.Writer, xs []T) error {
	enc := json.NewEncoder(w)
	for _, x := range xs {
		if err := enc.Encode(x); err != nil {
			return err
		}
	}
	return nil
}

// dial connects to the node as the identity in the seed file.
func dial(cmd *cobra.Command, opts ...nats.Option) (*nats.Conn, error) {
	url, creds, err := clientTarget(cmd)
	if err != nil {
		return nil, err
	}
	return dialWith(url, creds, append(caOptions(cmd), opts...)...)
}

// withBus runs f with a connection as the operator (or --creds) and a context bounded by
// requestTimeout: the shape of every client verb's one request. The connection is the verb's
// alone, so any permission violation on it is the verb's failure: it ends the context at
// once (nats.go would leave the request waiting for its timeout) and becomes the error.
func withBus(cmd *cobra.Command, f func(ctx context.Context, nc *nats.Conn) error) error {
	return withBusFor(cmd, requestTimeout, f)
}

// withBusFor is withBus with the verb's whole time bounded by timeout, or by nothing when
// it is 0 (a verb that hears from the node as it goes bounds its waits itself).
func withBusFor(cmd *cobra.Command, timeout time.Duration, f func(ctx context.Context, nc *nats.Conn) error) error {
	url, creds, err := clientTarget(cmd)
	if err != nil {
		return err
	}
	// No reconnect: a verb's one request waits for no node that went away (nats.go keeps a
	// request through a reconnect until its timeout; closed, it fails at once).
	nc, err := dialWith(url, creds, append(caOptions(cmd), nats.NoReconnect())...)
	if err != nil {
		return err
	}
	defer nc.Close()
	refusals := sdk.NewRefusals(strings.TrimSuffix(nats.InboxPrefix, "."))
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { refusals.Handle(err) })
	ctx, cancel := context.WithCancel(context.Background())
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), timeout)
	}
	defer cancel()
	ctx, stop := refusals.Watch(ctx, "")
	defer stop()
	err = f(ctx, nc)
	if r := sdk.Refused(ctx); err != nil && r != nil {
		return refused(cmd, nc, creds, r)
	}
	if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrDisconnected) {
		return fmt.Errorf("the node at %s went away before it answered (%w): whether it carried the request out is unknown; look before trying again", url, err)
	}
	return err
}

// refusedError is a client verb refused by the bus: the key is not the operator's.
type refusedError struct {
	msg string
	r   *sdk.Refusal
}

func (e *refusedError) Error() string { return e.msg }
func (e *refusedError) Unwrap() error { return e.r }

// refused says which operation the bus refused the key in creds, and what to do. A request
// subscribes to its reply inbox before it publishes, and the bus refuses a module's key both;
// the publish names the verb, so it is preferred: after a flush the connection's last error
// is the server's answer to the last thing sent.
func refused(cmd *cobra.Command, nc *nats.Conn, creds string, r *sdk.Refusal) error {
	if r.Op != sdk.RefusedPublish && nc.FlushTimeout(time.Second) == nil {
		if last := sdk.AsRefusal(nc.LastError()); last != nil && last.Op == sdk.RefusedPublish {
			r = last
		}
	}
	operator := filepath.Join("<data-dir>", datadir.OperatorSeedFile)
	if dir, err := clientDataDir(cmd); err == nil {
		operator = filepath.Join(dir, datadir.OperatorSeedFile)
	}
	return &refusedError{r: r, msg: fmt.Sprintf("the key in %s may not %s %s: admin verbs need the operator's seed (%s) or --creds of the operator",
		creds, r.Op, r.Subject, operator)}
}

// withModule runs f as the module whose seed --creds names, through the sdk.
func withModule(cmd *cobra.Command, f func(ctx context.Context, c *sdk.Client) error) error {
	url, creds, err := clientTarget(cmd)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	c, err := sdk.Connect(ctx, url, creds, sdk.RootCA(clientCA(cmd)))
	if err != nil {
		return err
	}
	defer c.Close()
	return f(ctx, c)
}

func dialWith(url, creds string, opts ...nats.Option) (*nats.Conn, error) {
	nkey, err := nats.NkeyOptionFromSeed(creds)
	if err != nil {
		return nil, fmt.Errorf("read seed %s: %w", creds, err)
	}
	quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}) // errors are read and reported
	// The operator's inbox: where modules' tools answer (a module may answer nowhere else).
	nc, err := nats.Connect(url, append([]nats.Option{nkey, quiet, nats.Name("meshnode-cli"),
		nats.CustomInboxPrefix(manifest.OperatorInbox)}, opts...)...)
	if err != nil {
		var unknownCA x509.UnknownAuthorityError
		switch {
		case errors.Is(err, nats.ErrAuthorization):
			return nil, fmt.Errorf("the bus at %s refused the key in %s: it is neither the operator's nor a registered module's", url, creds)
		case errors.As(err, &unknownCA):
			return nil, fmt.Errorf("connect to %s: %w; its client port is TLS with a certificate from the mesh's CA: trust that CA with --ca FILE (or %s), FILE being ca.pem in any node's data dir", url, err, envCA)
		case errors.Is(err, nats.ErrSecureConnRequired):
			return nil, fmt.Errorf("connect to %s: %w; its client port is TLS: connect to tls://%s and trust the mesh's CA with --ca FILE (ca.pem in any node's data dir)", url, err, strings.TrimPrefix(url, "nats://"))
		}
		return nil, fmt.Errorf("connect to %s: %w; is the node running (`meshnode status`)?", url, err)
	}
	return nc, nil
}

// byServer reports whether a client verb names its node by server — --server,
// MESHNODE_SERVER, or a context with a server — rather than by data dir: then the node is
// asked over its bus, and nothing of this machine's data dirs is read.
func byServer(cmd *cobra.Command) (bool, error) {
	url, err := firstSet(cmd, "server", envServer, func(c *cliContext) string { return c.Server })
	return url != "", err
}

// askNode asks the node the verb connects to — the server of its client port, whichever
// node of the mesh that is — for one of its tools (api.NodeToolStatus, ...), as the
// operator, and decodes the answer into out.
func askNode(cmd *cobra.Command, tool string, out any) error {
	return withBus(cmd, func(ctx context.Context, nc *nats.Conn) error {
		name := nc.ConnectedServerName()
		msg, err := nc.RequestWithContext(ctx, manifest.NodeToolSubject(name, tool), nil)
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("node %s at %s does not answer its %s tool: it is still starting (try again in a few seconds), or runs a meshnode older than this one (upgrade it, or run this verb on its machine with --data-dir)",
				name, nc.ConnectedUrlRedacted(), tool)
		}
		if err != nil {
			return fmt.Errorf("ask node %s for its %s: %w", name, tool, err)
		}
		if err := json.Unmarshal(msg.Data, out); err != nil {
			return fmt.Errorf("node %s answered its %s tool with %q: %w", name, tool, msg.Data, err)
		}
		return nil
	})
}
