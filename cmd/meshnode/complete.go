package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/artifact"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/deadletter"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
)

// Kinds of names a shell completes from the node (`meshnode completion bash|zsh|fish`).
const (
	namesModule          = "module"
	namesSeat            = "seat"
	namesNode            = "node"
	namesSecret          = "secret"
	namesDead            = "dead letter"      // DEAD's ids
	namesTarget          = "module or seat"   // what `call` calls
	namesTool            = "tool"             // the tools of the module in the first argument
	namesArtifactVersion = "artifact version" // the stored versions of the module in the first argument
	namesSeatVersion     = "seat version"     // the protocol versions of the seat in the second argument
	namesOwner           = "owner"            // a secret's owner: the operator or a module
	namesFile            = "file"             // the shell's own file completion
	namesContext         = "context"          // the saved contexts (this machine's, no node asked)
)

// completions are the names each verb's arguments and flags complete, by command path: one
// table, so that every argument naming a module, node, seat, dead letter or version
// completes (TestCompletion_EveryNameCompletes reads the verbs' usage lines against it).
var completions = map[string]struct {
	args  []string          // by position ("": nothing)
	flags map[string]string // flag → kind; a flag whose help says comma-separated completes each name
}{
	"meshnode artifact put":     {args: []string{namesModule, namesFile}},
	"meshnode artifact ls":      {args: []string{namesModule}},
	"meshnode artifact rm":      {args: []string{namesModule}, flags: map[string]string{"version": namesArtifactVersion}},
	"meshnode call":             {args: []string{namesTarget, namesTool}},
	"meshnode dead show":        {args: []string{namesDead}},
	"meshnode dead replay":      {args: []string{namesDead}},
	"meshnode dead drop":        {args: []string{namesDead}},
	"meshnode deploy":           {args: []string{namesModule}, flags: map[string]string{"nodes": namesNode, "version": namesArtifactVersion}},
	"meshnode undeploy":         {args: []string{namesModule}, flags: map[string]string{"nodes": namesNode}},
	"meshnode logs":             {args: []string{namesModule}, flags: map[string]string{"node": namesNode}},
	"meshnode module remove":    {args: []string{namesModule}},
	"meshnode node remove":      {args: []string{namesNode}},
	"meshnode provisions pin":   {args: []string{namesModule, "", namesSeat}},
	"meshnode seat pin":         {args: []string{namesModule, namesSeat, namesSeatVersion}},
	"meshnode snapshot save":    {args: []string{namesFile}},
	"meshnode snapshot inspect": {args: []string{namesFile}},
	"meshnode context use":      {args: []string{namesContext}},
	"meshnode context rm":       {args: []string{namesContext}},
	"meshnode vault mint":       {flags: map[string]string{"owner": namesOwner}},
	"meshnode vault rotate":     {args: []string{namesSecret}, flags: map[string]string{"owner": namesOwner}},
	"meshnode vault fetch":      {args: []string{namesSecret}, flags: map[string]string{"owner": namesOwner}},
	"meshnode vault ls":         {flags: map[string]string{"owner": namesOwner}},
}

// completeNames gives every verb in completions its completion functions, and every
// --context the saved contexts.
func completeNames(root *cobra.Command) {
	var contexts func(*cobra.Command)
	contexts = func(c *cobra.Command) {
		if c.Flags().Lookup("context") != nil {
			c.RegisterFlagCompletionFunc("context", completeFlag(namesContext))
		}
		for _, sub := range c.Commands() {
			contexts(sub)
		}
	}
	contexts(root)
	for path, c := range completions {
		cmd, rest, err := root.Find(strings.Fields(path)[1:])
		if err != nil || len(rest) > 0 || cmd.CommandPath() != path {
			panic("completions: no command " + path)
		}
		if c.args != nil {
			cmd.ValidArgsFunction = completeArgs(c.args...)
		}
		for flag, kind := range c.flags {
			if cmd.Flags().Lookup(flag) == nil {
				panic("completions: " + path + " has no flag --" + flag)
			}
			cmd.RegisterFlagCompletionFunc(flag, completeFlag(kind))
		}
	}
}

// completeArgs completes each positional argument with names of the kind at its place ("":
// nothing), asked of the node the verb would talk to; a node that does not answer within a
// second completes nothing.
func completeArgs(kinds ...string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		if len(args) >= len(kinds) || kinds[len(args)] == "" {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		if kinds[len(args)] == namesFile {
			return nil, cobra.ShellCompDirectiveDefault
		}
		names := namesOf(cmd, kinds[len(args)], args)
		return withPrefix(names, prefix), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeFlag completes a flag's value with names of kind; a comma-separated list (--nodes
// a,b) completes its last name.
func completeFlag(kind string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		done, last := "", prefix
		if i := strings.LastIndexByte(prefix, ','); i >= 0 {
			done, last = prefix[:i+1], prefix[i+1:]
		}
		var out []string
		for _, n := range withPrefix(namesOf(cmd, kind, args), last) {
			out = append(out, done+n)
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

func withPrefix(names []string, prefix string) []string {
	return slices.DeleteFunc(names, func(n string) bool { return !strings.HasPrefix(n, prefix) })
}

// namesOf lists the node's names of kind (args: the verb's arguments so far); nil when it
// cannot tell.
func namesOf(cmd *cobra.Command, kind string, args []string) []string {
	if kind == namesContext {
		return contextNames()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if kind == namesNode {
		if remote, err := byServer(cmd); err == nil && !remote {
			return nodesByHTTP(ctx, cmd)
		}
	}
	url, creds, err := clientTarget(cmd)
	if err != nil {
		return nil
	}
	nc, err := dialWith(url, creds, append(caOptions(cmd), nats.NoReconnect(), nats.Timeout(500*time.Millisecond))...)
	if err != nil {
		return nil
	}
	defer nc.Close()
	out := namesOnBus(ctx, cmd, nc, kind, args)
	slices.Sort(out)
	return slices.Compact(out)
}

// nodesByHTTP lists the members the node running on the data dir knows.
func nodesByHTTP(ctx context.Context, cmd *cobra.Command) []string {
	dir, err := clientDataDir(cmd)
	if err != nil {
		return nil
	}
	info, err := datadir.ReadInfo(dir)
	if err != nil {
		return nil
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, info.HTTPURL+"/v1/members", nil)
	resp, err := nodeHTTP(dir).Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var members []api.NodeMember
	json.NewDecoder(resp.Body).Decode(&members)
	return memberNames(members)
}

func memberNames(ms []api.NodeMember) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

// namesOnBus asks the node on nc for the names of kind.
func namesOnBus(ctx context.Context, cmd *cobra.Command, nc *nats.Conn, kind string, args []string) []string {
	var out []string
	switch kind {
	case namesNode:
		if msg, err := nc.RequestWithContext(ctx, manifest.NodeToolSubject(nc.ConnectedServerName(), api.NodeToolMembers), nil); err == nil {
			var reply api.NodeMembersReply
			json.Unmarshal(msg.Data, &reply)
			out = memberNames(reply.Members)
		}
	case namesModule, namesOwner, namesTool:
		mods, _ := admin.List(ctx, nc)
		for _, m := range mods {
			switch {
			case kind != namesTool:
				out = append(out, m.Module)
			case len(args) > 0 && m.Module == args[0]:
				out = append(out, m.Tools...)
			}
		}
		if kind == namesOwner {
			out = append(out, api.VaultCallerOperator)
		}
	case namesSeat, namesSeatVersion:
		for _, s := range seatsOn(ctx, nc) {
			switch {
			case kind == namesSeat:
				out = append(out, s.Seat)
			case len(args) > 1 && s.Seat == args[1]:
				for _, v := range s.Versions {
					out = append(out, v.Version)
				}
			}
		}
	case namesTarget:
		out = append(namesOnBus(ctx, cmd, nc, namesModule, args), namesOnBus(ctx, cmd, nc, namesSeat, args)...)
	case namesSecret:
		owner, _ := cmd.Flags().GetString("owner")
		metas, _ := vault.Call(ctx, nc, api.VaultVerbList, api.VaultCallerOperator, api.VaultRequest{Owner: owner}, nil)
		for _, m := range metas {
			out = append(out, m.Name)
		}
	case namesDead:
		js, _ := jetstream.New(nc)
		if dead, err := js.Stream(ctx, manifest.DeadStreamName); err == nil {
			letters, _ := deadletter.List(ctx, dead)
			for _, d := range letters {
				out = append(out, strconv.FormatUint(d.ID, 10))
			}
		}
	case namesArtifactVersion:
		js, _ := jetstream.New(nc)
		if obs, err := artifact.Lookup(ctx, js); err == nil && len(args) > 0 {
			infos, _ := artifact.List(ctx, obs, args[0])
			for _, a := range infos {
				out = append(out, a.Version)
			}
		}
	default:
		panic(fmt.Sprintf("no names of kind %q", kind))
	}
	return out
}

// seatsOn lists the mesh's seats, as the controller reports them.
func seatsOn(ctx context.Context, nc *nats.Conn) []api.SeatStatus {
	msg, err := nc.RequestWithContext(ctx, api.SeatListSubject, []byte("{}"))
	if err != nil {
		return nil
	}
	var reply api.SeatListReply
	json.Unmarshal(msg.Data, &reply)
	return reply.Seats
}
