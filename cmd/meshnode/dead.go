package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/deadletter"
	"github.com/meshnode/meshnode/envelope"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

func newDeadCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead",
		Short: "Dead letters: events a consumer gave up on, kept with the reason for inspection and replay",
	}
	cmd.AddCommand(newDeadLsCmd(), newDeadShowCmd(), newDeadReplayCmd(), newDeadDropCmd())
	return cmd
}

// withDead runs f with the DEAD stream, as the operator.
func withDead(cmd *cobra.Command, f func(ctx context.Context, js jetstream.JetStream, dead jetstream.Stream) error) error {
	return withBus(cmd, func(ctx context.Context, nc *nats.Conn) error {
		js, _ := jetstream.New(nc)
		dead, err := js.Stream(ctx, manifest.DeadStreamName)
		if err != nil {
			return fmt.Errorf("open %s: %w", manifest.DeadStreamName, err)
		}
		return f(ctx, js, dead)
	})
}

func newDeadLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List dead letters: id, when, consumer, event, reason, deliveries",
		Example: `  meshnode dead ls
  meshnode dead ls --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDead(cmd, func(ctx context.Context, _ jetstream.JetStream, dead jetstream.Stream) error {
				ds, err := deadletter.List(ctx, dead)
				if err != nil {
					return err
				}
				if asJSON {
					rows := make([]map[string]any, len(ds))
					for i, d := range ds {
						rows[i] = deadJSON(d)
					}
					return writeJSONLines(cmd.OutOrStdout(), rows)
				}
				printDead(cmd.OutOrStdout(), ds)
				return nil
			})
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per dead letter: id, time, subject, consumer, reason, deliveries, event_id, headers, body, body_base64?")
	return cmd
}

// deadJSON is a dead letter as `dead ls --json` and `dead show` print it: the body as JSON
// when it is (as text when not, with body_base64 the bytes exactly), headers one value each.
func deadJSON(d api.DeadLetter) map[string]any {
	out := map[string]any{"id": d.ID, "time": d.Time, "subject": d.Subject, "consumer": d.Consumer,
		"reason": d.Reason, "deliveries": d.Deliveries, "event_id": d.EventID, "headers": flatHeaders(d.Headers), "body": bodyJSON(d.Body)}
	if !json.Valid(d.Body) {
		out["body_base64"] = d.Body // the bytes exactly, where "body" is text
	}
	return out
}

func printDead(w io.Writer, ds []api.DeadLetter) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTIME\tCONSUMER\tEVENT\tDELIVERIES\tREASON")
	for _, d := range ds {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\n", d.ID, d.Time.Format(time.RFC3339), d.Consumer, envelope.Key(d.Subject), d.Deliveries, d.Reason)
	}
	tw.Flush()
}

func deadID(arg string) (uint64, error) {
	id, err := strconv.ParseUint(arg, 10, 64)
	if err != nil || id == 0 {
		return 0, usagef("%q is not a dead letter id: `meshnode dead ls` lists them", arg)
	}
	return id, nil
}

// withDeadLetter runs f with the dead letter whose id is arg.
func withDeadLetter(cmd *cobra.Command, arg string, f func(ctx context.Context, js jetstream.JetStream, dead jetstream.Stream, m *jetstream.RawStreamMsg) error) error {
	id, err := deadID(arg)
	if err != nil {
		return err
	}
	return withDead(cmd, func(ctx context.Context, js jetstream.JetStream, dead jetstream.Stream) error {
		m, err := dead.GetMsg(ctx, id)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("no dead letter %d (replayed or dropped?): `meshnode dead ls` lists them", id)
		}
		if err != nil {
			return err
		}
		return f(ctx, js, dead, m)
	})
}

func newDeadShowCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "show ID",
		Short:   "Print one dead letter whole: headers, reason, body",
		Example: `  meshnode dead show 42`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDeadLetter(cmd, args[0], func(_ context.Context, _ jetstream.JetStream, _ jetstream.Stream, m *jetstream.RawStreamMsg) error {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(deadJSON(deadletter.FromMsg(m)))
			})
		},
	}
	addClientFlags(cmd)
	return cmd
}

func newDeadReplayCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "replay ID|--all",
		Short: "Deliver a dead letter's event again to the consumer that gave up on it, and remove it from DEAD",
		Example: `  meshnode dead replay 42
  meshnode dead replay --all`,
		Long: `Deliver a dead letter's event again, with its original headers, x-event-id and signature, to
the one consumer that gave up on it, and remove it from DEAD once the stream has stored it. No
other consumer of the event sees it twice: the event is published on
mesh.replay.<consumer>.<original subject>, which only that consumer's filter matches (the sdk
hands it to the handler of the original subject). A seat's job goes back to the seat's queue.
If it fails again, it is dead-lettered again, as a new letter.

Replay publishes with the operator's authority, so it first checks that the letter is what its
source could have published itself: an event of the source's own (a module's declared event,
a seat's event by the module that declares the seat, a node's own event) or a job the source
may submit, signed by the source's registered key. Anything else is refused and kept.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) == 1) {
				return usagef("name one dead letter ID, or --all")
			}
			var auth deadletter.Authority
			replayOne := func(ctx context.Context, js jetstream.JetStream, dead jetstream.Stream, m *jetstream.RawStreamMsg) (err error) {
				if auth == nil {
					if auth, err = deadletter.LoadAuthority(ctx, js, admin.List); err != nil {
						return err
					}
				}
				if err := deadletter.Replay(ctx, js, dead, m, auth); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "replayed %d: %s %s\n", m.Sequence, envelope.Key(m.Header.Get(envelope.DeadSubject)), m.Header.Get(envelope.EventID))
				return nil
			}
			if !all {
				return withDeadLetter(cmd, args[0], replayOne)
			}
			return withDead(cmd, func(ctx context.Context, js jetstream.JetStream, dead jetstream.Stream) error {
				ds, err := deadletter.List(ctx, dead)
				if err != nil {
					return err
				}
				refused := 0
				for _, d := range ds {
					m := &jetstream.RawStreamMsg{Sequence: d.ID, Header: nats.Header(d.Headers), Data: d.Body}
					err := replayOne(ctx, js, dead, m)
					if errors.Is(err, deadletter.ErrNotReplayable) {
						fmt.Fprintf(cmd.ErrOrStderr(), "meshnode: %v\n", err)
						refused++
						continue
					}
					if err != nil {
						return err
					}
				}
				if refused > 0 {
					return fmt.Errorf("%d of %d dead letters refused, see above; they are kept", refused, len(ds))
				}
				return nil
			})
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "replay every dead letter")
	return cmd
}

func newDeadDropCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "drop ID",
		Short:   "Delete a dead letter for good",
		Example: `  meshnode dead drop 42`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDeadLetter(cmd, args[0], func(ctx context.Context, _ jetstream.JetStream, dead jetstream.Stream, m *jetstream.RawStreamMsg) error {
				if err := dead.DeleteMsg(ctx, m.Sequence); err != nil {
					return fmt.Errorf("drop %d: %w", m.Sequence, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "dropped %d\n", m.Sequence)
				return nil
			})
		},
	}
	addClientFlags(cmd)
	return cmd
}
