package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/registry"
	"github.com/meshnode/meshnode/sdk"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

func newCallCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "call TARGET TOOL [JSON]",
		Short: "Call a tool of a module or seat and print the reply",
		Example: `  meshnode call shop catalogue '{"page":1}'
  meshnode call mailer status --creds shop.nk`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			target, tool := args[0], args[1]
			var body []byte
			if len(args) == 3 {
				if !json.Valid([]byte(args[2])) {
					return usagef("the payload %q is not JSON; quote it for the shell, e.g. '{\"id\":1}'", args[2])
				}
				body = []byte(args[2])
			}
			var reply []byte
			var err error
			if cmd.Flags().Changed("creds") {
				err = withModule(cmd, func(ctx context.Context, c *sdk.Client) (err error) {
					reply, err = c.Call(ctx, target, tool, body)
					return err
				})
			} else {
				err = withBus(cmd, func(ctx context.Context, nc *nats.Conn) (err error) {
					reply, err = callAsOperator(ctx, nc, target, tool, body)
					return err
				})
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n", reply)
			return nil
		},
	}
	addClientFlags(cmd)
	return cmd
}

// callAsOperator calls a module's tool if a module of that name is registered, else the
// seat's.
func callAsOperator(ctx context.Context, nc *nats.Conn, target, tool string, body []byte) ([]byte, error) {
	mods, err := admin.List(ctx, nc)
	if err != nil {
		return nil, err
	}
	subject := manifest.SeatToolSubject(target, tool)
	if i := slices.IndexFunc(mods, func(m registry.ModuleInfo) bool { return m.Module == target }); i >= 0 {
		if !slices.Contains(mods[i].Tools, tool) {
			return nil, fmt.Errorf("module %s declares no tool %q (it declares %v)", target, tool, mods[i].Tools)
		}
		subject = manifest.ToolSubject(target, tool)
	} else if !strings.HasPrefix(target, "mesh-") && !slices.ContainsFunc(mods, func(m registry.ModuleInfo) bool { return slices.Contains(m.Seats, target) }) {
		return nil, fmt.Errorf("no module or seat named %q is registered; `meshnode module ls` and `meshnode seat ls` list them", target)
	}
	msg, err := nc.RequestWithContext(ctx, subject, body)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("nobody serves %s: is %s running (or the seat held)?", subject, target)
	}
	if err != nil {
		return nil, fmt.Errorf("call %s: %w", subject, err)
	}
	if e := msg.Header.Get("Nats-Service-Error"); e != "" {
		return nil, fmt.Errorf("%s.%s failed: %s (code %s)", target, tool, e, msg.Header.Get("Nats-Service-Error-Code"))
	}
	return msg.Data, nil
}
