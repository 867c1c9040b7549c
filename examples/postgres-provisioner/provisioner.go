package main

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/provision"
	"github.com/meshnode/meshnode/sdk"
)

// iface is the one interface this provisioner provides (its seat's provides:).
const iface = "postgres"

// namePrefix begins the name of every database and role the provisioner makes: mesh_app_a
// for the consumer app-a. Module names are [a-z0-9-], so the name maps back to one consumer.
const namePrefix = "mesh_"

// maxIdentifier is PostgreSQL's longest identifier (NAMEDATALEN-1) in bytes. It truncates a
// longer one silently, and two long consumers would then share a database: refuse them.
const maxIdentifier = 63

// markPrefix begins the comment on every database and role the provisioner makes, followed
// by the consumer: holds lists, and remove drops, only what carries it — never a database an
// operator made by hand whose name happens to begin with mesh_.
const markPrefix = "meshnode consumer "

// Passwords: random bytes, in hex so that they are safe in a SQL literal and a URL.
const passwordBytes = 32

// SCRAM-SHA-256 verifiers as PostgreSQL makes them (scram_iterations' default).
const (
	scramIterations = 4096
	scramSaltBytes  = 16
)

// opTimeout bounds one tool call: the sdk answers a seat's calls one at a time, and a
// server that does not answer must not stall the ones behind it.
const opTimeout = 30 * time.Second

// provisioner makes, for each consumer, a PostgreSQL database and a role that owns it and
// alone may connect to it, through an admin connection: a superuser, or a role with
// CREATEROLE and CREATEDB.
type provisioner struct {
	admin string // the admin DSN
	// host and port are where consumers reach the server: the admin DSN's.
	host string
	port uint16
	log  *slog.Logger
}

// newProvisioner checks the admin DSN; it does not connect (the server may come up later:
// each call connects).
func newProvisioner(admin string, log *slog.Logger) (*provisioner, error) {
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		return nil, fmt.Errorf("admin DSN: %w", err) // pgx leaves the password out
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return nil, fmt.Errorf("the admin DSN reaches the server through the unix socket %s, and consumers need its TCP address: give the admin DSN as postgres://USER:PASSWORD@HOST:PORT/postgres", cfg.Host)
	}
	return &provisioner{admin: admin, host: cfg.Host, port: cfg.Port, log: log}, nil
}

// handlers are the seat's tools: each decodes its JSON request, calls the provisioner and
// encodes its reply; an error goes back to the caller as a tool error.
func (p *provisioner) handlers() map[string]sdk.ToolHandler {
	return map[string]sdk.ToolHandler{
		api.ProvisionToolCreate: tool(p.create),
		api.ProvisionToolRemove: tool(p.remove),
		api.ProvisionToolHolds:  tool(p.holds),
	}
}

// tool adapts a provisioner method to a ToolHandler, bounding the call by opTimeout.
func tool[Req, Reply any](f func(context.Context, Req) (Reply, error)) sdk.ToolHandler {
	return func(ctx context.Context, r sdk.Request) ([]byte, error) {
		var req Req
		if err := json.Unmarshal(r.Data, &req); err != nil {
			return nil, fmt.Errorf("decode the request: %w", err)
		}
		ctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		reply, err := f(ctx, req)
		if err != nil {
			return nil, err
		}
		return json.Marshal(reply)
	}
}

// create makes the consumer's role and database, or gives the role a new password if they
// exist, and answers the credential sealed to the request's xkey. The password is in the
// sealed reply and nowhere else: the server is sent only its SCRAM verifier, so not even a
// server that logs statements sees it.
func (p *provisioner) create(ctx context.Context, req api.ProvisionCreateRequest) (api.ProvisionCreateReply, error) {
	if err := checkRequest(req.Consumer, req.Interface); err != nil {
		return api.ProvisionCreateReply{}, err
	}
	limit, err := connectionLimit(req.Options)
	if err != nil {
		return api.ProvisionCreateReply{}, err
	}
	conn, err := p.connect(ctx)
	if err != nil {
		return api.ProvisionCreateReply{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	name := resourceName(req.Consumer)
	role, err := roleState(ctx, conn, name, req.Consumer)
	if err != nil {
		return api.ProvisionCreateReply{}, err
	}
	db, err := databaseState(ctx, conn, name, req.Consumer)
	if err != nil {
		return api.ProvisionCreateReply{}, err
	}
	if role == foreign || db == foreign {
		return api.ProvisionCreateReply{}, fmt.Errorf("a role or database %s exists that this provisioner did not make for %s; it leaves it alone: drop or rename it by hand, then create again", name, req.Consumer)
	}
	b := make([]byte, passwordBytes)
	rand.Read(b) // never fails: it crashes the program instead
	password := hex.EncodeToString(b)
	verifier, err := scramVerifier(password)
	if err != nil {
		return api.ProvisionCreateReply{}, err
	}
	if err := ensureRole(ctx, conn, name, req.Consumer, verifier, limit, role == missing); err != nil {
		return api.ProvisionCreateReply{}, err
	}
	if err := ensureDatabase(ctx, conn, name, req.Consumer, db == missing); err != nil {
		return api.ProvisionCreateReply{}, err
	}
	port := strconv.Itoa(int(p.port))
	u := url.URL{Scheme: "postgres", User: url.UserPassword(name, password), Host: net.JoinHostPort(p.host, port),
		Path: "/" + name, RawQuery: "sslmode=disable"}
	reply, err := provision.Seal(api.Provisioned{Env: map[string]string{
		"POSTGRES_URL":      u.String(),
		"POSTGRES_HOST":     p.host,
		"POSTGRES_PORT":     port,
		"POSTGRES_DATABASE": name,
		"POSTGRES_USER":     name,
		"POSTGRES_PASSWORD": password,
	}}, req)
	if err != nil {
		return api.ProvisionCreateReply{}, fmt.Errorf("seal the credential of %s: %w", req.Consumer, err)
	}
	p.log.Info("provisioned", "consumer", req.Consumer, "database", name, "new", db == missing)
	return reply, nil
}

// remove drops the consumer's database — closing its connections — and its role. What does
// not exist, or was not made by this provisioner, is left alone without an error: the
// provisioner holds nothing for the consumer then.
func (p *provisioner) remove(ctx context.Context, req api.ProvisionRemoveRequest) (struct{}, error) {
	if err := checkRequest(req.Consumer, req.Interface); err != nil {
		return struct{}{}, err
	}
	conn, err := p.connect(ctx)
	if err != nil {
		return struct{}{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	name := resourceName(req.Consumer)
	ident := pgx.Identifier{name}.Sanitize()
	db, err := databaseState(ctx, conn, name, req.Consumer)
	if err != nil {
		return struct{}{}, err
	}
	switch db {
	case ours:
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			return struct{}{}, fmt.Errorf("drop the database of %s: %w", req.Consumer, err)
		}
	case foreign:
		p.log.Warn("not dropping a database this provisioner did not make", "consumer", req.Consumer, "database", name)
	}
	role, err := roleState(ctx, conn, name, req.Consumer)
	if err != nil {
		return struct{}{}, err
	}
	switch role {
	case ours:
		if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+ident); err != nil {
			return struct{}{}, fmt.Errorf("drop the role of %s: %w", req.Consumer, err)
		}
	case foreign:
		p.log.Warn("not dropping a role this provisioner did not make", "consumer", req.Consumer, "role", name)
	}
	if db == ours || role == ours {
		p.log.Info("removed", "consumer", req.Consumer, "database", name)
	}
	return struct{}{}, nil
}

// holds lists, sorted, the consumers whose database exists and carries this provisioner's
// mark. A request without an interface means postgres, the only one the seat provides.
func (p *provisioner) holds(ctx context.Context, req api.ProvisionHoldsRequest) (api.ProvisionHoldsReply, error) {
	if req.Interface != "" && req.Interface != iface {
		return api.ProvisionHoldsReply{}, fmt.Errorf("this provisioner provides %s, not %q", iface, req.Interface)
	}
	conn, err := p.connect(ctx)
	if err != nil {
		return api.ProvisionHoldsReply{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, _ := conn.Query(ctx, `SELECT datname, coalesce(shobj_description(oid, 'pg_database'), '')
		FROM pg_database WHERE starts_with(datname, $1)`, namePrefix)
	type row struct{ Name, Comment string }
	dbs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return api.ProvisionHoldsReply{}, fmt.Errorf("list databases: %w", err)
	}
	consumers := []string{} // [] rather than null on the wire
	for _, db := range dbs {
		consumer, ok := strings.CutPrefix(db.Comment, markPrefix)
		if ok && provision.CheckRequest(consumer, iface) == nil && resourceName(consumer) == db.Name {
			consumers = append(consumers, consumer)
		}
	}
	slices.Sort(consumers)
	return api.ProvisionHoldsReply{Consumers: consumers}, nil
}

// checkRequest refuses a consumer or interface this provisioner cannot make a database of.
func checkRequest(consumer, requested string) error {
	if err := provision.CheckRequest(consumer, requested); err != nil {
		return err
	}
	if requested != iface {
		return fmt.Errorf("this provisioner provides %s, not %q", iface, requested)
	}
	if n := len(resourceName(consumer)); n > maxIdentifier {
		return fmt.Errorf("consumer %q is too long for a PostgreSQL name: %s would be %d bytes, PostgreSQL keeps %d; give the module a name of at most %d bytes",
			consumer, resourceName(consumer), n, maxIdentifier, maxIdentifier-len(namePrefix))
	}
	return nil
}

// resourceName is the name of the consumer's database and role.
func resourceName(consumer string) string {
	return namePrefix + strings.ReplaceAll(consumer, "-", "_")
}

// mark is the comment on the consumer's database and role, as a SQL literal: COMMENT takes
// no parameters, and a checked consumer name holds no quote.
func mark(consumer string) string { return "'" + markPrefix + consumer + "'" }

func (p *provisioner) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, p.admin)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres as the admin: %w; check the admin-url secret (or PG_ADMIN_URL) and that the server is up", err)
	}
	return conn, nil
}

// state is whether a database or role of a consumer's name exists, and who made it.
type state int

const (
	missing state = iota
	ours          // carries the consumer's mark
	foreign       // made by someone else: never altered, handed out or dropped
)

func roleState(ctx context.Context, conn *pgx.Conn, name, consumer string) (state, error) {
	var comment string
	err := conn.QueryRow(ctx, `SELECT coalesce(shobj_description(oid, 'pg_authid'), '') FROM pg_roles WHERE rolname = $1`, name).Scan(&comment)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return missing, nil
	case err != nil:
		return 0, fmt.Errorf("look up the role of %s: %w", consumer, err)
	case comment == markPrefix+consumer:
		return ours, nil
	}
	return foreign, nil
}

// databaseState is the state of the consumer's database. One without a comment that its
// role owns is ours too: a create that failed between CREATE DATABASE and COMMENT (which
// cannot share a transaction) made it.
func databaseState(ctx context.Context, conn *pgx.Conn, name, consumer string) (state, error) {
	var comment, owner string
	err := conn.QueryRow(ctx, `SELECT coalesce(shobj_description(d.oid, 'pg_database'), ''), r.rolname
		FROM pg_database d JOIN pg_roles r ON r.oid = d.datdba WHERE d.datname = $1`, name).Scan(&comment, &owner)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return missing, nil
	case err != nil:
		return 0, fmt.Errorf("look up the database of %s: %w", consumer, err)
	case comment == markPrefix+consumer, comment == "" && owner == name:
		return ours, nil
	}
	return foreign, nil
}

// connectionLimit reads the one option this provisioner takes: connection-limit, the most
// connections the consumer's role may hold at once (-1, the default, for no limit).
func connectionLimit(options map[string]string) (int, error) {
	limit := -1
	for key, value := range options {
		if key != "connection-limit" {
			return 0, fmt.Errorf("option %s is not one this provisioner knows: it takes connection-limit", key)
		}
		n, err := strconv.Atoi(value)
		if err != nil || n < -1 {
			return 0, fmt.Errorf("option connection-limit %q: want a number of connections, or -1 for no limit", value)
		}
		limit = n
	}
	return limit, nil
}

// ensureRole creates the consumer's role, or sets a new password on it, and marks it, in one
// transaction: a role without its mark would be refused from then on. The admin is made a
// member so that a non-superuser admin may create and drop the role's database.
func ensureRole(ctx context.Context, conn *pgx.Conn, name, consumer, verifier string, limit int, create bool) error {
	ident := pgx.Identifier{name}.Sanitize()
	with := " WITH LOGIN CONNECTION LIMIT " + strconv.Itoa(limit) + " PASSWORD '" + verifier + "'"
	stmt := "ALTER ROLE " + ident + with
	if create {
		stmt = "CREATE ROLE " + ident + with
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, s := range []string{stmt, "COMMENT ON ROLE " + ident + " IS " + mark(consumer), "GRANT " + ident + " TO CURRENT_USER"} {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("make the role of %s: %w", consumer, err)
	}
	return nil
}

// ensureDatabase creates the consumer's database, owned by its role, if missing, and (again,
// each time: a create repairs what a failed one left) marks it and lets only the role
// connect.
func ensureDatabase(ctx context.Context, conn *pgx.Conn, name, consumer string, create bool) error {
	ident := pgx.Identifier{name}.Sanitize()
	var stmts []string
	if create {
		stmts = append(stmts, "CREATE DATABASE "+ident+" OWNER "+ident)
	}
	stmts = append(stmts,
		"COMMENT ON DATABASE "+ident+" IS "+mark(consumer),
		"REVOKE CONNECT ON DATABASE "+ident+" FROM PUBLIC",
		"GRANT CONNECT ON DATABASE "+ident+" TO "+ident)
	for _, s := range stmts { // one by one: CREATE DATABASE refuses to run in a transaction
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("make the database of %s: %w", consumer, err)
		}
	}
	return nil
}

// scramVerifier is what PostgreSQL stores for password under SCRAM-SHA-256 (RFC 5802, as
// its own client libraries compute it): CREATE and ALTER ROLE take it in place of the
// password, which then never reaches the server.
func scramVerifier(password string) (string, error) {
	salt := make([]byte, scramSaltBytes)
	rand.Read(salt) // never fails: it crashes the program instead
	// A hex password needs no SASLprep: it is ASCII without spaces.
	salted, err := pbkdf2.Key(sha256.New, password, salt, scramIterations, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("derive the password's verifier: %w", err)
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", scramIterations, b64(salt), b64(storedKey[:]), b64(serverKey)), nil
}

func hmacSHA256(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}
