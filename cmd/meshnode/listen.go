package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

func newListenCmd() *cobra.Command {
	var asJSON bool
	var count int
	cmd := &cobra.Command{
		Use:   "listen PATTERN",
		Short: "Print events as they happen; PATTERN is written as consumes: is (billing.**, *.order.placed, **)",
		Example: `  meshnode listen 'shop.**'
  meshnode listen '**' --json --count 10`,
		Long: `Print events live, as the operator: a core subscription, so it sees what is published
while it runs and consumes nothing (modules' durable consumers are untouched).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			subject, err := manifest.EventPattern(args[0])
			if err != nil {
				return usageError{err: fmt.Errorf("pattern %q: %w", args[0], err)}
			}
			nc, err := dial(cmd)
			if err != nil {
				return err
			}
			defer nc.Close()
			if mods, err := admin.List(cmd.Context(), nc); err == nil {
				if warning := unheardEmitter(mods, args[0]); warning != "" {
					fmt.Fprintln(cmd.ErrOrStderr(), "meshnode: "+warning)
				}
			}
			msgs := make(chan *nats.Msg, 256)
			sub, err := nc.ChanSubscribe(subject, msgs)
			if err != nil {
				return err
			}
			defer sub.Unsubscribe()
			if err := nc.Flush(); err != nil {
				return err
			}
			if err := nc.LastError(); err != nil {
				return fmt.Errorf("listen on %s: %w", subject, err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			enc := json.NewEncoder(cmd.OutOrStdout())
			for seen := 0; count == 0 || seen < count; seen++ {
				select {
				case <-ctx.Done():
					return nil
				case m := <-msgs:
					if asJSON {
						enc.Encode(eventJSON(m.Subject, m.Header, m.Data))
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s  %s  id=%s source=%s  %s\n", m.Header.Get(envelope.Time),
						envelope.Key(m.Subject), m.Header.Get(envelope.EventID), m.Header.Get(envelope.Source), m.Data)
				}
			}
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per event: subject, key, headers, body, body_base64?")
	cmd.Flags().IntVar(&count, "count", 0, "exit after this many events (0: until interrupted)")
	return cmd
}

// unheardEmitter warns when pattern names an emitter no registered module is: a module, or
// a seat (seat.<seat>.…) no module declares. The listen goes on (the emitter may be
// registered while it runs), but a misspelt one is said, not left silent.
func unheardEmitter(mods []api.ModuleInfo, pattern string) string {
	toks := strings.Split(pattern, ".")
	if toks[0] == "*" || toks[0] == "**" {
		return ""
	}
	if toks[0] == "seat" && len(toks) > 1 {
		if toks[1] == "*" || toks[1] == "**" || slices.ContainsFunc(mods, func(m api.ModuleInfo) bool { return slices.Contains(m.Seats, toks[1]) }) {
			return ""
		}
		if _, ok := manifest.BuiltinSeat(toks[1]); ok {
			return ""
		}
		return fmt.Sprintf("no registered module declares a seat %q: nothing is heard until one does; `meshnode seat ls` lists the seats", toks[1])
	}
	if slices.ContainsFunc(mods, func(m api.ModuleInfo) bool { return m.Module == toks[0] }) {
		return ""
	}
	return fmt.Sprintf("no module %q is registered: nothing is heard until it is; `meshnode module ls` lists the modules (a pattern starts with the emitting module's name, e.g. shop.**)", toks[0])
}

// eventJSON is an event as `--json` prints it: subject, key, headers and body (as JSON when
// it is JSON, else as a string).
func eventJSON(subject string, h nats.Header, data []byte) map[string]any {
	headers := map[string]string{}
	for k := range h {
		headers[k] = h.Get(k)
	}
	var body any = string(data)
	if json.Valid(data) {
		body = json.RawMessage(data)
	}
	return map[string]any{"subject": subject, "key": envelope.Key(subject), "headers": headers, "body": body}
}
