package main

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

// Kinds of names a shell completes from the node (`meshnode completion bash|zsh|fish`).
const (
	namesModule = "module"
	namesSeat   = "seat"
	namesNode   = "node"
	namesSecret = "secret"
)

// completeArgs completes each positional argument with names of the kind at its place ("":
// nothing), asked of the node the verb would talk to; a node that does not answer within a
// second completes nothing.
func completeArgs(kinds ...string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		if len(args) >= len(kinds) || kinds[len(args)] == "" {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		names := namesOf(cmd, kinds[len(args)])
		return slices.DeleteFunc(names, func(n string) bool { return !strings.HasPrefix(n, prefix) }), cobra.ShellCompDirectiveNoFileComp
	}
}

// namesOf lists the node's names of kind; nil when it cannot tell.
func namesOf(cmd *cobra.Command, kind string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var out []string
	if kind == namesNode {
		dir, err := clientDataDir(cmd)
		if err != nil {
			return nil
		}
		info, err := datadir.ReadInfo(dir)
		if err != nil {
			return nil
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, info.HTTPURL+"/v1/members", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var members []api.NodeMember
		json.NewDecoder(resp.Body).Decode(&members)
		for _, m := range members {
			out = append(out, m.Name)
		}
		return out
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
	switch kind {
	case namesModule:
		mods, _ := admin.List(ctx, nc)
		for _, m := range mods {
			out = append(out, m.Module)
		}
	case namesSeat:
		if msg, err := nc.RequestWithContext(ctx, api.SeatListSubject, []byte("{}")); err == nil {
			var reply api.SeatListReply
			json.Unmarshal(msg.Data, &reply)
			for _, s := range reply.Seats {
				out = append(out, s.Seat)
			}
		}
	case namesSecret:
		owner, _ := cmd.Flags().GetString("owner")
		metas, _ := vault.Call(ctx, nc, api.VaultVerbList, api.VaultCallerOperator, api.VaultRequest{Owner: owner}, nil)
		for _, m := range metas {
			out = append(out, m.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
