package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
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

// callAsOperator calls a module's tool or a seat's (see operatorToolSubject).
func callAsOperator(ctx context.Context, nc *nats.Conn, target, tool string, body []byte) ([]byte, error) {
	mods, err := admin.List(ctx, nc)
	if err != nil {
		return nil, err
	}
	subject, err := operatorToolSubject(mods, target, tool)
	if err != nil {
		return nil, err
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

// operatorToolSubject is the subject of target's tool: the module's, when a module named
// target declares the tool; else the seat's, when target is a seat a module declares (it
// may share its module's name) or one of the mesh's own, in the first protocol version that
// serves the tool.
func operatorToolSubject(mods []api.ModuleInfo, target, tool string) (string, error) {
	var module *api.ModuleInfo
	var seat manifest.Seat
	isSeat, unread := false, false
	for i := range mods {
		if mods[i].Module == target {
			module = &mods[i]
		}
		if !isSeat && slices.Contains(mods[i].Seats, target) {
			// The declaring module's protocol: a module holding one of the mesh's own
			// seats may serve more than the built-in one.
			m, err := manifest.Parse([]byte(mods[i].Manifest))
			if err == nil {
				seat, isSeat = m.Seat(target)
			}
			unread = !isSeat
		}
	}
	if !isSeat && !unread {
		seat, isSeat = manifest.BuiltinSeat(target)
	}
	if module != nil && slices.Contains(module.Tools, tool) {
		return manifest.ToolSubject(target, tool), nil
	}
	if unread {
		return manifest.SeatToolSubject(target, tool), nil // its manifest no longer reads: v1's, as the holder may serve it
	}
	if isSeat {
		if target == manifest.ControllerSeat && tool == "whoami" {
			return "", errors.New("whoami answers a module about its own key, not the operator: call it with the module's seed (--creds), or see a module's declarations with `meshnode module ls`")
		}
		var served []string
		for _, version := range seat.VersionNames() {
			at, _ := seat.At(version)
			if slices.Contains(at.Serves, tool) {
				return manifest.SeatToolSubjectAt(target, version, tool), nil
			}
			for _, t := range at.Serves {
				if !slices.Contains(served, t) {
					served = append(served, t)
				}
			}
		}
		if module != nil {
			return "", fmt.Errorf("neither module %s nor its seat %s declares a tool %q (the module declares %v, the seat serves %v)", target, target, tool, module.Tools, served)
		}
		return "", fmt.Errorf("seat %s serves no tool %q (it serves %v)", target, tool, served)
	}
	if module != nil {
		return "", fmt.Errorf("module %s declares no tool %q (it declares %v)", target, tool, module.Tools)
	}
	return "", fmt.Errorf("no module or seat named %q is registered; `meshnode module ls` and `meshnode seat ls` list them", target)
}
