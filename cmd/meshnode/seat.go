package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/seats"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

func newSeatCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "seat",
		Short: "Inspect seats: roles with one holder per scope",
	}
	cmd.AddCommand(newSeatLsCmd())
	return cmd
}

func newSeatLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List every seat: scope, holder, epoch, since, backlog, users",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var msg *nats.Msg
			err := withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
				msg, err = nc.RequestWithContext(ctx, seats.ListSubject, []byte("{}"))
				return err
			})
			if err != nil {
				return fmt.Errorf("ask the controller for seats: %w", err)
			}
			var reply seats.ListReply
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
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per seat")
	return cmd
}

func printSeats(w io.Writer, ss []seats.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEAT\tSCOPE\tHOLDER\tNODE\tEPOCH\tSINCE\tBACKLOG\tUSERS")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", s.Seat, scope, holder, node, epoch, since, s.Backlog, users)
	}
	tw.Flush()
}
