package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// A context names a node to talk to, like `nats context`: its server URL, the seed to connect
// with and the CA to trust, or the data dir of a node on this machine (whose node.json and
// operator.nk say the rest). Contexts live in <user config dir>/meshnode/contexts/NAME.json;
// the selected one's name in <user config dir>/meshnode/context.
//
// A client verb finds its node from, first to last: --server/--creds/--ca; MESHNODE_SERVER,
// MESHNODE_CREDS, MESHNODE_CA; the context (--context, MESHNODE_CONTEXT, or the selected
// one); the data dir (--data-dir, MESHNODE_DATA_DIR, --config, or the default ones). A verb
// that names its node by data dir or by server uses no context at all: a context's seed and
// CA are never offered to another node.

// cliContext is one saved context.
type cliContext struct {
	Name        string `json:"name"`
	Server      string `json:"server,omitempty"`
	Creds       string `json:"creds,omitempty"`
	CA          string `json:"ca,omitempty"`
	DataDir     string `json:"data_dir,omitempty"`
	Description string `json:"description,omitempty"`
}

// Environment variables of client verbs.
const (
	envServer  = "MESHNODE_SERVER"
	envCreds   = "MESHNODE_CREDS"
	envCA      = "MESHNODE_CA"
	envContext = "MESHNODE_CONTEXT"
)

// contextName is a context name's characters; its length, at most 64, is checked apart
// (a counted repetition compiles to a copy of the class for each count).
var contextName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

func contextsDir() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("no user config directory for contexts (%w): set XDG_CONFIG_HOME or HOME", err)
	}
	return filepath.Join(dir, "meshnode"), nil
}

func contextPath(name string) (string, error) {
	if len(name) > 64 || !contextName.MatchString(name) {
		return "", usagef("%q is not a context name: letters, digits, '.', '_' and '-', up to 64", name)
	}
	dir, err := contextsDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "contexts", name+".json"), nil
}

func readContext(name string) (cliContext, error) {
	path, err := contextPath(name)
	if err != nil {
		return cliContext{}, err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cliContext{}, fmt.Errorf("no context %q: `meshnode context ls` lists them, `meshnode context add` makes one", name)
	}
	if err != nil {
		return cliContext{}, err
	}
	var c cliContext
	if err := json.Unmarshal(b, &c); err != nil {
		return cliContext{}, fmt.Errorf("context %s (%s) is damaged: %w; remove it with `meshnode context rm %s`", name, path, err, name)
	}
	c.Name = name
	return c, nil
}

// selectedContext is the name of the selected context ("" when none).
func selectedContext() string {
	dir, err := contextsDir()
	if err != nil {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(dir, "context"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// activeContext is the context a client verb uses: --context, MESHNODE_CONTEXT or the
// selected one; nil when none is.
func activeContext(cmd *cobra.Command) (*cliContext, error) {
	name, _ := cmd.Flags().GetString("context")
	if name == "" {
		name = os.Getenv(envContext)
	}
	if name == "" {
		name = selectedContext()
	}
	if name == "" {
		return nil, nil
	}
	c, err := readContext(name)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// contextNames lists the saved contexts' names, sorted.
func contextNames() []string {
	dir, err := contextsDir()
	if err != nil {
		return nil
	}
	files, _ := filepath.Glob(filepath.Join(dir, "contexts", "*.json"))
	var out []string
	for _, f := range files {
		out = append(out, strings.TrimSuffix(filepath.Base(f), ".json"))
	}
	slices.Sort(out)
	return out
}

// contextOf is the context a client verb's target comes from: none when the verb names its
// node otherwise — a data dir (flag, configuration, environment) or a server (--server,
// MESHNODE_SERVER) — so a saved context never lends its seed or CA to another node, nor its
// server to a data dir's node.
func contextOf(cmd *cobra.Command) (*cliContext, error) {
	if explicitDataDir(cmd) || os.Getenv(envServer) != "" {
		return nil, nil
	}
	if v, _ := cmd.Flags().GetString("server"); v != "" {
		return nil, nil
	}
	return activeContext(cmd)
}

// firstSet is the first of the flag, the environment variable and the context's value that
// is set.
func firstSet(cmd *cobra.Command, flag, env string, fromContext func(*cliContext) string) (string, error) {
	if v, _ := cmd.Flags().GetString(flag); v != "" {
		return v, nil
	}
	if v := os.Getenv(env); v != "" {
		return v, nil
	}
	c, err := contextOf(cmd)
	if err != nil || c == nil {
		return "", err
	}
	return fromContext(c), nil
}

func newContextCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "context",
		Short: "Name the nodes you talk to: server, seed and CA, or a data dir (like `nats context`)",
		Long: `A context names a node to talk to: its server URL, the seed file to connect with and the
CA to trust, or the data dir of a node on this machine (its node.json and operator.nk say
the rest). Select one with ` + "`context use`" + `, or name it per command with --context or
MESHNODE_CONTEXT. Flags and MESHNODE_SERVER, MESHNODE_CREDS, MESHNODE_CA win over a context.`,
		Example: `  meshnode context add prod --server tls://10.0.0.2:4222 --creds ~/prod-operator.nk --ca ~/prod-ca.pem
  meshnode context add here --data-dir /var/lib/meshnode --select
  meshnode context ls
  meshnode --context prod module ls`,
	}
	cmd.AddCommand(newContextAddCmd(), newContextUseCmd(), newContextLsCmd(), newContextRmCmd())
	return cmd
}

func newContextAddCmd() *cobra.Command {
	var c cliContext
	var sel bool
	cmd := &cobra.Command{
		Use:   "add NAME (--server URL --creds FILE [--ca FILE] | --data-dir DIR) [--select]",
		Short: "Save a context (replacing one of that name)",
		Example: `  meshnode context add prod --server tls://10.0.0.2:4222 --creds ~/prod-operator.nk --ca ~/prod-ca.pem --select
  meshnode context add here --data-dir /var/lib/meshnode`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := contextPath(args[0])
			if err != nil {
				return err
			}
			c.Name = args[0]
			if (c.Server == "") == (c.DataDir == "") {
				return usagef("give --server (with --creds) or --data-dir")
			}
			if c.Server != "" {
				u, err := url.Parse(c.Server)
				if err != nil || !slices.Contains([]string{"nats", "tls"}, u.Scheme) || u.Host == "" {
					return usagef("--server %q: want nats://HOST:PORT or tls://HOST:PORT", c.Server)
				}
				if c.Creds == "" {
					return usagef("--server needs --creds FILE: the seed to connect with")
				}
			}
			for _, f := range []*string{&c.Creds, &c.CA, &c.DataDir} {
				if *f == "" {
					continue
				}
				abs, err := filepath.Abs(*f)
				if err != nil {
					return err
				}
				if _, err := os.Stat(abs); err != nil {
					return fmt.Errorf("context %s: %w", c.Name, err)
				}
				*f = abs
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				return err
			}
			b, _ := json.MarshalIndent(c, "", "  ")
			if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "context %s saved\n", c.Name)
			if sel {
				return useContext(cmd, c.Name)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&c.Server, "server", "", "NATS URL of the node")
	cmd.Flags().StringVar(&c.Creds, "creds", "", "nkey seed file to connect with")
	cmd.Flags().StringVar(&c.CA, "ca", "", "the mesh's CA certificate, for a TLS client port")
	cmd.Flags().StringVar(&c.DataDir, "data-dir", "", "the data dir of a node on this machine")
	cmd.Flags().StringVar(&c.Description, "description", "", "what it is")
	cmd.Flags().BoolVar(&sel, "select", false, "select it too")
	return cmd
}

func useContext(cmd *cobra.Command, name string) error {
	if _, err := readContext(name); err != nil {
		return err
	}
	dir, err := contextsDir()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "context"), []byte(name+"\n"), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "context %s selected\n", name)
	return nil
}

func newContextUseCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "use NAME",
		Short:   "Select a context: client verbs use it when no flag or variable says otherwise",
		Example: "  meshnode context use prod",
		Args:    cobra.ExactArgs(1),
		RunE:    func(cmd *cobra.Command, args []string) error { return useContext(cmd, args[0]) },
	}
}

func newContextRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME",
		Short:   "Remove a context",
		Example: "  meshnode context rm old",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := contextPath(args[0])
			if err != nil {
				return err
			}
			if err := os.Remove(path); errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("no context %q: `meshnode context ls` lists them", args[0])
			} else if err != nil {
				return err
			}
			if selectedContext() == args[0] {
				dir, _ := contextsDir()
				os.Remove(filepath.Join(dir, "context"))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "context %s removed\n", args[0])
			return nil
		},
	}
}

// contextRow is one line of `context ls --json`.
type contextRow struct {
	cliContext
	Selected bool `json:"selected"`
}

func newContextLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls [--json]",
		Short:   "List the contexts; the selected one is marked",
		Example: "  meshnode context ls --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := contextsDir(); err != nil {
				return err
			}
			sel := selectedContext()
			var rows []contextRow
			for _, name := range contextNames() {
				c, err := readContext(name)
				if err != nil {
					return err
				}
				rows = append(rows, contextRow{cliContext: c, Selected: name == sel})
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), rows)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "\tNAME\tSERVER OR DATA DIR\tCREDS\tDESCRIPTION")
			for _, r := range rows {
				mark, where := "", r.Server
				if r.Selected {
					mark = "*"
				}
				if where == "" {
					where = r.DataDir
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", mark, r.Name, where, r.Creds, r.Description)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per context: name, selected, server?, creds?, ca?, data_dir?, description?")
	return cmd
}
