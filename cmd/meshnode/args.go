package main

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/meshnode/meshnode/manifest"
	"github.com/spf13/cobra"
)

// nameArg is a positional argument that names a thing of the mesh (a module, a secret, a
// seat, a node): a plain name, lower-case letters, digits and '-'. One that is not is the
// caller's mistake, refused before anything is asked (exit 2), not sent to the node to be
// refused as unknown (exit 1): `module remove 'x y'`, `vault mint a/b`, `artifact put ../x`.
type nameArg struct {
	what string // "module": what the argument names; "" for an argument that is not a name
	list string // the command that lists the valid ones
}

var (
	argModule = nameArg{"module", "`meshnode module ls` lists the registered modules"}
	argSecret = nameArg{"secret", "`meshnode vault ls` lists the secrets"}
	argSeat   = nameArg{"seat", "`meshnode seat ls` lists the seats"}
	argNode   = nameArg{"node", "`meshnode members` lists the nodes"}
	argOther  = nameArg{}
)

// namedArgs is check, then for each args[i] with a names[i] naming something, that it is a
// plain name.
func namedArgs(check cobra.PositionalArgs, names ...nameArg) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return err
		}
		for i, a := range args {
			if i < len(names) && names[i].what != "" {
				if err := names[i].check(a); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

// check refuses s when it is not a plain name, saying what names one and where to find them.
func (n nameArg) check(s string) error {
	if manifest.ValidName(s) {
		return nil
	}
	return fmt.Errorf("%q is not a %s name: a %s is named with lower-case letters, digits and '-', at most %d characters; %s",
		s, n.what, n.what, manifest.MaxNameLen, n.list)
}

// moduleFlag is a flag's value that names a module (--owner), checked as a positional
// argument naming one is; a flag's error is a usage error.
type moduleFlag string

func (m *moduleFlag) String() string { return string(*m) }

// Type names the flag's value in --help.
func (m *moduleFlag) Type() string { return "module" }

// Set refuses a value that is no module name.
func (m *moduleFlag) Set(s string) error {
	if err := argModule.check(s); err != nil {
		return err
	}
	*m = moduleFlag(s)
	return nil
}

// serverSchemes are the URL schemes nats.go connects with.
var serverSchemes = map[string]bool{"nats": true, "tls": true, "ws": true, "wss": true}

// checkServerURL refuses a server URL (from --server, MESHNODE_SERVER or a context) that
// nats.go could never connect to as a usage error: `--server 'ht!tp://x'` failed as a
// connection, exit 1, asking whether the node runs. servers may list several, comma-separated;
// one without a scheme is nats://, as nats.go reads it.
func checkServerURL(servers string) error {
	for s := range strings.SplitSeq(servers, ",") {
		s = strings.TrimSpace(s)
		full := s
		if !strings.Contains(s, "://") {
			full = "nats://" + s
		}
		if u, err := url.Parse(full); err != nil || !serverSchemes[u.Scheme] || u.Hostname() == "" {
			return usagef("server %q is not a NATS URL: write nats://HOST:PORT, or tls://HOST:PORT for a TLS client port (a node's `meshnode status` prints its client URL)", s)
		}
	}
	return nil
}
