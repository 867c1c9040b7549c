package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

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

// deadLetter is one message of DEAD; ID is its sequence there.
type deadLetter struct {
	ID         uint64              `json:"id"`
	Time       time.Time           `json:"time"`
	Subject    string              `json:"subject"` // the original subject
	Consumer   string              `json:"consumer"`
	Reason     string              `json:"reason"`
	Deliveries int                 `json:"deliveries"`
	EventID    string              `json:"event_id"`
	Headers    map[string][]string `json:"headers"`
	Body       []byte              `json:"body"`
}

func toDeadLetter(m *jetstream.RawStreamMsg) deadLetter {
	d, _ := strconv.Atoi(m.Header.Get(envelope.DeadDeliveries))
	return deadLetter{ID: m.Sequence, Time: m.Time, Subject: m.Header.Get(envelope.DeadSubject),
		Consumer: m.Header.Get(envelope.DeadConsumer), Reason: m.Header.Get(envelope.DeadReason), Deliveries: d,
		EventID: m.Header.Get(envelope.EventID), Headers: map[string][]string(m.Header), Body: m.Data}
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

// deadLetters reads every dead letter, oldest first.
func deadLetters(ctx context.Context, dead jetstream.Stream) ([]deadLetter, error) {
	info, err := dead.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []deadLetter
	if info.State.Msgs == 0 {
		return out, nil
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := dead.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // dropped or replayed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, toDeadLetter(m))
	}
	return out, nil
}

func newDeadLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List dead letters: id, when, consumer, event, reason, deliveries",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDead(cmd, func(ctx context.Context, _ jetstream.JetStream, dead jetstream.Stream) error {
				ds, err := deadLetters(ctx, dead)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSONLines(cmd.OutOrStdout(), ds)
				}
				printDead(cmd.OutOrStdout(), ds)
				return nil
			})
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per dead letter")
	return cmd
}

func printDead(w io.Writer, ds []deadLetter) {
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
		Use:   "show ID",
		Short: "Print one dead letter whole: headers, reason, body",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDeadLetter(cmd, args[0], func(_ context.Context, _ jetstream.JetStream, _ jetstream.Stream, m *jetstream.RawStreamMsg) error {
				d := toDeadLetter(m)
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"id": d.ID, "time": d.Time, "subject": d.Subject, "consumer": d.Consumer,
					"reason": d.Reason, "deliveries": d.Deliveries, "event_id": d.EventID, "headers": flatHeaders(d.Headers), "body": bodyJSON(d.Body)})
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
		Short: "Publish a dead letter's event again, with its original x-event-id, and remove it from DEAD",
		Long: `Publish a dead letter's event again on its original subject, with its original headers and
x-event-id (so consumers that handle by id skip what they already did), and remove it from
DEAD once the stream has stored it. Every consumer of that subject sees it again.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) == 1) {
				return usagef("name one dead letter ID, or --all")
			}
			replayOne := func(ctx context.Context, js jetstream.JetStream, dead jetstream.Stream, m *jetstream.RawStreamMsg) error {
				if err := replay(ctx, js, dead, m); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "replayed %d: %s %s\n", m.Sequence, envelope.Key(m.Header.Get(envelope.DeadSubject)), m.Header.Get(envelope.EventID))
				return nil
			}
			if !all {
				return withDeadLetter(cmd, args[0], replayOne)
			}
			return withDead(cmd, func(ctx context.Context, js jetstream.JetStream, dead jetstream.Stream) error {
				ds, err := deadLetters(ctx, dead)
				if err != nil {
					return err
				}
				for _, d := range ds {
					m := &jetstream.RawStreamMsg{Sequence: d.ID, Header: nats.Header(d.Headers), Data: d.Body}
					if err := replayOne(ctx, js, dead, m); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "replay every dead letter")
	return cmd
}

// replay republishes a dead letter's original event and then deletes the dead letter.
func replay(ctx context.Context, js jetstream.JetStream, dead jetstream.Stream, m *jetstream.RawStreamMsg) error {
	subject := m.Header.Get(envelope.DeadSubject)
	if subject == "" {
		return fmt.Errorf("dead letter %d names no original subject (no %s header)", m.Sequence, envelope.DeadSubject)
	}
	h := nats.Header{}
	for k, v := range m.Header {
		if !strings.HasPrefix(strings.ToLower(k), "x-dead-") {
			h[k] = v
		}
	}
	// The broker's dedup window would drop a copy under the original Nats-Msg-Id; the event
	// keeps its x-event-id, which is what consumers and the audit log deduplicate on.
	h.Set(nats.MsgIdHdr, fmt.Sprintf("replay.%d.%s", m.Sequence, h.Get(envelope.EventID)))
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: m.Data}); err != nil {
		return fmt.Errorf("replay %d to %s: %w; the dead letter is kept", m.Sequence, subject, err)
	}
	if err := dead.DeleteMsg(ctx, m.Sequence); err != nil {
		return fmt.Errorf("replayed %d, but could not remove it from DEAD: %w", m.Sequence, err)
	}
	return nil
}

func newDeadDropCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "drop ID",
		Short: "Delete a dead letter for good",
		Args:  cobra.ExactArgs(1),
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
