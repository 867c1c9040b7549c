package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

// requestTimeout bounds a client verb's request to the node.
const requestTimeout = 30 * time.Second

func newModuleRegisterCmd() *cobra.Command {
	var credsOut string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "register FILE --creds-out SEEDFILE",
		Short: "Register a module (or its new manifest) with the mesh; a new module's seed is written once to --creds-out",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			text, err := os.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("read manifest: %w", err)
			}
			if credsOut != "" {
				if _, err := os.Stat(credsOut); err == nil {
					return fmt.Errorf("%s already exists; a seed is written once: choose another --creds-out, or remove the file if it is stale", credsOut)
				}
			}
			var reg *registry.Registered
			err = withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				reg, err = registry.Register(ctx, nc, text)
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
			if reg.Created {
				if credsOut == "" {
					// The seed exists only in this reply: never lose it.
					credsOut = reg.Module + ".nk"
					if _, err := os.Stat(credsOut); err == nil {
						credsOut = fmt.Sprintf("%s-%d.nk", reg.Module, time.Now().Unix())
					}
				}
				if err := os.WriteFile(credsOut, append(reg.Seed, '\n'), 0o600); err != nil {
					return fmt.Errorf("module %s is registered, but its seed could not be written to %s: %w; remove it (`meshnode module remove %s`) and register again",
						reg.Module, credsOut, err, reg.Module)
				}
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{
					"module": reg.Module, "public_key": reg.PublicKey, "created": reg.Created, "creds": credsOut, "kept": reg.Kept,
				})
			}
			if reg.Created {
				fmt.Fprintf(cmd.OutOrStdout(), "registered %s (key %s); its seed is in %s (0600) — the only copy\n", reg.Module, reg.PublicKey, credsOut)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "re-registered %s (key %s unchanged); its connections reconnect with the new authority\n", reg.Module, reg.PublicKey)
			}
			for _, k := range reg.Kept {
				fmt.Fprintf(cmd.OutOrStdout(), "  %s\n", k)
			}
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().StringVar(&credsOut, "creds-out", "", "where to write a new module's nkey seed (default: <module>.nk)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

func newModuleLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the registered modules",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var mods []registry.ModuleInfo
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				mods, err = registry.List(ctx, nc)
				return err
			})
			if err != nil {
				return err
			}
			if asJSON {
				for i := range mods {
					mods[i].Manifest = ""
				}
				return writeJSONLines(cmd.OutOrStdout(), mods)
			}
			printModules(cmd.OutOrStdout(), mods)
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per module")
	return cmd
}

func printModules(w io.Writer, mods []registry.ModuleInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODULE\tEMITS\tCONSUMES\tTOOLS\tUSES\tSEATS\tREGISTERED")
	for _, m := range mods {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Module, list(m.Emits), list(m.Consumes), list(m.Tools),
			list(m.Uses), list(m.Seats), m.Registered.Format(time.RFC3339))
	}
	tw.Flush()
}

func list(xs []string) string {
	if len(xs) == 0 {
		return "-"
	}
	return strings.Join(xs, ",")
}

func newModuleRemoveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a registered module: its key stops working and its consumer is deleted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var reply registry.RemoveReply
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				reply, err = registry.Remove(ctx, nc, args[0])
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
	addClientFlags(cmd)
	return cmd
}
