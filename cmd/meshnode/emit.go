package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/meshnode/meshnode/sdk"
	"github.com/spf13/cobra"
)

func newEmitCmd() *cobra.Command {
	var causation, schema string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "emit EVENT JSON --creds SEEDFILE",
		Short: "Emit one event as the module whose seed is --creds (EVENT is local: order.placed)",
		Example: `  meshnode emit order.placed '{"id":7}' --creds shop.nk
  meshnode emit order.placed '{"id":7}' --creds shop.nk --json`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("creds") {
				return usagef("emit speaks for a module: pass --creds with the seed written by `meshnode module register`")
			}
			if !json.Valid([]byte(args[1])) {
				return usagef("the payload %q is not JSON; quote it for the shell, e.g. '{\"id\":1}'", args[1])
			}
			var opts []sdk.EmitOption
			if causation != "" {
				opts = append(opts, sdk.CausedBy(causation))
			}
			if schema != "" {
				opts = append(opts, sdk.WithSchema(schema))
			}
			return withModule(cmd, func(ctx context.Context, c *sdk.Client) error {
				id, err := c.Emit(ctx, args[0], json.RawMessage(args[1]), opts...)
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]string{"event_id": id, "event": args[0]})
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
				return nil
			})
		},
	}
	addClientFlags(cmd)
	cmd.Flags().StringVar(&causation, "causation", "", "x-causation-id: the event that caused this one")
	cmd.Flags().StringVar(&schema, "schema", "", "x-schema: the payload's schema")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: event_id, event")
	return cmd
}
