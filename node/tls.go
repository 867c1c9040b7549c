package node

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/meshca"
	"github.com/meshnode/meshnode/site"
	"github.com/nats-io/nats.go"
)

// certs is the node's certificate and the mesh's CA that issues it.
type certs struct {
	keeper *meshca.Keeper // the current certificate, for routes and TLS clients
	ca     *meshca.CA
}

// Routes are always TLS, both ends verified against the mesh's CA; the client port is TLS
// when it is not on loopback (or client-tls says always). The node's certificate is issued
// by the node itself (meshca: the CA derives from the route credential), kept in the data
// dir, renewed at start when due and by `meshnode cert rotate`, and swapped under running
// connections: a handshake asks for the current one.

// clientTLSOn reports whether the client port is TLS.
func (n *Node) clientTLSOn() bool {
	if n.cfg.ClientTLS == "always" {
		return true
	}
	host, _, err := net.SplitHostPort(n.cfg.ClientAddr)
	return err == nil && !meshca.Loopback(host)
}

// clientCAFile is the CA certificate the node's modules trust (MESH_CA), "" when the
// client port is plain.
func (n *Node) clientCAFile() string {
	if !n.clientTLSOn() {
		return ""
	}
	return filepath.Join(n.cfg.DataDir, meshca.CAFile)
}

// certHosts are what the node's certificate covers.
func (n *Node) certHosts() []string {
	return meshca.Hosts(n.cfg.ClusterAddr, n.cfg.ClientAddr, n.cfg.Advertise, n.cfg.HTTPAddr, n.cfg.LeafAddr)
}

// openCerts loads the node's certificate from its data dir, issuing a new one when there
// is none or it is due, and writes the CA's certificate beside it.
func (n *Node) openCerts() error {
	ca, err := meshca.New(n.found.RouteSecret, n.id.MeshID)
	if err != nil {
		return err
	}
	cert, err := meshca.Load(n.cfg.DataDir)
	if err != nil {
		n.log.Warn("the node's certificate cannot be read; issuing a new one", "err", err)
	}
	if cert == nil || meshca.Due(*cert, n.certHosts(), time.Now()) {
		c, err := ca.Issue(n.id.Name, n.certHosts(), time.Now())
		if err != nil {
			return fmt.Errorf("issue the node's certificate: %w", err)
		}
		cert = &c
		n.log.Info("issued the node's certificate", "hosts", n.certHosts(), "not_after", c.Leaf.NotAfter)
	}
	if err := meshca.Save(n.cfg.DataDir, ca, *cert); err != nil {
		return fmt.Errorf("keep the node's certificate: %w", err)
	}
	n.tls.keeper = meshca.NewKeeper(ca, *cert)
	n.tls.ca = ca
	n.web.certs.Set(n.tls.keeper)
	return nil
}

// rotateCert issues the node a new certificate and presents it from the next handshake on.
func (n *Node) rotateCert() error {
	c, err := n.tls.ca.Issue(n.id.Name, n.certHosts(), time.Now())
	if err != nil {
		return err
	}
	if err := meshca.Save(n.cfg.DataDir, n.tls.ca, c); err != nil {
		return err
	}
	n.tls.keeper.Set(c)
	n.log.Info("rotated the node's certificate", "serial", c.Leaf.SerialNumber.Text(16), "not_after", c.Leaf.NotAfter)
	return nil
}

// certCheckInterval is how often a running node checks whether its certificate is due.
const certCheckInterval = time.Hour

// renewCerts renews the node's certificate while it runs, once it is due (a third of its
// life left): a node up longer than its certificate's life keeps routes and clients able
// to reconnect.
func (n *Node) renewCerts(ctx context.Context) error {
	t := time.NewTicker(certCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if meshca.Due(n.tls.keeper.Current(), n.certHosts(), time.Now()) {
			if err := n.rotateCert(); err != nil {
				n.log.Error("renew the node's certificate; trying again in an hour", "err", err)
			}
		}
	}
}

// serveCertRotate answers the node's cert-rotate tool.
func (n *Node) serveCertRotate() (*nats.Subscription, error) {
	return n.resp.nc.Subscribe(manifest.NodeToolSubject(n.id.Name, api.NodeToolCertRotate), func(m *nats.Msg) {
		respondCluster(m, n.rotateCert())
	})
}

// hub is the node's side of sites (package site): where it takes their links, and their
// enrolment.
func (n *Node) hub() site.Hub {
	h := site.Hub{Config: n.cfg, MeshID: n.id.MeshID, Registry: n.reg, Members: n.mesh.members.Members,
		Enrolled: func(ctx context.Context) error { return n.ctrl.Topology().EnsureMesh(ctx) }}
	if n.tls.ca != nil {
		h.CA, h.TLS = n.tls.ca.Cert.Raw, n.tls.keeper.ClientTLS
	}
	return h
}
