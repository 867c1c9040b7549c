// Command postgres-provisioner is an example provisioner module as a user writes one (DESIGN
// §12): it holds the postgres seat and serves its create, remove and holds tools, making for
// each module that requires postgres a database and a role that owns it and alone may
// connect to it. The credential it answers is sealed to the vault's xkey: the password is
// in the sealed reply and nowhere else — not in its logs, not even in the server's.
//
//	module: postgres-provisioner
//	requires: [mesh-bus]
//	secrets: [admin-url]
//	seats:
//	  postgres:
//	    scope: mesh
//	    serves: [create, remove, holds]
//	    provides: [postgres]
//
// The secret admin-url is the DSN of a superuser, or of a role with CREATEROLE and CREATEDB,
// reached over TCP at the address consumers reach too:
// postgres://USER:PASSWORD@HOST:PORT/postgres?sslmode=disable. The host writes it to
// $MESH_SECRETS/admin-url; run by hand, PG_ADMIN_URL gives it instead.
//
// It takes one option, connection-limit, the most connections a consumer's role may hold
// (requires: [mesh-bus, postgres: {connection-limit: 5}]); without it there is no limit.
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/meshnode/meshnode/sdk"
)

// adminSecret is the declared secret holding the admin DSN; adminEnv overrides it.
const (
	adminSecret = "admin-url"
	adminEnv    = "PG_ADMIN_URL"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, log); err != nil {
		fmt.Fprintln(os.Stderr, "postgres-provisioner:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger) error {
	admin, err := adminURL()
	if err != nil {
		return err
	}
	p, err := newProvisioner(admin, log)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := sdk.Connect(cctx, os.Getenv("MESH_URL"), os.Getenv("MESH_CREDS"), sdk.WithLogger(log))
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.HoldSeat("postgres", sdk.SeatHandlers{Serves: p.handlers()}); err != nil {
		return err
	}
	log.Info("serving the postgres seat", "instance", c.Instance(), "server", p.host)
	<-ctx.Done()
	log.Info("stopped")
	return nil
}

// adminURL reads the admin DSN: from PG_ADMIN_URL when it is set (running by hand), else
// from the secret the host wrote under $MESH_SECRETS.
func adminURL() (string, error) {
	if v := os.Getenv(adminEnv); v != "" {
		return v, nil
	}
	dir := os.Getenv("MESH_SECRETS")
	if dir == "" {
		return "", fmt.Errorf("no admin DSN: neither %s nor MESH_SECRETS is set; run under a host that gives the module its secret %s, or set %s", adminEnv, adminSecret, adminEnv)
	}
	b, err := os.ReadFile(filepath.Join(dir, adminSecret))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("no admin DSN: the host wrote no secret %s to %s; store the admin DSN as this module's secret %s and deploy again", adminSecret, dir, adminSecret)
	}
	if err != nil {
		return "", fmt.Errorf("read the admin DSN: %w", err)
	}
	admin := strings.TrimSpace(string(b)) // a secret written by hand ends in a newline
	if admin == "" {
		return "", fmt.Errorf("the secret %s in %s is empty: store the admin DSN in it", adminSecret, dir)
	}
	return admin, nil
}
