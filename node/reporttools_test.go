package node_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
)

// TestReportTools_OperatorOverTheBus: the operator reaches a node's status, members and ui
// tools by its client port alone — what `meshnode status --server` asks — and they answer
// what the HTTP API does; a module may not call them.
func TestReportTools_OperatorOverTheBus(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	ask := func(tool string, out any) {
		t.Helper()
		msg, err := b.op.Request(manifest.NodeToolSubject("alpha", tool), nil, 10*time.Second)
		if err != nil {
			t.Fatalf("%s tool: %v", tool, err)
		}
		if err := json.Unmarshal(msg.Data, out); err != nil {
			t.Fatalf("%s tool answered %q: %v", tool, msg.Data, err)
		}
	}
	var st api.NodeStatus
	ask(api.NodeToolStatus, &st)
	if st.Name != "alpha" || st.MeshID == "" || !st.Ready || st.ClientURL != b.n.ClientURL() || st.HTTPURL != b.n.HTTPURL() {
		t.Fatalf("status tool: %+v", st)
	}
	var ms api.NodeMembersReply
	ask(api.NodeToolMembers, &ms)
	// A single node's address is its client URL, as a mesh member's is.
	if got := ms.Members; len(got) != 1 || got[0].Name != "alpha" || got[0].Address != b.n.ClientURL() || got[0].GossipAddr != "" || got[0].State != "alive" {
		t.Fatalf("members tool: %+v", got)
	}
	var ch api.UIChallenge
	ask(api.NodeToolUI, &ch)
	if ch.Node != "alpha" || ch.MeshID != st.MeshID || ch.Nonce == "" || ch.HTTPURL != b.n.HTTPURL() {
		t.Fatalf("ui tool: %+v", ch)
	}

	seed, _ := b.register("module: shop\nrequires: [mesh-bus]\n")
	nc := b.raw(seed, "shop")
	for _, tool := range []string{api.NodeToolStatus, api.NodeToolMembers, api.NodeToolUI} {
		if !refusedPub(t, nc, manifest.NodeToolSubject("alpha", tool)) {
			t.Errorf("a module may publish on the %s tool", tool)
		}
	}
}
