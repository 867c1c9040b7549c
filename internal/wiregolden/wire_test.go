// Package wiregolden pins the JSON of every request and reply that crosses the bus, and of
// the records other processes read, so moving the types between packages (issue 34's leaf
// wire package) cannot change the wire unnoticed. Each type is filled by a fixed rule
// (every field set), marshalled, and compared with testdata/NAME.json; a fixture decodes back
// into its type and marshals to the same bytes, so a renamed tag or a dropped field fails.
//
// Regenerate after an intended wire change: go test ./internal/wiregolden -update
package wiregolden_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/meshnode/meshnode/admin"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/build"
	"github.com/meshnode/meshnode/dashboard"
	"github.com/meshnode/meshnode/datadir"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/host"
	"github.com/meshnode/meshnode/membership"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/registry"
)

var update = flag.Bool("update", false, "rewrite testdata from the types as they are")

// wire names each type by the fixture it is pinned to.
var wire = map[string]any{
	"admin.Registered":           admin.Registered{},
	"api.AuditRequest":           api.AuditRequest{},
	"api.AuditReply":             api.AuditReply{},
	"build.Job":                  build.Job{},
	"build.Built":                build.Built{},
	"build.Failed":               build.Failed{},
	"build.Pushed":               build.Pushed{},
	"api.DeadLetter":             api.DeadLetter{},
	"api.Deployment":             api.Deployment{},
	"deploy.Declaration":         deploy.Declaration{},
	"host.Report":                host.Report{},
	"api.LogsRequest":            api.LogsRequest{},
	"api.LogsReply":              api.LogsReply{},
	"api.AcceptLossRequest":      api.AcceptLossRequest{},
	"api.AdmitRefusal":           api.AdmitRefusal{},
	"api.QuotaUse":               api.QuotaUse{},
	"api.ClusterRequest":         api.ClusterRequest{},
	"api.ClusterReply":           api.ClusterReply{},
	"api.GrowRequest":            api.GrowRequest{},
	"api.ArchiveRequest":         api.ArchiveRequest{},
	"api.ChangedRequest":         api.ChangedRequest{},
	"api.GitReply":               api.GitReply{},
	"api.BuilderStatus":          api.BuilderStatus{},
	"api.NodeStatus":             api.NodeStatus{},
	"api.NodeMember":             api.NodeMember{},
	"api.NodeMembersReply":       api.NodeMembersReply{},
	"membership.Meta":            membership.Meta{}, // the gossip's node meta
	"api.UIChallenge":            api.UIChallenge{},
	"datadir.Info":               datadir.Info{},
	"dashboard.State":            dashboard.State{},
	"dashboard.DeployRequest":    dashboard.DeployRequest{},
	"dashboard.Challenge":        dashboard.Challenge{},
	"dashboard.ModulePage":       dashboard.ModulePage{},
	"outbox.Event":               outbox.Event{},
	"api.ProvisionCreateRequest": api.ProvisionCreateRequest{},
	"api.ProvisionCreateReply":   api.ProvisionCreateReply{},
	"api.ProvisionRemoveRequest": api.ProvisionRemoveRequest{},
	"api.ProvisionHoldsRequest":  api.ProvisionHoldsRequest{},
	"api.ProvisionHoldsReply":    api.ProvisionHoldsReply{},
	"api.Provision":              api.Provision{},
	"api.RegisterRequest":        api.RegisterRequest{},
	"api.RegisterReply":          api.RegisterReply{},
	"api.RemoveRequest":          api.RemoveRequest{},
	"api.RemoveReply":            api.RemoveReply{},
	"api.PinRequest":             api.PinRequest{},
	"api.PinReply":               api.PinReply{},
	"api.DeployRequest":          api.DeployRequest{},
	"api.UndeployRequest":        api.UndeployRequest{},
	"api.DeployReply":            api.DeployReply{},
	"api.PsReply":                api.PsReply{},
	"api.ProvideRequest":         api.ProvideRequest{},
	"api.ProvideReply":           api.ProvideReply{},
	"api.ProvisionsReply":        api.ProvisionsReply{},
	"api.BuildsReply":            api.BuildsReply{},
	"api.ListRequest":            api.ListRequest{},
	"api.ListReply":              api.ListReply{},
	"api.WhoamiRequest":          api.WhoamiRequest{},
	"api.WhoamiReply":            api.WhoamiReply{},
	"registry.Record":            registry.Record{},
	"registry.NodeIdentity":      registry.NodeIdentity{},
	"api.SeatInfo":               api.SeatInfo{},
	"api.SeatRequest":            api.SeatRequest{},
	"api.SeatReply":              api.SeatReply{},
	"api.SeatListReply":          api.SeatListReply{},
	"api.ToolStatsReport":        api.ToolStatsReport{},
	"api.ModuleCredentials":      api.ModuleCredentials{},
	"api.ServerSecrets":          api.ServerSecrets{},
	"api.RecoveryKey":            api.RecoveryKey{},
	"api.AuditRestored":          api.AuditRestored{},
	"api.SealedFoundation":       api.SealedFoundation{},
	"api.VaultRequest":           api.VaultRequest{},
	"api.VaultReply":             api.VaultReply{},
	"api.Secret":                 api.Secret{},
	"api.Identity":               api.Identity{},
	"api.Token":                  api.Token{},
	"api.Enrolment":              api.Enrolment{},
	"api.Provisioned":            api.Provisioned{},
}

func TestWireJSONUnchanged(t *testing.T) {
	for name, zero := range wire {
		t.Run(name, func(t *testing.T) {
			v := reflect.New(reflect.TypeOf(zero))
			fill(v.Elem(), 0)
			got, err := json.MarshalIndent(v.Interface(), "", "  ")
			if err != nil {
				t.Fatalf("marshal %s: %v", name, err)
			}
			path := filepath.Join("testdata", name+".json")
			if *update {
				if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v: a new wire type gets a fixture with -update", err)
			}
			if !bytes.Equal(bytes.TrimSpace(want), got) {
				t.Fatalf("%s's JSON changed (regenerate with -update only for an intended wire change):\n got: %s\nwant: %s", name, got, want)
			}
			// The fixture decodes back into the type and says the same.
			back := reflect.New(reflect.TypeOf(zero))
			if err := json.Unmarshal(want, back.Interface()); err != nil {
				t.Fatalf("decode %s: %v", path, err)
			}
			again, _ := json.MarshalIndent(back.Interface(), "", "  ")
			if !bytes.Equal(again, got) {
				t.Fatalf("%s does not survive a round trip:\n got: %s\nwant: %s", name, again, got)
			}
		})
	}
}

// fill sets every exported field of v by a fixed rule, so each tag appears in the JSON.
func fill(v reflect.Value, depth int) {
	if depth > 6 {
		return
	}
	switch v.Type() {
	case reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)))
		return
	case reflect.TypeFor[time.Duration]():
		v.SetInt(int64(3 * time.Second))
		return
	case reflect.TypeFor[json.RawMessage]():
		v.SetBytes([]byte(`{"raw":1}`))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("s")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(9)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), depth+1)
		v.Set(s)
	case reflect.Array:
		for i := range v.Len() {
			fill(v.Index(i), depth+1)
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k := reflect.New(v.Type().Key()).Elem()
		fill(k, depth+1)
		e := reflect.New(v.Type().Elem()).Elem()
		fill(e, depth+1)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), depth+1)
			}
		}
	}
}
