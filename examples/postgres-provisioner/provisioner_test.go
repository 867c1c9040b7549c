package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/internal/testbed"
	"github.com/meshnode/meshnode/manifest"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nkeys"
)

// SQLSTATEs the tests expect, by PostgreSQL's names.
const (
	codeInsufficientPrivilege = "42501" // insufficient_privilege: CONNECT not granted
	codeInvalidPassword       = "28P01" // invalid_password
)

// bed is a provisioner on a throwaway server, with what it logged.
type bed struct {
	pg  *testbed.PG
	p   *provisioner
	log *bytes.Buffer
}

func newBed(t *testing.T) *bed {
	t.Helper()
	pg := testbed.Postgres(t)
	var log bytes.Buffer
	p, err := newProvisioner(pg.URL, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return &bed{pg: pg, p: p, log: &log}
}

// call calls tool as the seat's caller would: JSON in, JSON out.
func call(t *testing.T, p *provisioner, tool string, req any) ([]byte, error) {
	t.Helper()
	data, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return p.handlers()[tool](t.Context(), sdk.Request{Subject: tool, Data: data})
}

// create asks for consumer's credential, sealed to a fresh xkey as the vault's, and opens it.
func create(t *testing.T, p *provisioner, consumer string) api.Provisioned {
	t.Helper()
	return createWith(t, p, consumer, nil)
}

// createWith is create with the requirement's options.
func createWith(t *testing.T, p *provisioner, consumer string, options map[string]string) api.Provisioned {
	t.Helper()
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	xkey, _ := kp.PublicKey()
	out, err := call(t, p, api.ProvisionToolCreate, api.ProvisionCreateRequest{Consumer: consumer, Interface: "postgres", XKey: xkey, Options: options})
	if err != nil {
		t.Fatalf("create %s: %v", consumer, err)
	}
	var reply api.ProvisionCreateReply
	if err := json.Unmarshal(out, &reply); err != nil {
		t.Fatalf("create %s answered %q: %v", consumer, out, err)
	}
	opened, err := vault.Unseal(kp, reply.Sender, reply.Sealed)
	if err != nil {
		t.Fatalf("create %s: %v", consumer, err)
	}
	var cred api.Provisioned
	if err := json.Unmarshal(opened, &cred); err != nil {
		t.Fatal(err)
	}
	return cred
}

func remove(t *testing.T, p *provisioner, consumer string) {
	t.Helper()
	out, err := call(t, p, api.ProvisionToolRemove, api.ProvisionRemoveRequest{Consumer: consumer, Interface: "postgres"})
	if err != nil {
		t.Fatalf("remove %s: %v", consumer, err)
	}
	if got, want := string(out), "{}"; got != want {
		t.Fatalf("remove %s answered %s, want %s", consumer, got, want)
	}
}

func holds(t *testing.T, p *provisioner) []string {
	t.Helper()
	out, err := call(t, p, api.ProvisionToolHolds, api.ProvisionHoldsRequest{Interface: "postgres"})
	if err != nil {
		t.Fatalf("holds: %v", err)
	}
	var reply api.ProvisionHoldsReply
	if err := json.Unmarshal(out, &reply); err != nil {
		t.Fatalf("holds answered %q: %v", out, err)
	}
	return reply.Consumers
}

// connect logs in with dsn, or returns the server's refusal.
func connect(t *testing.T, dsn string) (*pgx.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn, nil
}

func mustConnect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := connect(t, dsn)
	if err != nil {
		t.Fatalf("connect as %s: %v", redacted(dsn), err)
	}
	return conn
}

// refused asserts that logging in with dsn fails with SQLSTATE code.
func refused(t *testing.T, dsn, code string) {
	t.Helper()
	_, err := connect(t, dsn)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != code {
		t.Fatalf("connect as %s: %v, want the server's refusal %s", redacted(dsn), err, code)
	}
}

// withDatabase is dsn naming database instead.
func withDatabase(t *testing.T, dsn, database string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + database
	return u.String()
}

func redacted(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(a DSN)"
	}
	return u.Redacted()
}

func exists(t *testing.T, conn *pgx.Conn, query, name string) bool {
	t.Helper()
	var ok bool
	if err := conn.QueryRow(t.Context(), "SELECT EXISTS ("+query+")", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func databaseExists(t *testing.T, conn *pgx.Conn, name string) bool {
	t.Helper()
	return exists(t, conn, "SELECT 1 FROM pg_database WHERE datname = $1", name)
}

func roleExists(t *testing.T, conn *pgx.Conn, name string) bool {
	t.Helper()
	return exists(t, conn, "SELECT 1 FROM pg_roles WHERE rolname = $1", name)
}

func TestProvisioner_Create(t *testing.T) {
	b := newBed(t)
	a, other := create(t, b.p, "app-a"), create(t, b.p, "app-b")

	t.Run("credential", func(t *testing.T) {
		want := map[string]string{
			"POSTGRES_HOST":     b.pg.Host,
			"POSTGRES_PORT":     strconv.Itoa(b.pg.Port),
			"POSTGRES_DATABASE": "mesh_app_a",
			"POSTGRES_USER":     "mesh_app_a",
		}
		for k, v := range want {
			if got := a.Env[k]; got != v {
				t.Errorf("%s=%q, want %q", k, got, v)
			}
		}
		if got, want := slices.Sorted(maps.Keys(a.Env)), []string{"POSTGRES_DATABASE", "POSTGRES_HOST", "POSTGRES_PASSWORD",
			"POSTGRES_PORT", "POSTGRES_URL", "POSTGRES_USER"}; !slices.Equal(got, want) {
			t.Errorf("variables %v, want %v", got, want)
		}
		if pw := a.Env["POSTGRES_PASSWORD"]; len(pw) != 2*passwordBytes || pw == other.Env["POSTGRES_PASSWORD"] {
			t.Errorf("password %d bytes, the same as app-b's: %v; want %d random hex digits each", len(pw), pw == other.Env["POSTGRES_PASSWORD"], 2*passwordBytes)
		}
		if strings.Contains(b.log.String(), a.Env["POSTGRES_PASSWORD"]) {
			t.Errorf("the provisioner logged app-a's password:\n%s", b.log)
		}
	})

	t.Run("own database", func(t *testing.T) {
		conn := mustConnect(t, a.Env["POSTGRES_URL"])
		if _, err := conn.Exec(t.Context(), "CREATE TABLE notes (body text); INSERT INTO notes VALUES ('hello')"); err != nil {
			t.Fatalf("app-a creates a table in its database: %v", err)
		}
		var db string
		if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&db); err != nil || db != "mesh_app_a" {
			t.Fatalf("app-a is in database %q (%v), want mesh_app_a", db, err)
		}
	})

	t.Run("not another's", func(t *testing.T) {
		mustConnect(t, other.Env["POSTGRES_URL"]) // app-b can: the refusal below is about app-a
		refused(t, withDatabase(t, a.Env["POSTGRES_URL"], "mesh_app_b"), codeInsufficientPrivilege)
	})

	t.Run("again, new password", func(t *testing.T) {
		again := create(t, b.p, "app-a")
		if again.Env["POSTGRES_PASSWORD"] == a.Env["POSTGRES_PASSWORD"] {
			t.Fatal("a second create answered the same password")
		}
		refused(t, a.Env["POSTGRES_URL"], codeInvalidPassword)
		conn := mustConnect(t, again.Env["POSTGRES_URL"])
		var body string
		if err := conn.QueryRow(t.Context(), "SELECT body FROM notes").Scan(&body); err != nil || body != "hello" {
			t.Fatalf("app-a's table after a second create: %q, %v; want its row kept", body, err)
		}
	})
}

func TestProvisioner_Holds(t *testing.T) {
	b := newBed(t)
	if got := holds(t, b.p); len(got) != 0 {
		t.Fatalf("holds %v on a fresh server, want none", got)
	}
	create(t, b.p, "app-b")
	create(t, b.p, "app-a")
	admin := b.pg.Connect("")
	// Made by hand, one named as the provisioner would name app-c's: neither is listed.
	for _, db := range []string{"shop", "mesh_app_c"} {
		if _, err := admin.Exec(t.Context(), "CREATE DATABASE "+db); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := holds(t, b.p), []string{"app-a", "app-b"}; !slices.Equal(got, want) {
		t.Fatalf("holds %v, want %v", got, want)
	}
}

func TestProvisioner_Remove(t *testing.T) {
	b := newBed(t)
	a := create(t, b.p, "app-a")
	create(t, b.p, "app-b")
	conn := mustConnect(t, a.Env["POSTGRES_URL"]) // a connection remove has to close

	remove(t, b.p, "app-a")
	if got, want := holds(t, b.p), []string{"app-b"}; !slices.Equal(got, want) {
		t.Fatalf("holds %v after removing app-a, want %v", got, want)
	}
	admin := b.pg.Connect("")
	if databaseExists(t, admin, "mesh_app_a") || roleExists(t, admin, "mesh_app_a") {
		t.Fatal("app-a's database or role is left after remove")
	}
	if !databaseExists(t, admin, "mesh_app_b") || !roleExists(t, admin, "mesh_app_b") {
		t.Fatal("removing app-a dropped app-b's database or role")
	}
	if err := conn.Ping(t.Context()); err == nil {
		t.Fatal("app-a's open connection survived remove")
	}
	remove(t, b.p, "app-a") // gone already: not an error
	remove(t, b.p, "never-made")
}

// TestProvisioner_Options: connection-limit sets the role's limit, a create with other options
// changes it, and an unknown option or a bad number is refused, saying what it takes.
func TestProvisioner_Options(t *testing.T) {
	b := newBed(t)
	admin := b.pg.Connect("")
	limit := func() int {
		var n int
		if err := admin.QueryRow(t.Context(), "SELECT rolconnlimit FROM pg_roles WHERE rolname = 'mesh_app_a'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	createWith(t, b.p, "app-a", map[string]string{"connection-limit": "3"})
	if n := limit(); n != 3 {
		t.Fatalf("connection limit %d, want 3", n)
	}
	createWith(t, b.p, "app-a", nil)
	if n := limit(); n != -1 {
		t.Fatalf("connection limit %d after a create without options, want -1 (none)", n)
	}
	kp, _ := nkeys.CreateCurveKeys()
	xkey, _ := kp.PublicKey()
	for options, want := range map[string]string{"size": "takes connection-limit", "connection-limit=many": "want a number"} {
		key, value, _ := strings.Cut(options, "=")
		_, err := call(t, b.p, api.ProvisionToolCreate, api.ProvisionCreateRequest{Consumer: "app-b", Interface: "postgres", XKey: xkey, Options: map[string]string{key: value}})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("create with %s: %v, want a refusal saying %q", options, err, want)
		}
	}
}

func TestProvisioner_Refuses(t *testing.T) {
	b := newBed(t)
	kp, _ := nkeys.CreateCurveKeys()
	xkey, _ := kp.PublicKey()
	admin := b.pg.Connect("")

	t.Run("bad consumer", func(t *testing.T) {
		for _, consumer := range []string{"Bad;drop", "", "app_a", strings.Repeat("a", maxIdentifier)} {
			if _, err := call(t, b.p, api.ProvisionToolCreate, api.ProvisionCreateRequest{Consumer: consumer, Interface: "postgres", XKey: xkey}); err == nil {
				t.Errorf("create %q succeeded, want it refused", consumer)
			}
			if _, err := call(t, b.p, api.ProvisionToolRemove, api.ProvisionRemoveRequest{Consumer: consumer, Interface: "postgres"}); err == nil {
				t.Errorf("remove %q succeeded, want it refused", consumer)
			}
		}
		if got := holds(t, b.p); len(got) != 0 {
			t.Fatalf("holds %v after refused creates, want none", got)
		}
	})

	t.Run("another interface", func(t *testing.T) {
		if _, err := call(t, b.p, api.ProvisionToolCreate, api.ProvisionCreateRequest{Consumer: "app-a", Interface: "mysql", XKey: xkey}); err == nil {
			t.Error("create of interface mysql succeeded, want it refused")
		}
		if _, err := call(t, b.p, api.ProvisionToolHolds, api.ProvisionHoldsRequest{Interface: "mysql"}); err == nil {
			t.Error("holds of interface mysql succeeded, want it refused")
		}
	})

	t.Run("not json", func(t *testing.T) {
		if _, err := b.p.handlers()[api.ProvisionToolCreate](t.Context(), sdk.Request{Data: []byte("consumer=app-a")}); err == nil {
			t.Error("create of a request that is not JSON succeeded")
		}
	})

	// A role an operator made, named as the provisioner would name a consumer's: create
	// must not hand out its password, nor remove drop it.
	t.Run("foreign role", func(t *testing.T) {
		if _, err := admin.Exec(t.Context(), "CREATE ROLE mesh_ops LOGIN SUPERUSER PASSWORD 'operator'"); err != nil {
			t.Fatal(err)
		}
		if _, err := call(t, b.p, api.ProvisionToolCreate, api.ProvisionCreateRequest{Consumer: "ops", Interface: "postgres", XKey: xkey}); err == nil {
			t.Fatal("create of ops took over the role mesh_ops an operator made")
		}
		remove(t, b.p, "ops")
		if !roleExists(t, admin, "mesh_ops") {
			t.Fatal("remove of ops dropped the role mesh_ops an operator made")
		}
		mustConnect(t, "postgres://mesh_ops:operator@"+b.p.host+":"+strconv.Itoa(b.pg.Port)+"/postgres?sslmode=disable")
	})

	t.Run("foreign database", func(t *testing.T) {
		if _, err := admin.Exec(t.Context(), "CREATE DATABASE mesh_shop"); err != nil {
			t.Fatal(err)
		}
		if _, err := call(t, b.p, api.ProvisionToolCreate, api.ProvisionCreateRequest{Consumer: "shop", Interface: "postgres", XKey: xkey}); err == nil {
			t.Fatal("create of shop handed out the database mesh_shop an operator made")
		}
		remove(t, b.p, "shop")
		if !databaseExists(t, admin, "mesh_shop") {
			t.Fatal("remove of shop dropped the database mesh_shop an operator made")
		}
	})
}

// TestProvisioner_CreateRoleAdmin: an admin that is not a superuser — as on a managed
// server — but may create roles and databases is enough.
func TestProvisioner_CreateRoleAdmin(t *testing.T) {
	b := newBed(t)
	if _, err := b.pg.Connect("").Exec(t.Context(), "CREATE ROLE provisioner LOGIN CREATEROLE CREATEDB PASSWORD 'admin-pw'"); err != nil {
		t.Fatal(err)
	}
	p, err := newProvisioner(withUser(t, b.pg.URL, "provisioner", "admin-pw"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	a := create(t, p, "app-a")
	create(t, p, "app-a")
	refused(t, a.Env["POSTGRES_URL"], codeInvalidPassword) // the second create's password replaced it
	if got, want := holds(t, p), []string{"app-a"}; !slices.Equal(got, want) {
		t.Fatalf("holds %v, want %v", got, want)
	}
	remove(t, p, "app-a")
	if got := holds(t, p); len(got) != 0 {
		t.Fatalf("holds %v after remove, want none", got)
	}
}

func withUser(t *testing.T, dsn, user, password string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

func TestNewProvisioner_UnixSocket(t *testing.T) {
	if _, err := newProvisioner("postgres://postgres@/postgres?host=/var/run/postgresql", slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("an admin DSN through a unix socket was accepted: consumers could not reach the address it answers")
	}
}

func TestAdminURL(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(adminEnv, "")
	t.Setenv("MESH_SECRETS", dir)
	if _, err := adminURL(); err == nil {
		t.Fatal("adminURL without the secret succeeded")
	}
	if err := os.WriteFile(dir+"/"+adminSecret, []byte("postgres://from-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := adminURL(); err != nil || got != "postgres://from-secret" {
		t.Fatalf("adminURL()=%q, %v; want the secret's DSN without its newline", got, err)
	}
	t.Setenv(adminEnv, "postgres://from-env")
	if got, err := adminURL(); err != nil || got != "postgres://from-env" {
		t.Fatalf("adminURL()=%q, %v; want %s's DSN", got, err, adminEnv)
	}
}

// TestManifest: manifest.yaml is valid, is the one in the package doc, and declares the
// tools the provisioner serves.
func TestManifest(t *testing.T) {
	data, err := os.ReadFile("manifest.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Check(data, nil)
	if err != nil {
		t.Fatalf("manifest.yaml: %v", err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	var doc strings.Builder
	for line := range strings.Lines(strings.TrimSpace(string(data))) {
		doc.WriteString("//\t" + line)
	}
	if !strings.Contains(string(src), doc.String()) {
		t.Errorf("main.go's package doc does not hold manifest.yaml; want\n%s", doc.String())
	}
	seat, ok := m.Seat("postgres")
	if !ok {
		t.Fatal("manifest.yaml declares no seat postgres")
	}
	if got, want := slices.Sorted(slices.Values(seat.Serves)), slices.Sorted(maps.Keys((&provisioner{}).handlers())); !slices.Equal(got, want) {
		t.Errorf("seat postgres serves %v, the provisioner handles %v", got, want)
	}
	if !slices.Equal(seat.Provides, []string{iface}) {
		t.Errorf("seat postgres provides %v, want [%s]", seat.Provides, iface)
	}
}
