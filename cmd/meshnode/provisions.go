package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

func newProvisionsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "provisions",
		Short: "What each deployed module requires of its providers, and whether it is ready",
		Long: `Every deployed module's required interfaces (besides mesh-bus), one row each: the seat
that provides it (mesh for kv), and its state — ready, waiting (no provider answers yet: the
module is not started) or failed (the provider refused; tried again). Credentials are never
shown: the vault keeps them, and the host hands them to the module's process.`,
		Example: "  meshnode provisions\n  meshnode provisions --json\n  meshnode provisions pin shop postgres pg-main",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var rs []api.Provision
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				rs, err = admin.Provisions(ctx, nc)
				return err
			})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), rs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "CONSUMER\tINTERFACE\tPROVIDER\tSTATE\tSINCE\tREASON")
			for _, r := range rs {
				provider, since := r.Provider, "-"
				if provider == "" {
					provider = "-"
				}
				if !r.Since.IsZero() {
					since = r.Since.Local().Format(time.DateTime)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Consumer, r.Interface, provider, r.State, since, r.Reason)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per provision: consumer, interface, provider, state, since, generation, reason, options?")
	addClientFlags(cmd)
	cmd.AddCommand(newProvisionsPinCmd())
	return cmd
}

func newProvisionsPinCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pin MODULE INTERFACE SEAT",
		Short: "Choose the seat that provides a module's required interface (needed when several do)",
		Long: `Records which seat provides MODULE's required INTERFACE. A module whose interface several
seats provide waits until one is chosen; choosing another later removes the resource at the
old provider, creates it at the new one, and restarts the module with its new credential.`,
		Example: "  meshnode provisions pin shop postgres pg-main",
		Args:    namedArgs(cobra.ExactArgs(3), argModule, argOther, argSeat),
		RunE: func(cmd *cobra.Command, args []string) error {
			var reply api.ProvideReply
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				reply, err = admin.Provide(ctx, nc, api.ProvideRequest{Module: args[0], Interface: args[1], Provider: args[2]})
				return err
			})
			if err != nil {
				return err
			}
			switch {
			case reply.Previous == reply.Provider:
				fmt.Fprintf(cmd.OutOrStdout(), "%s's %s is provided by %s already\n", reply.Module, reply.Interface, reply.Provider)
			case reply.Previous != "":
				fmt.Fprintf(cmd.OutOrStdout(), "%s's %s: provided by %s (was %s); `meshnode provisions` shows it move\n", reply.Module, reply.Interface, reply.Provider, reply.Previous)
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "%s's %s: provided by %s; `meshnode provisions` shows it ready\n", reply.Module, reply.Interface, reply.Provider)
			}
			return nil
		},
	}
	addClientFlags(cmd)
	return cmd
}
