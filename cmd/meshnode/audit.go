package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/audit"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/envelope"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

func newAuditCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Read and verify the node's audit log of every event"}
	cmd.AddCommand(newAuditQueryCmd(), newAuditTailCmd(), newAuditVerifyCmd())
	return cmd
}

// auditFilterFlags adds the filters query and tail share.
func auditFilterFlags(cmd *cobra.Command, f *api.AuditFilter, asJSON *bool) {
	cmd.Flags().StringVar(&f.Source, "source", "", "only events whose x-source is this")
	cmd.Flags().StringVar(&f.Event, "event", "", "only events matching this pattern, named as the EVENT column prints them (billing.**, seat.mailer.*, node.alpha.**)")
	cmd.Flags().BoolVar(asJSON, "json", false, "one JSON object per record (not_genuine is the kind verify flags it with): n, seq, subject, key, event_id, source, received, headers, body, signed, source_matches, prev, hash, signature_error?, not_genuine?, not_genuine_why?")
}

// auditCall asks the audit log of the node the CLI is connected to.
func auditCall(cmd *cobra.Command, req api.AuditRequest) (reply api.AuditReply, err error) {
	err = withBus(cmd, func(ctx context.Context, nc *nats.Conn) error {
		reply, err = audit.Call(ctx, nc, nc.ConnectedServerName(), req)
		return err
	})
	return reply, err
}

func newAuditQueryCmd() *cobra.Command {
	var f api.AuditFilter
	var since, until string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "query [--since T] [--until T] [--source S] [--event PATTERN] [--id ID] [--json]",
		Short: "Print the audited events that match, oldest first",
		Example: `  meshnode audit query --source shop --since 1h
  meshnode audit query --event 'shop.order.*' --json
  meshnode audit query --id 0193f7c2-…`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if f.Since, err = parseWhen(since); err != nil {
				return usagef("--since: %v", err)
			}
			if f.Until, err = parseWhen(until); err != nil {
				return usagef("--until: %v", err)
			}
			w := newRecordWriter(cmd.OutOrStdout(), asJSON)
			for found := 0; ; {
				f.Limit = api.AuditDefaultLimit
				reply, err := auditCall(cmd, api.AuditRequest{Op: "query", Filter: f})
				if err != nil {
					return err
				}
				for _, r := range reply.Records {
					w.write(r)
				}
				found += len(reply.Records)
				if len(reply.Records) < f.Limit || f.ID != "" {
					if found == 0 && !asJSON {
						fmt.Fprintln(cmd.ErrOrStderr(), noMatch(f))
					}
					return w.flush()
				}
				f.After = reply.Records[len(reply.Records)-1].N
			}
		},
	}
	addClientFlags(cmd)
	auditFilterFlags(cmd, &f, &asJSON)
	cmd.Flags().StringVar(&f.ID, "id", "", "only the event with this x-event-id")
	cmd.Flags().StringVar(&since, "since", "", "received at or after: RFC 3339 time, or a duration ago (1h, 7d)")
	cmd.Flags().StringVar(&until, "until", "", "received before: RFC 3339 time, or a duration ago")
	return cmd
}

// parseWhen reads a time as RFC 3339 or as a duration before now.
func parseWhen(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := config.ParseDuration(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration like 1h or 7d", s)
	}
	return time.Now().Add(-d), nil
}

func newAuditTailCmd() *cobra.Command {
	var f api.AuditFilter
	var follow, asJSON bool
	var n int
	cmd := &cobra.Command{
		Use:   "tail [-f] [-n 20] [--source S] [--event PATTERN] [--json]",
		Short: "Print the last audited events; -f keeps printing new ones",
		Example: `  meshnode audit tail -n 50
  meshnode audit tail -f --source shop`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := newRecordWriter(cmd.OutOrStdout(), asJSON)
			// printNew prints what the filter finds and moves it past what was printed.
			printNew := func() error {
				reply, err := auditCall(cmd, api.AuditRequest{Op: "query", Filter: f})
				if err != nil {
					return err
				}
				for _, r := range reply.Records {
					w.write(r)
					f.After = r.N
				}
				w.flush()
				return nil
			}
			f.Last = n
			if err := printNew(); err != nil || !follow {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			f.Last = 0
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
				if err := printNew(); err != nil {
					return err
				}
			}
		},
	}
	addClientFlags(cmd)
	auditFilterFlags(cmd, &f, &asJSON)
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events")
	cmd.Flags().IntVarP(&n, "lines", "n", 20, "how many of the last events to print first")
	return cmd
}

func newAuditVerifyCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "verify [--json]",
		Short: "Walk the hash chain (exit 1 if the log was altered or truncated) and list every event that is not genuine",
		Long: `Walk the audit log's hash chain and check every event in it.

Two different questions, answered apart:
  - Is the log intact? Every record's hash is its content's and links to the one before, and
    the newest records are all there. If not, verify names the first broken record and exits 1:
    someone altered or truncated the log.
  - Is each event genuine? An event is recorded as it arrived; one that is unsigned, signed by
    a key that is not its source's, from an unknown source, whose x-source does not own its
    subject, or whose x-event-id is reused or not a UUIDv7 is flagged. Every flagged event is
    listed (the first 1,000, with the total), and verify exits 0: a log holding a forged event
    is an intact record of a forgery, not a corrupt log.`,
		Example: `  meshnode audit verify
  meshnode audit verify --json | jq '.flagged[] | select(.kind == "bad-signature")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Progress on a terminal, about once a second; piped, nothing but the answer.
			stderr := cmd.ErrOrStderr()
			shown := false
			var reply api.AuditReply
			err := withBusFor(cmd, 0, func(ctx context.Context, nc *nats.Conn) (err error) {
				reply, err = audit.CallProgress(ctx, nc, nc.ConnectedServerName(), api.AuditRequest{Op: "verify"}, requestTimeout, func(p api.AuditProgress) {
					if isTerminal(stderr) {
						fmt.Fprintf(stderr, "\rverifying: %d of %d records (%d%%)", p.Done, p.Total, 100*p.Done/max(p.Total, 1))
						shown = true
					}
				})
				return err
			})
			if shown {
				fmt.Fprint(stderr, "\r\033[K") // the progress line goes
			}
			if err != nil {
				return err
			}
			v := reply.Verification
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				if err := enc.Encode(v); err != nil {
					return err
				}
			} else {
				if v.FlaggedTotal > 0 {
					tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "RECORD\tKIND\tSOURCE\tEVENT\tID\tWHY")
					for _, f := range v.Flagged {
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", f.N, f.Kind, f.Source, envelope.Key(f.Subject), f.EventID, f.Reason)
					}
					tw.Flush()
					if more := v.FlaggedTotal - uint64(len(v.Flagged)); more > 0 {
						fmt.Fprintf(out, "… and %d more; `meshnode audit query --json` shows every record's checks\n", more)
					}
				}
				switch {
				case v.Broken != nil:
				case v.FlaggedTotal > 0:
					fmt.Fprintf(out, "audit log intact: %d records, every link and hash holds; %d not genuine (listed above)\n",
						v.Records, v.FlaggedTotal)
				default:
					fmt.Fprintf(out, "audit log intact: %d records, every link and hash holds, every event signed by its source\n", v.Records)
				}
				if r := v.Restored; r != nil {
					fmt.Fprintf(out, "restored here: record 1 names snapshot %s (%s, saved %s) of mesh %s\n", r.Snapshot, r.File, r.Created.UTC().Format(time.RFC3339), r.MeshID)
					for _, name := range slices.Sorted(maps.Keys(r.Heads)) {
						fmt.Fprintf(out, "  node %s's log then ended at record %d (hash %s)\n", name, r.Heads[name].N, r.Heads[name].Hash)
					}
				}
			}
			if v.Broken != nil {
				return fmt.Errorf("audit log broken at record %d: %s (of %d records)", v.Broken.N, v.Broken.Reason, v.Records)
			}
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the verification as one JSON object: records, broken?, flagged?, flagged_total?, restored?")
	return cmd
}

// recordWriter prints records as a table (a person) or one JSON object per line (a machine).
type recordWriter struct {
	json bool
	enc  *json.Encoder
	tw   *tabwriter.Writer
	head bool
}

// noMatch says that nothing matched f, and how the likeliest mistakes are put right.
func noMatch(f api.AuditFilter) string {
	switch {
	case f.ID != "":
		return "no audited event has id " + f.ID + ": --id takes the whole x-event-id (`meshnode audit query --json` shows them), and an event is found once the log has read it (`meshnode status` shows its lag)"
	case f.Event != "":
		return "no audited event matches " + f.Event + ": the pattern is an event's name as `meshnode audit tail` prints it, with * for one part and ** for the rest (shop.**, *.order.placed, seat.mailer.*, node.alpha.**)"
	}
	return "no audited event matches; `meshnode audit tail` shows the latest"
}

func newRecordWriter(w io.Writer, asJSON bool) *recordWriter {
	return &recordWriter{json: asJSON, enc: json.NewEncoder(w), tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
}

func (w *recordWriter) write(r api.AuditRecord) {
	if w.json {
		out := map[string]any{
			"n": r.N, "seq": r.Seq, "subject": r.Subject, "key": envelope.Key(r.Subject), "event_id": r.EventID,
			"source": r.Source, "received": r.Received, "headers": flatHeaders(r.Headers), "body": bodyJSON(r.Body),
			"signed": r.Signed, "source_matches": r.SourceMatches, "prev": r.Prev, "hash": r.Hash,
		}
		if r.SignatureError != "" {
			out["signature_error"] = r.SignatureError
		}
		if r.NotGenuine != "" {
			out["not_genuine"], out["not_genuine_why"] = r.NotGenuine, r.NotGenuineWhy
		}
		w.enc.Encode(out)
		return
	}
	if !w.head {
		fmt.Fprintln(w.tw, "N\tRECEIVED\tEVENT\tSOURCE\tCHECK\tID\tBODY")
		w.head = true
	}
	check := "ok"
	if r.NotGenuine != "" {
		check = strings.ToUpper(r.NotGenuine) // as `audit verify` names it
	}
	body := string(r.Body)
	if len(body) > 60 {
		body = body[:57] + "..."
	}
	fmt.Fprintf(w.tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.N, r.Received.Format(time.RFC3339), envelope.Key(r.Subject), r.Source, check, r.EventID, body)
}

func (w *recordWriter) flush() error { return w.tw.Flush() }

func flatHeaders(h map[string][]string) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		out[k] = strings.Join(v, ",")
	}
	return out
}

func bodyJSON(b []byte) any {
	if json.Valid(b) {
		return json.RawMessage(b)
	}
	return string(b)
}
