package deploy_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/deploy"
	"github.com/meshnode/meshnode/manifest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func userKey(t *testing.T) string {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	return pub
}

func TestCompose(t *testing.T) {
	shopKey, mailKey := userKey(t), userKey(t)
	deployed := []deploy.Deployed{
		{Module: "shop", PublicKey: shopKey, Deployment: &api.Deployment{Version: "1.0", Digest: digest, Nodes: []string{"a", "b"}, Instances: 2}},
		{Module: "mail", PublicKey: mailKey, Secrets: []string{"smtp"}, Deployment: &api.Deployment{Version: "2", Digest: digest, All: true, Instances: 1}},
		{Module: "idle", PublicKey: userKey(t)}, // registered, not deployed
	}
	a := deploy.Compose("a", deployed)
	if len(a) != 2 || a[0].Module != "mail" || a[1].Module != "shop" || a[1].Instances != 2 || a[0].Secrets[0] != "smtp" {
		t.Fatalf("node a: %+v", a)
	}
	c := deploy.Compose("c", deployed)
	if len(c) != 1 || c[0].Module != "mail" {
		t.Fatalf("node c: %+v", c)
	}
	if !deploy.SameModules(a, deploy.Compose("a", deployed)) || deploy.SameModules(a, c) {
		t.Fatal("SameModules does not tell equal compositions from different ones")
	}
}

func TestDeployment_Check(t *testing.T) {
	ok := api.Deployment{Version: "1.2.0", Nodes: []string{"a"}, Instances: 1, Env: map[string]string{"LOG_LEVEL": "debug"}}
	if err := deploy.CheckDeployment(&ok); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*api.Deployment){
		"no nodes":       func(d *api.Deployment) { d.Nodes = nil },
		"all and nodes":  func(d *api.Deployment) { d.All = true },
		"zero instances": func(d *api.Deployment) { d.Instances = 0 },
		"a bad version":  func(d *api.Deployment) { d.Version = "../x" },
		"a MESH_ name":   func(d *api.Deployment) { d.Env = map[string]string{"MESH_CREDS": "/tmp/x"} },
		"a bad env name": func(d *api.Deployment) { d.Env = map[string]string{"A-B": "x"} },
		"a bad node":     func(d *api.Deployment) { d.Nodes = []string{"A"} },
	} {
		d := ok
		d.Env = map[string]string{}
		mutate(&d)
		if err := deploy.CheckDeployment(&d); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestCheck: a node applies only a declaration for itself, signed by a server of the mesh
// over its own subject, newer than the one it applied; anything else is refused with why.
func TestCheck(t *testing.T) {
	ctrl, _ := nkeys.CreateServer()
	ctrlPub, _ := ctrl.PublicKey()
	op, _ := nkeys.CreateUser()
	servers := func(name string) (string, bool) { return ctrlPub, name == "beta" }
	d := deploy.Declaration{Node: "alpha", Revision: 5, Epoch: 3, Controller: "beta",
		Modules: []deploy.Module{{Module: "shop", PublicKey: userKey(t), Version: "1", Digest: digest, Instances: 1}}}
	sign := func(key nkeys.KeyPair, signer string, d deploy.Declaration) (nats.Header, []byte) {
		body, _ := json.Marshal(d)
		h, err := deploy.Sign(key, signer, d, body)
		if err != nil {
			t.Fatal(err)
		}
		return h, body
	}
	subject := manifest.StateSubject("alpha")
	h, body := sign(ctrl, "beta", d)
	if got, err := deploy.Check("alpha", subject, h, body, servers, deploy.Declaration{Revision: 4, Epoch: 3}); err != nil || got.Revision != 5 {
		t.Fatalf("a good declaration: %v", err)
	}
	for name, tc := range map[string]struct {
		subject string
		h       nats.Header
		body    []byte
		last    deploy.Declaration
		want    error
	}{
		"a replay of the applied one": {subject, h, body, deploy.Declaration{Revision: 5}, deploy.ErrStale},
		"an older one":                {subject, h, body, deploy.Declaration{Revision: 6}, deploy.ErrStale},
		"an older controller epoch":   {subject, h, body, deploy.Declaration{Revision: 1, Epoch: 4}, deploy.ErrOlderEpoch},
		"another node's subject":      {manifest.StateSubject("gamma"), h, body, deploy.Declaration{}, deploy.ErrForged},
		"an altered body":             {subject, h, []byte(strings.Replace(string(body), `"revision":5`, `"revision":9`, 1)), deploy.Declaration{}, deploy.ErrForged},
	} {
		if _, err := deploy.Check("alpha", tc.subject, tc.h, tc.body, servers, tc.last); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	// Signed by the operator's key, under a server's name or its own: not the controller.
	h, body = sign(op, "beta", d)
	if _, err := deploy.Check("alpha", subject, h, body, servers, deploy.Declaration{}); !errors.Is(err, deploy.ErrForged) {
		t.Errorf("signed by the operator as beta: %v", err)
	}
	d.Controller = "operator"
	h, body = sign(op, "operator", d)
	if _, err := deploy.Check("alpha", subject, h, body, servers, deploy.Declaration{}); !errors.Is(err, deploy.ErrForged) {
		t.Errorf("signed by the operator: %v", err)
	}
	// Signed properly but declaring another node, or a bad module.
	d.Controller, d.Node = "beta", "gamma"
	h, body = sign(ctrl, "beta", d)
	if _, err := deploy.Check("alpha", subject, h, body, servers, deploy.Declaration{}); !errors.Is(err, deploy.ErrForged) {
		t.Errorf("a declaration for gamma on alpha's subject: %v", err)
	}
	d.Node = "alpha"
	// A host names the artifact's file after the digest: one that is not hex could name a
	// path outside the module's directory.
	for _, bad := range []string{"md5:x", "sha256:/../../../plant1" + strings.Repeat("0", 48), "sha256:" + strings.Repeat("A", 64), "sha256:" + strings.Repeat("0", 63)} {
		d.Modules[0].Digest = bad
		h, body = sign(ctrl, "beta", d)
		if _, err := deploy.Check("alpha", subject, h, body, servers, deploy.Declaration{}); err == nil || !strings.Contains(err.Error(), "digest") {
			t.Errorf("a module with digest %q: %v", bad, err)
		}
	}
}
