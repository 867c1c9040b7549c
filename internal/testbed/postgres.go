package testbed

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PG is a throwaway PostgreSQL server that Postgres started for one test: the superuser
// "postgres" logs in with Password over TCP on 127.0.0.1, and every role needs its password
// (scram-sha-256, for local and host connections alike), as on a real server.
type PG struct {
	// URL is the superuser's DSN:
	// postgres://postgres:PW@127.0.0.1:PORT/postgres?sslmode=disable.
	URL string
	// Host is the address the server listens on (127.0.0.1), Port its TCP port.
	Host string
	Port int
	// Password is the superuser's, random per server (hex, so it needs no escaping).
	Password string

	t testing.TB
}

// The server's timings.
const (
	pgStartTimeout = 60 * time.Second // initdb is done; this is the server accepting connections
	pgStopTimeout  = 10 * time.Second // after SIGINT (fast shutdown), before SIGKILL
)

// pgBinDirs are where the PostgreSQL 15 binaries are looked for after $PATH.
var pgBinDirs = []string{"/usr/local/bin", "/usr/lib/postgresql/15/bin"}

// Postgres starts a PostgreSQL server for t — its own cluster in a fresh directory, listening
// on 127.0.0.1 only — and stops it and removes its files when the test ends. Without the
// binaries (initdb, postgres) the bed skips (fails where CI says every bed must run).
//
// As root, initdb and postgres run as the user nobody: postgres refuses to run as root.
func Postgres(t testing.TB) *PG {
	t.Helper()
	initdb, postgres, err := pgBinaries()
	if err != nil {
		Skip(t, "PostgreSQL is not installed: %v", err)
	}
	cred, err := pgCredential()
	if err != nil {
		t.Fatal(err)
	}
	dir := pgDir(t, cred)
	password := randomHex(16)
	initCluster(t, initdb, dir, password, cred)

	host, portS, err := net.SplitHostPort(FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(portS)
	pg := &PG{Host: host, Port: port, Password: password, t: t}
	pg.URL = pg.dsn("postgres", password, "postgres")
	exited := startServer(t, postgres, dir, host, portS, cred)
	pg.waitReady(dir, exited)
	return pg
}

// Connect opens a superuser connection to database ("" is postgres), closed when the test
// ends: for a test's own assertions and set-up.
func (p *PG) Connect(database string) *pgx.Conn {
	p.t.Helper()
	if database == "" {
		database = "postgres"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.dsn("postgres", p.Password, database))
	if err != nil {
		p.t.Fatalf("connect to the test's postgres, database %s: %v", database, err)
	}
	p.t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// dsn is the URL of database on this server as user.
func (p *PG) dsn(user, password, database string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password),
		Host: net.JoinHostPort(p.Host, strconv.Itoa(p.Port)), Path: "/" + database, RawQuery: "sslmode=disable"}
	return u.String()
}

// pgBinaries finds initdb and the postgres beside it: the two must be of one version.
func pgBinaries() (initdb, postgres string, err error) {
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, dir := range append(dirs, pgBinDirs...) {
		initdb, postgres = filepath.Join(dir, "initdb"), filepath.Join(dir, "postgres")
		if isExecutable(initdb) && isExecutable(postgres) {
			return initdb, postgres, nil
		}
	}
	return "", "", fmt.Errorf("no initdb and postgres in $PATH or %v; install PostgreSQL 15 (apt-get install postgresql-15)", pgBinDirs)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// pgCredential is who runs initdb and postgres: nil (this process's user) unless it is root,
// which postgres refuses; then nobody.
func pgCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("postgres refuses to run as root, and there is no user nobody to run it as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user nobody's uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user nobody's gid %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// pgDir makes the server's directory — data, socket, password file, log — owned by whoever
// runs the server, and removes it when the test ends. Not t.TempDir: its parents are 0700
// root's, which nobody cannot reach.
func pgDir(t testing.TB, cred *syscall.Credential) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "meshnode-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if cred == nil {
		return dir
	}
	if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
		t.Fatal(err)
	}
	// A parent nobody cannot pass through fails initdb with a bare "permission denied":
	// say which one instead.
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			t.Fatalf("postgres runs as nobody here (the tests run as root), and nobody cannot pass through %s (mode %v) to %s: set TMPDIR to a directory every user can reach, such as /tmp",
				p, fi.Mode().Perm(), dir)
		}
		if p == filepath.Dir(p) {
			return dir
		}
	}
}

// initCluster runs initdb into dir/data: superuser postgres with password, every login by
// password (scram-sha-256), UTF8, no fsync.
func initCluster(t testing.TB, initdb, dir, password string, cred *syscall.Credential) {
	t.Helper()
	pwfile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		if err := os.Chown(pwfile, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(initdb, "--pgdata", filepath.Join(dir, "data"), "--username", "postgres",
		"--pwfile", pwfile, "--auth-host=scram-sha-256", "--auth-local=scram-sha-256",
		"--encoding", "UTF8", "--locale", "C", "--no-sync", "--no-instructions")
	cmd.Dir = dir // initdb changes back to its working directory, which nobody may not reach
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	os.Remove(pwfile) // initdb has read it; the password stays in this process
}

// startServer starts postgres on dir/data, its log in dir/postgres.log, and stops it when the
// test ends: SIGINT (fast shutdown: clients are disconnected), then SIGKILL to its process
// group if it is not gone in pgStopTimeout. Should the test binary die instead, the server
// shuts itself down once its data directory is removed (it checks its lock file every
// minute). The channel it returns is closed when the server exits.
func startServer(t testing.TB, postgres, dir, host, port string, cred *syscall.Credential) <-chan struct{} {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(postgres, "-D", filepath.Join(dir, "data"), "-p", port, "-k", dir,
		"-c", "listen_addresses="+host, "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start postgres: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
			return
		case <-time.After(pgStopTimeout):
		}
		t.Logf("postgres did not stop %v after SIGINT; killing it", pgStopTimeout)
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	return done
}

// waitReady polls until the server accepts the superuser's connection, and fails the test
// with the tail of the server's log if it exits or does not answer within pgStartTimeout.
func (p *PG) waitReady(dir string, exited <-chan struct{}) {
	p.t.Helper()
	deadline := time.Now().Add(pgStartTimeout)
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, p.URL)
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return
		}
		last = err
		select {
		case <-exited:
			p.t.Fatalf("postgres exited before accepting connections (%v); its log:\n%s", last, logTail(dir))
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("postgres did not accept connections within %v (%v); its log:\n%s", pgStartTimeout, last, logTail(dir))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logTail is the end of the server's log, for a failure message.
func logTail(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	const max = 4096
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails: it crashes the program instead
	return hex.EncodeToString(b)
}
