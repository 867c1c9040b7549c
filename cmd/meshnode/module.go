package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
)

// newModuleCmd returns `meshnode module`: check and show read manifest files only and need no
// running node; register, ls and remove talk to the node as the operator.
func newModuleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "module",
		Short: "Check, inspect and register module manifests",
		Long: `Check, inspect and register module manifests.

A manifest names things locally (events, tools, seats); the mesh derives every subject,
stream, consumer and permission from it. check refuses what the mesh would refuse; show
prints what the bus will make of a manifest before it is registered; register, ls and
remove change and read the running mesh's registry.`,
		Annotations:   map[string]string{groupAnnotation: "true"},
		Args:          cobra.ArbitraryArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown module verb %q; use module check, show, register, ls or remove", args[0]), cmd.CommandPath() + " COMMAND"}
			}
			return cmd.Help()
		},
	}
	// Set here as well as on the root, so the command maps flag errors to exit 2 on its own.
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err, c.UseLine()} })
	cmd.AddCommand(newModuleCheckCmd(), newModuleShowCmd(),
		newModuleRegisterCmd(), newModuleLsCmd(), newModuleRemoveCmd())
	return cmd
}

func newModuleCheckCmd() *cobra.Command {
	var catalogueDir string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check FILE... [--catalogue DIR] [--json]",
		Short: "Validate manifests and print every refusal",
		Long: `Validate manifests and print every refusal, one per line, naming the file, line, field
and value and what to write instead. Exit 0 when every manifest passes, 1 otherwise.

The FILEs are also checked against each other, as if registered together. With --catalogue,
every *.yaml and *.yml in DIR is the registered catalogue: seats another module declares,
consumed events a present emitter does not emit, and, where DIR holds an earlier version of
a checked module, seat protocol changes that break the modules using the seat.

What only the mesh knows is checked by register, not here: the registered catalogue when
--catalogue is not given, and the room the mesh's store has for the seats' queues and for
its consumers' dead letters.`,
		Example: `  meshnode module check telegram.yaml
  meshnode module check manifests/*.yaml --catalogue /srv/mesh/catalogue`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("module check needs at least one FILE")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runModuleCheck(cmd.OutOrStdout(), cmd.ErrOrStderr(), args, catalogueDir, asJSON)
		},
	}
	cmd.Flags().StringVar(&catalogueDir, "catalogue", "", "check against the registered manifests in `DIR` (*.yaml, *.yml)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per FILE: file, ok, module?, refusals?, waiting?, error?")
	return cmd
}

// moduleFile is one FILE of module check and what became of it.
type moduleFile struct {
	path     string
	data     []byte
	m        *manifest.Manifest // nil when the file could not be read as a manifest
	valid    bool               // passed on its own, so it joins the others' catalogue
	twice    bool               // another FILE before it declares the same module
	refusals manifest.Refusals
	waiting  []string // required interfaces no module of the catalogue provides
	err      error    // the file could not be read
}

// moduleCheckResult is one FILE of `module check --json`.
type moduleCheckResult struct {
	File     string             `json:"file"`
	Module   string             `json:"module,omitempty"`
	OK       bool               `json:"ok"`
	Refusals []manifest.Refusal `json:"refusals,omitempty"`
	Waiting  []string           `json:"waiting,omitempty"` // required interfaces no module provides
	Error    string             `json:"error,omitempty"`   // the file could not be read
}

func runModuleCheck(stdout, stderr io.Writer, paths []string, catalogueDir string, asJSON bool) error {
	var registered map[string]moduleCatalogueEntry
	if catalogueDir != "" {
		var err error
		if registered, err = loadModuleCatalogue(catalogueDir); err != nil {
			return err
		}
	}

	// First each FILE on its own, to learn its module and whether it is valid.
	files := make([]*moduleFile, len(paths))
	firstFile := map[string]string{}
	for i, p := range paths {
		f := &moduleFile{path: p}
		files[i] = f
		if f.data, f.err = readManifest(p); f.err != nil {
			var rs manifest.Refusals
			if errors.As(f.err, &rs) { // over the size limit: refused as any manifest is
				f.refusals, f.err = rs, nil
			}
			continue
		}
		var err error
		f.m, err = manifest.Check(f.data, nil)
		f.refusals = moduleRefusals(err)
		if f.m == nil || f.m.Module == "" {
			continue
		}
		if _, ok := firstFile[f.m.Module]; ok {
			f.twice = true
			continue
		}
		firstFile[f.m.Module] = p
		f.valid = err == nil
	}

	// Then each against the catalogue: the registered manifests (its own registered version
	// being its previous one), with the other valid FILEs in place of theirs, as if
	// registered together.
	for _, f := range files {
		if f.m == nil {
			continue
		}
		catalogue := map[string]*manifest.Manifest{}
		for name, e := range registered {
			catalogue[name] = e.m
		}
		for _, o := range files {
			if o.valid && o.m.Module != f.m.Module {
				catalogue[o.m.Module] = o.m
			}
		}
		_, err := manifest.Check(f.data, slices.Collect(maps.Values(catalogue)))
		f.refusals = moduleRefusals(err)
		f.waiting = manifest.Waiting(f.m, slices.Collect(maps.Values(catalogue)))
		if f.twice {
			f.refusals = append(f.refusals, manifest.Refusal{
				Code: manifest.CodeModuleTwice, Field: "module", Value: f.m.Module,
				Reason:  "is also declared by " + firstFile[f.m.Module],
				Instead: "check one manifest per module at a time",
			})
		}
	}

	var refused, count int
	if asJSON {
		enc := json.NewEncoder(stdout)
		for _, f := range files {
			r := moduleCheckResult{File: f.path, Refusals: f.refusals, Waiting: f.waiting}
			if f.m != nil {
				r.Module = f.m.Module
			}
			if f.err != nil {
				r.Error = moduleReadCause(f.err).Error()
			}
			r.OK = f.err == nil && len(f.refusals) == 0
			if !r.OK {
				refused++
			}
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		if refused > 0 {
			return errReported
		}
		return nil
	}
	for _, f := range files {
		switch {
		case f.err != nil:
			refused++
			count++
			fmt.Fprintf(stderr, "%s: cannot read: %v\n", f.path, moduleReadCause(f.err))
		case len(f.refusals) > 0:
			refused++
			count += len(f.refusals)
			printModuleRefusals(stderr, f.path, f.refusals)
		default:
			fmt.Fprintf(stdout, "%s: ok (module %s)\n", f.path, f.m.Module)
			for _, iface := range f.waiting {
				fmt.Fprintf(stdout, "%s: note: requires %s, which no module in the catalogue provides; deployed, it waits for a provider\n", f.path, iface)
			}
		}
	}
	if refused == 0 {
		return nil
	}
	fmt.Fprintf(stderr, "%d %s in %d of %d %s\n", count, modulePlural(count, "refusal", "refusals"), refused, len(files), modulePlural(len(files), "manifest", "manifests"))
	return errReported
}

// moduleCatalogueEntry is one registered manifest of a --catalogue DIR.
type moduleCatalogueEntry struct {
	path string
	m    *manifest.Manifest
}

// loadModuleCatalogue reads every *.yaml and *.yml in dir. A manifest there that does not pass
// on its own is an error: the catalogue is what is registered, and must be valid.
func loadModuleCatalogue(dir string) (map[string]moduleCatalogueEntry, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("catalogue: %w", err)
	}
	out := map[string]moduleCatalogueEntry{}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		path := filepath.Join(dir, name)
		data, err := readManifest(path)
		var rs manifest.Refusals
		var m *manifest.Manifest
		switch {
		case errors.As(err, &rs): // over the size limit: refused below
		case err != nil:
			return nil, fmt.Errorf("catalogue: %w", err)
		default:
			if m, err = manifest.Parse(data); err == nil {
				err = m.Validate()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("catalogue manifest %s is refused (%s); run meshnode module check %s", path, moduleFirstLine(err), path)
		}
		if prev, ok := out[m.Module]; ok {
			return nil, fmt.Errorf("catalogue %s declares module %s twice, in %s and %s; keep one", dir, m.Module, prev.path, path)
		}
		out[m.Module] = moduleCatalogueEntry{path: path, m: m}
	}
	return out, nil
}

func newModuleShowCmd() *cobra.Command {
	var asJSON, builtin bool
	cmd := &cobra.Command{
		Use:   "show FILE [--json] | show --builtin [--json]",
		Short: "Print everything the mesh derives from a manifest",
		Long: `Print everything the mesh derives from a manifest: subjects, streams, consumers with their
filter subjects, the permissions of every instance (publish, subscribe with queue groups,
JetStream API subjects, inbox prefix), the permissions only a seat's holder gets, and each
seat's protocol fingerprint. Node-scoped parts are shown for the node ` + manifest.NodePlaceholder + `.

With --builtin it prints the built-in manifest instead: the mesh's own seats (mesh-controller,
mesh-vault, mesh-git, mesh-build-machine) with their protocols, derived by the same code.

A manifest that is refused prints its refusals, as module check does, and exits 1.`,
		Example: `  meshnode module show telegram.yaml
  meshnode module show telegram.yaml --json | jq .derivation.permissions
  meshnode module show --builtin`,
		Args: func(_ *cobra.Command, args []string) error {
			switch {
			case builtin && len(args) != 0:
				return usagef("module show --builtin takes no FILE, got %d", len(args))
			case !builtin && len(args) != 1:
				return usagef("module show takes one FILE (or --builtin), got %d", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if builtin {
				return showModuleDerivation(cmd.OutOrStdout(), "built-in", manifest.BuiltinManifest(), manifest.Builtin(), asJSON)
			}
			return runModuleShow(cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: file, manifest, derivation")
	cmd.Flags().BoolVar(&builtin, "builtin", false, "show the built-in manifest of the mesh's own seats")
	return cmd
}

func runModuleShow(stdout, stderr io.Writer, path string, asJSON bool) error {
	data, err := readManifest(path)
	var rs manifest.Refusals
	if err != nil && !errors.As(err, &rs) {
		return fmt.Errorf("read manifest: %w", err)
	}
	var m *manifest.Manifest
	if err == nil {
		m, err = manifest.Check(data, nil)
	}
	var d *manifest.Derivation
	if err == nil {
		d, err = m.Derive()
	}
	if err != nil {
		rs := moduleRefusals(err)
		printModuleRefusals(stderr, path, rs)
		fmt.Fprintf(stderr, "%d %s; nothing to show\n", len(rs), modulePlural(len(rs), "refusal", "refusals"))
		return errReported
	}
	return showModuleDerivation(stdout, path, m, d, asJSON)
}

// showModuleDerivation prints a manifest's derivation for people, or as one JSON object.
func showModuleDerivation(stdout io.Writer, path string, m *manifest.Manifest, d *manifest.Derivation, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			File       string               `json:"file"`
			Manifest   *manifest.Manifest   `json:"manifest"`
			Derivation *manifest.Derivation `json:"derivation"`
		}{path, m, d})
	}
	printModuleDerivation(stdout, path, m, d)
	return nil
}

// printModuleDerivation writes d for people: one section per kind of thing, names on the left and
// what the mesh makes of them on the right.
func printModuleDerivation(out io.Writer, path string, m *manifest.Manifest, d *manifest.Derivation) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	defer w.Flush()
	row := func(cells ...string) { fmt.Fprintln(w, strings.Join(cells, "\t")) }

	row("module", d.Module, "("+path+")")
	row("requires", moduleOrNone(strings.Join(m.Requires, ", ")))
	if len(m.Secrets) > 0 {
		row("secrets", strings.Join(m.Secrets, ", "))
	}
	if len(m.BuildOn) > 0 {
		row("built on", strings.Join(m.BuildOn, ", "))
	}
	if !d.Bus {
		row("bus", "none: the module does not require "+manifest.RequireBus+", so it has no account")
		return
	}
	row("inbox", d.Inbox+".>")

	if len(d.Emits) > 0 {
		row("")
		row("emits", "", "(into the shared "+manifest.EventsStreamName+" stream)")
		for _, e := range d.Emits {
			row("", e.Name, e.Subject)
		}
	}
	if d.EventsConsumer != nil {
		row("")
		row("consumes", "", "(durable consumer "+d.EventsConsumer.Name+" on "+d.EventsConsumer.Stream+")")
		for _, c := range d.Consumes {
			if c.CoveredBy != "" {
				row("", c.Name, c.Subject+"  (covered by "+c.CoveredBy+": not a filter of its own)")
				continue
			}
			row("", c.Name, c.Subject)
		}
	}
	if len(d.Tools) > 0 {
		row("")
		row("tools", "", "(core request/reply, queue group "+d.Module+")")
		for _, t := range d.Tools {
			row("", t.Name, t.Subject)
		}
	}
	if len(d.Uses) > 0 {
		row("")
		row("uses", "", "(send work and call tools; never subscribe)")
		for _, u := range d.Uses {
			name := u.Seat
			if u.Version != manifest.V1 {
				name += " (" + u.Version + ")"
			}
			row("", name, "publish "+strings.Join(u.Publish, ", "))
			row("", "", "request "+strings.Join(u.Request, ", "))
		}
	}

	for _, s := range d.Seats {
		row("")
		retain := ""
		if s.Retain != "" {
			retain = ", retain " + s.Retain
		}
		row("seat", s.Name, "(scope "+string(s.Scope)+retain+")")
		row("", "fingerprint", s.Fingerprint)
		at := func(d manifest.Derived, what string) string {
			if d.Version != "" {
				return d.Version + " " + what + " " + d.Name
			}
			return what + " " + d.Name
		}
		for _, a := range s.Accepts {
			row("", at(a, "accepts"), a.Subject)
		}
		for _, e := range s.Emits {
			row("", at(e, "emits"), e.Subject)
		}
		for _, v := range s.Serves {
			row("", at(v, "serves"), v.Subject+"  (queue group "+v.Queue+")")
		}
		if s.Stream != nil {
			row("", "stream", moduleStreamLine(*s.Stream))
		}
		if s.Consumer != nil {
			row("", "consumer", s.Consumer.Name+" on "+s.Consumer.Stream)
		}
	}

	var consumers []manifest.Consumer
	if d.EventsConsumer != nil {
		consumers = append(consumers, *d.EventsConsumer)
	}
	for _, s := range d.Seats {
		if s.Consumer != nil {
			consumers = append(consumers, *s.Consumer)
		}
	}
	if len(consumers) > 0 {
		row("")
		row("consumers")
	}
	for _, c := range consumers {
		row("", c.Stream+"/"+c.Name, "filter "+strings.Join(c.FilterSubjects, ", "))
		ackWait := "-"
		if len(c.BackOff) > 0 {
			ackWait = moduleDurations(c.BackOff[:1])
		}
		row("", "", fmt.Sprintf("deliver %s, ack %s, max ack pending %d, max deliver %d, ack wait %s (redelivers a crashed handler's event)",
			c.DeliverPolicy, c.AckPolicy, c.MaxAckPending, c.MaxDeliver, ackWait))
		row("", "", "a failed handler is retried after the sdk's back-off: "+moduleDurations(sdk.DefaultRetryBackoff))
		row("", "", "dead letters to "+c.DeadSubject)
	}

	row("")
	row("permissions", "", "(every instance)")
	printModulePermissions(row, d.Permissions)
	for _, s := range d.Seats {
		row("")
		row("holder", "of seat "+s.Name, "(only while an instance holds the seat's lease)")
		printModulePermissions(row, s.Holder)
	}
}

func printModulePermissions(row func(...string), p manifest.Permissions) {
	if len(p.Publish) == 0 {
		row("", "publish", "nothing")
	}
	for i, s := range p.Publish {
		row("", moduleLabel(i, "publish"), s)
	}
	if len(p.Subscribe) == 0 {
		row("", "subscribe", "nothing")
	}
	for i, s := range p.Subscribe {
		v := s.Subject
		if s.Queue != "" {
			v += "  (queue group " + s.Queue + " only)"
		}
		row("", moduleLabel(i, "subscribe"), v)
	}
	if p.AllowResponses {
		row("", "responses", "answers requests: into the operator's inbox (and a seat's holder into its users')")
	} else {
		row("", "responses", "not allowed")
	}
}

func moduleLabel(i int, s string) string {
	if i == 0 {
		return s
	}
	return ""
}

func moduleStreamLine(s manifest.Stream) string {
	parts := []string{s.Name + ": " + strings.Join(s.Subjects, ", "), string(s.Retention)}
	if s.MaxAge > 0 {
		parts = append(parts, "max age "+s.MaxAge.String())
	}
	return strings.Join(parts, ", ")
}

func moduleDurations(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, " ")
}

func moduleOrNone(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

// moduleRefusals returns err's refusals; any other error becomes one refusal saying so.
func moduleRefusals(err error) manifest.Refusals {
	if err == nil {
		return nil
	}
	var rs manifest.Refusals
	if errors.As(err, &rs) {
		return rs
	}
	return manifest.Refusals{{Reason: err.Error()}}
}

// printModuleRefusals writes one refusal per line: FILE:LINE: field "value": reason; instead.
func printModuleRefusals(w io.Writer, path string, rs manifest.Refusals) {
	for _, r := range rs {
		if r.Line > 0 {
			fmt.Fprintf(w, "%s:%d: %s\n", path, r.Line, r.Error())
		} else {
			fmt.Fprintf(w, "%s: %s\n", path, r.Error())
		}
	}
}

// moduleReadCause drops the operation and path from a read error, printed after the path.
func moduleReadCause(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func moduleFirstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

func modulePlural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
