package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

func newSeatCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "seat",
		Short: "Inspect seats: roles with one holder per scope",
	}
	cmd.AddCommand(newSeatLsCmd(), newSeatPinCmd())
	return cmd
}

func newSeatPinCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "pin MODULE SEAT VERSION",
		Short: "Move a module to a version of a seat's protocol (v1 … v9)",
		Long: `Move a module to a version of a seat's protocol. A breaking change to a seat is made as a new
version (versions: {v2: {...}} in the declaring module's manifest) served beside the old one by the
same holder; each module that uses the seat, or consumes its events by name, is bound to one
version and moves by re-pinning. The module's connections are dropped and come back speaking
the new version. ` + "`meshnode seat ls`" + ` shows the modules bound to each version and marks
a version nobody is bound to as retirable; nothing is removed automatically.`,
		Example: `  meshnode seat pin shop mailer v2
  meshnode seat pin shop mailer v1     # back to the first version`,
		Args: namedArgs(cobra.ExactArgs(3), argModule, argSeat),
		RunE: func(cmd *cobra.Command, args []string) error {
			var reply api.PinReply
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				reply, err = admin.Pin(ctx, nc, api.PinRequest{Module: args[0], Seat: args[1], Version: args[2]})
				return err
			})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), []api.PinReply{reply})
			}
			if reply.Previous == reply.Version {
				fmt.Fprintf(cmd.OutOrStdout(), "%s already speaks %s of seat %s\n", reply.Module, reply.Version, reply.Seat)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pinned %s to %s of seat %s (was %s)\n", reply.Module, reply.Version, reply.Seat, reply.Previous)
			if reply.Retirable {
				fmt.Fprintf(cmd.OutOrStdout(), "  no module is bound to %s of %s any more: it is retirable\n", reply.Previous, reply.Seat)
			}
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the answer as one JSON object: module, seat, version, previous")
	return cmd
}

func newSeatLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List every seat: scope, holder, epoch, since, backlog, users",
		Example: `  meshnode seat ls
  meshnode seat ls --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var msg *nats.Msg
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				msg, err = nc.RequestWithContext(ctx, api.SeatListSubject, []byte("{}"))
				return err
			})
			if err != nil {
				return fmt.Errorf("ask the controller for seats: %w", err)
			}
			var reply api.SeatListReply
			if err := json.Unmarshal(msg.Data, &reply); err != nil {
				return fmt.Errorf("seats answered %q: %w", msg.Data, err)
			}
			if reply.Error != "" {
				return fmt.Errorf("seats: %s", reply.Error)
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), reply.Seats)
			}
			printSeats(cmd.OutOrStdout(), reply.Seats)
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per seat: seat, scope, backlog, module?, node?, holder?, holder_node?, epoch?, since?, users?, versions?")
	return cmd
}

func printSeats(w io.Writer, ss []api.SeatStatus) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEAT\tSCOPE\tHOLDER\tNODE\tEPOCH\tSINCE\tBACKLOG\tUSERS\tVERSIONS")
	for _, s := range ss {
		holder, node, epoch, since := "-", "-", "-", "-"
		if s.Holder != "" {
			holder, node, epoch = s.Holder, s.HolderAt, fmt.Sprint(s.Epoch)
			if s.Since != nil {
				since = time.Since(*s.Since).Truncate(time.Second).String() + " ago"
			}
		}
		scope := string(s.Scope)
		if s.Node != "" {
			scope += " (" + s.Node + ")"
		}
		users := "-"
		if len(s.Users) > 0 {
			users = strings.Join(s.Users, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.Seat, scope, holder, node, epoch, since, s.Backlog, users, versions(s.Versions))
	}
	tw.Flush()
}

// versions prints each protocol version with its bound modules, or "retirable":
// "v1 retirable; v2 shop,billing".
func versions(vs []api.SeatVersionStatus) string {
	if len(vs) == 0 {
		return "-"
	}
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = v.Version + " " + strings.Join(v.Bound, ",")
		if v.Retirable {
			parts[i] = v.Version + " retirable"
		}
	}
	return strings.Join(parts, "; ")
}
