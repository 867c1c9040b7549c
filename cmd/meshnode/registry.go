package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

// requestTimeout bounds a client verb's request to the node.
const requestTimeout = 30 * time.Second

func newModuleRegisterCmd() *cobra.Command {
	var credsOut string
	var asJSON, rotateKey bool
	cmd := &cobra.Command{
		Use:   "register FILE --creds-out SEEDFILE [--rotate-key]",
		Short: "Register a module (or its new manifest) with the mesh; a new module's seed is written once to --creds-out",
		Long: `Register a module (or its new manifest) with the mesh. A new module's key is minted by the
vault and its seed written once, to --creds-out (default <module>.nk): the only copy. The
file is created before the mesh is asked, so a path that cannot be written refuses the
registration instead of losing the seed.

A module whose seed was lost gets a new key with --rotate-key: the vault mints it, the
registry records it in place of the old one (whose connections are disconnected, and which
no longer works), and the new seed is written to --creds-out.`,
		Example: `  meshnode module register shop.yaml --creds-out /etc/shop/shop.nk
  meshnode module register shop.yaml --rotate-key --creds-out /etc/shop/shop-new.nk`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			text, err := readManifest(args[0])
			var rs manifest.Refusals
			switch {
			case errors.As(err, &rs):
				return fmt.Errorf("%s: %w; nothing was registered", args[0], err)
			case err != nil:
				return fmt.Errorf("read manifest: %w", err)
			}
			// The seed file is made before anything is minted: a seed the CLI cannot write is
			// lost for good.
			seedFile, err := reserveSeedFile(credsOut, text)
			if err != nil {
				return err
			}
			written := false
			if seedFile != nil {
				defer func() {
					seedFile.Close()
					if !written {
						os.Remove(seedFile.Name())
					}
				}()
				credsOut = seedFile.Name()
			}
			var reg *admin.Registered
			err = withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				if rotateKey {
					reg, err = admin.RotateKey(ctx, nc, text)
				} else {
					reg, err = admin.Register(ctx, nc, text)
				}
				return err
			})
			if err != nil {
				var rs manifest.Refusals
				if errors.As(err, &rs) {
					for _, r := range rs {
						fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", args[0], r.Error())
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "meshnode: %s refused, see above (%d); nothing was registered\n", args[0], len(rs))
					return errReported
				}
				return err
			}
			if reg.Created || reg.Rotated {
				if seedFile == nil {
					return fmt.Errorf("module %s is registered, but no file was made for its seed; rotate its key: `meshnode module register %s --rotate-key --creds-out FILE`", reg.Module, args[0])
				}
				if err := writeSeed(seedFile, reg.Seed); err != nil {
					return fmt.Errorf("module %s is registered, but its seed could not be written to %s: %w; rotate its key: `meshnode module register %s --rotate-key --creds-out FILE`",
						reg.Module, credsOut, err, args[0])
				}
				written = true
			} else {
				credsOut = ""
			}
			if asJSON {
				kept := append([]string{}, reg.Kept...) // [] when none, not null
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{
					"module": reg.Module, "public_key": reg.PublicKey, "created": reg.Created, "rotated": reg.Rotated, "creds": credsOut, "kept": kept,
				})
			}
			switch {
			case reg.Created:
				fmt.Fprintf(cmd.OutOrStdout(), "registered %s (key %s); its seed is in %s (0600) — the only copy\n", reg.Module, reg.PublicKey, credsOut)
			case reg.Rotated:
				fmt.Fprintf(cmd.OutOrStdout(), "rotated the key of %s (new key %s); its seed is in %s (0600) — the only copy; the old seed no longer works and its connections were disconnected\n", reg.Module, reg.PublicKey, credsOut)
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "re-registered %s (key %s unchanged); its connections reconnect with the new authority\n", reg.Module, reg.PublicKey)
			}
			for _, k := range reg.Kept {
				fmt.Fprintf(cmd.OutOrStdout(), "  %s\n", k)
			}
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().StringVar(&credsOut, "creds-out", "", "where to write a new module's nkey seed (default: <module>.nk); its directory must exist and the file must not")
	cmd.Flags().BoolVar(&rotateKey, "rotate-key", false, "give a registered module a new key (a lost seed): the old key stops working")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: module, public_key, created, rotated, creds, kept")
	return cmd
}

// reserveSeedFile creates the file a seed will be written to (0600, empty, never an existing
// one), so a path that cannot take it is refused before anything is minted. Without a path it
// is <module>.nk in the working directory (<module>-<unix time>.nk if that exists); nil when
// the manifest does not parse, which the controller then refuses, minting nothing.
func reserveSeedFile(path string, text []byte) (*os.File, error) {
	if path == "" {
		m, err := manifest.Parse(text)
		if err != nil || !manifest.ValidName(m.Module) {
			return nil, nil
		}
		path = m.Module + ".nk"
		if _, err := os.Lstat(path); err == nil {
			path = fmt.Sprintf("%s-%d.nk", m.Module, time.Now().Unix())
		}
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("--creds-out %s: directory %s does not exist; create it first, or choose another --creds-out (nothing was registered)", path, dir)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	switch {
	case errors.Is(err, fs.ErrExist):
		return nil, fmt.Errorf("--creds-out %s already exists; a seed is written once: choose another --creds-out, or remove the file if it is stale (nothing was registered)", path)
	case err != nil:
		return nil, fmt.Errorf("--creds-out %s cannot be written: %w; choose another --creds-out (nothing was registered)", path, err)
	}
	return f, nil
}

// writeSeed writes seed to f, the file reserveSeedFile made, and syncs it.
func writeSeed(f *os.File, seed []byte) error {
	if _, err := f.Write(append(seed, '\n')); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

func newModuleLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the registered modules",
		Example: `  meshnode module ls
  meshnode module ls --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var mods []api.ModuleInfo
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				mods, err = admin.List(ctx, nc)
				return err
			})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), mods)
			}
			printModules(cmd.OutOrStdout(), mods)
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per module: module, public_key, emits, consumes, tools, uses, seats, registered, updated, revision, manifest, fingerprints?, pins?, deployment?, quota?")
	return cmd
}

func printModules(w io.Writer, mods []api.ModuleInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODULE\tEMITS\tCONSUMES\tTOOLS\tUSES\tSEATS\tEVENTS HELD/QUOTA\tREGISTERED")
	for _, m := range mods {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Module, list(m.Emits), list(m.Consumes), list(m.Tools),
			list(m.Uses), list(m.Seats), quotaCell(m.Quota), m.Registered.UTC().Format(time.RFC3339))
	}
	tw.Flush()
}

// quotaCell is a module's use of EVENTS against its quota: "1.2MiB/32MiB (4%)", with the
// refusals the answering node made, if any.
func quotaCell(q *api.QuotaUse) string {
	if q == nil {
		return "-"
	}
	used := q.Held + q.Pending
	cell := config.Bytes(used).String()
	if q.Limit > 0 {
		cell += "/" + config.Bytes(q.Limit).String() + fmt.Sprintf(" (%d%%)", used*100/q.Limit)
	}
	if refused := q.Refusals(); refused > 0 {
		cell += fmt.Sprintf(", %d refused", refused)
	}
	return cell
}

func list(xs []string) string {
	if len(xs) == 0 {
		return "-"
	}
	return strings.Join(xs, ",")
}

func newModuleRemoveCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "remove NAME [--force]",
		Short: "Remove a registered module: its key stops working and its consumer is deleted",
		Example: `  meshnode module remove shop
  meshnode module remove mailer --force`,
		Long: `Remove a registered module: its key stops working and its consumer is deleted. A module that
declares a seat other modules use is refused (their work would have no holder, and the next
declaration of the seat could break the protocol they are bound to) unless --force; the
removal's event then names them.`,
		Args: namedArgs(cobra.ExactArgs(1), argModule),
		RunE: func(cmd *cobra.Command, args []string) error {
			var reply api.RemoveReply
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				reply, err = admin.Remove(ctx, nc, api.RemoveRequest{Module: args[0], Force: force})
				return err
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", reply.Module)
			for _, k := range reply.Kept {
				fmt.Fprintf(cmd.OutOrStdout(), "  %s\n", k)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "remove even a module declaring a seat other modules are bound to (audited)")
	addClientFlags(cmd)
	return cmd
}
