// Package pgtest gives tests a real PostgreSQL: a fresh, migrated database per test, cloned from
// a template by pgtestdb (github.com/peterldowns/pgtestdb).
//
// Call [Main] from a package's TestMain. With TEST_DATABASE_URL set, the tests use that server
// (its user must be allowed to create roles and databases; a Unix-socket URL such as the
// README's postgres:///coupons?host=/var/run/postgresql is taken too, see [overTCP]); without
// it, Main starts a throwaway server with [localpg] for the test binary and removes it
// afterwards, so `go test ./...` needs nothing else than the PostgreSQL binaries. Main also runs
// the test binary in a TMPDIR of its own and fails it if its tests leave anything there.
// [MainShards] is Main for a package whose tests cannot call t.Parallel (they set the process's
// environment): each top-level test runs in a child process of its own, several at once, on the
// one server.
//
// Lock tests share one kit (wait.go): [HoldCampaign], a session holding a campaign's budget rows
// until released, [Hold.WaitBlocked] and [WaitBlockedBy], which wait until exactly n sessions
// queue behind one backend (found through pg_blocking_pids, never by a server-wide count), and
// [Eventually], the bounded poll every wait of a test goes through.
package pgtest

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", which pgtestdb opens
	"github.com/peterldowns/pgtestdb"

	"github.com/mops/coupon-api/internal/testkit/localpg"
	"github.com/mops/coupon-api/schema"
)

// serverURL is the server under test, set by Main.
var serverURL string

// testRole owns the test databases and runs their migrations, like the migration's user in
// production: not a superuser, but allowed to create roles (00008_roles.sql creates the group
// roles when missing), so that tests can also create login users in them ([LoginAs]).
var testRole = pgtestdb.Role{
	Username:     "coupon_test_owner",
	Password:     pgtestdb.DefaultRolePassword,
	Capabilities: "NOSUPERUSER NOCREATEDB CREATEROLE",
}

// Main runs the package's tests against TEST_DATABASE_URL or a throwaway server, then the
// after functions (such as proctest.RemoveBuilds), and exits. The test binary runs with a TMPDIR
// of its own, which its children inherit; what is left in it once the server is stopped and the
// after functions ran fails the run (exit 1), listed on stderr: tests remove what they write in
// $TMPDIR. The directory is removed either way.
//
// A fuzzing worker (a child that `go test -fuzz` starts with -test.fuzzworker, and stops with
// SIGINT, then SIGKILL, when it has not exited within 1 s) starts no server and makes no TMPDIR:
// it uses its coordinator's server ([workerServerEnv]) and TMPDIR, whose own Main checks what was
// left. A worker stopped halfway through its own server's shutdown would leave the server running
// and its directory behind.
func Main(m *testing.M, after ...func()) { mainWith(m, false, after) }

// mainWith is [Main], or with sharded [MainShards].
func mainWith(m *testing.M, sharded bool, after []func()) {
	switch {
	case isFuzzWorker(os.Args[1:]):
		os.Exit(runWorker(m, after))
	case os.Getenv(shardEnv) != "":
		os.Exit(runShardChild(m))
	case isListing(os.Args[1:]): // -test.list needs no server
		os.Exit(m.Run())
	}
	tmp, restore, err := ownTMPDIR()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: a TMPDIR of the test binary's own: %v\n", err)
		os.Exit(1)
	}
	runDir = tmp
	if !flag.Parsed() {
		flag.Parse() // shardable and runShards read the test flags
	}
	code := run(m, after, sharded && shardable())
	restore()
	left, err := leftIn(tmp)
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "pgtest: list what the tests left in TMPDIR %s: %v\n", tmp, err)
		code = 1
	case left != "":
		fmt.Fprintf(os.Stderr, "pgtest: the tests left these in TMPDIR (%s), now removed; a test must remove what it writes there:\n%s", tmp, left)
		code = 1
	}
	_ = os.RemoveAll(tmp)
	os.Exit(code)
}

func run(m *testing.M, after []func(), sharded bool) int {
	for _, f := range after {
		defer f()
	}
	serverURL = os.Getenv("TEST_DATABASE_URL")
	if serverURL != "" {
		var done func()
		var err error
		if serverURL, done, err = overTCP(context.Background(), serverURL); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: TEST_DATABASE_URL: %v\n", err)
			return 1
		}
		defer done()
	}
	if serverURL == "" {
		srv, err := localpg.Start(context.Background(), localpg.Options{Settings: ServerSettings})
		if err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: no TEST_DATABASE_URL and no local server: %v\n", err)
			return 1
		}
		defer srv.Stop()
		serverURL = srv.URL()
	}
	if err := os.Setenv(workerServerEnv, serverURL); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %s: %v\n", workerServerEnv, err)
		return 1
	}
	if sharded {
		return runShards()
	}
	return m.Run()
}

// workerServerEnv carries the server under test from a test binary to the fuzzing workers it
// starts, which inherit its environment.
const workerServerEnv = "PGTEST_COORDINATOR_URL"

// isFuzzWorker reports whether args, a test binary's, make it a fuzzing worker: the flag
// -test.fuzzworker (or --test.fuzzworker, =true), which only `go test -fuzz` passes.
func isFuzzWorker(args []string) bool {
	for _, a := range args {
		switch strings.TrimLeft(a, "-") {
		case "test.fuzzworker", "test.fuzzworker=true":
			return strings.HasPrefix(a, "-")
		}
	}
	return false
}

// runWorker runs a fuzzing worker's tests against its coordinator's server, then the after
// functions.
func runWorker(m *testing.M, after []func()) int {
	for _, f := range after {
		defer f()
	}
	serverURL = os.Getenv(workerServerEnv)
	if serverURL == "" {
		fmt.Fprintf(os.Stderr, "pgtest: a fuzzing worker without %s: its coordinator did not run pgtest.Main\n", workerServerEnv)
		return 1
	}
	return m.Run()
}

// ServerSettings are the settings of the throwaway server [Main] starts, which a server named by
// TEST_DATABASE_URL must have too: track_commit_timestamp, so that a test can read when each row's
// transaction committed (pg_xact_commit_timestamp(xmin)) by the server's clock, as the herd test of
// releases does ([RequireCommitTimestamps]).
var ServerSettings = map[string]string{"track_commit_timestamp": "on"}

// RequireCommitTimestamps fails t unless the server of q records commit times
// (track_commit_timestamp, [ServerSettings]): a server named by TEST_DATABASE_URL may not.
func RequireCommitTimestamps(t testing.TB, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) {
	t.Helper()
	var on string
	if err := q.QueryRow(context.Background(), `SHOW track_commit_timestamp`).Scan(&on); err != nil {
		t.Fatal(err)
	}
	if on != "on" {
		t.Fatalf("pgtest: the server's track_commit_timestamp is %s: this test reads commit times; "+
			"start the server of TEST_DATABASE_URL with track_commit_timestamp = on (pgtest.ServerSettings)", on)
	}
}

// URL returns a connection URL for a new migrated database of its own, dropped when t ends
// (kept if t fails, for inspection).
func URL(t testing.TB) string {
	t.Helper()
	return newDB(t, migrator{})
}

// EmptyURL returns a connection URL for a new empty database of its own (no migration applied),
// dropped when t ends: the start of the legacy-migration tests.
func EmptyURL(t testing.TB) string {
	t.Helper()
	return newDB(t, pgtestdb.NoopMigrator{})
}

func newDB(t testing.TB, m pgtestdb.Migrator) string {
	t.Helper()
	if serverURL == "" {
		t.Fatal("pgtest: call pgtest.Main from TestMain")
	}
	cc, err := pgx.ParseConfig(serverURL)
	if err != nil {
		t.Fatalf("pgtest: parse server URL: %v", err)
	}
	conf := pgtestdb.Custom(t, pgtestdb.Config{
		DriverName: "pgx",
		Host:       cc.Host,
		Port:       strconv.Itoa(int(cc.Port)),
		User:       cc.User,
		Password:   cc.Password,
		Database:   cc.Database,
		Options:    "sslmode=disable",
		TestRole:   &testRole,
	}, m)
	return conf.URL()
}

// Pool returns a pool of at most maxConns connections on a new migrated database (see [URL]),
// closed when t ends.
func Pool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return PoolAt(t, URL(t), maxConns)
}

// PoolAt returns a pool of at most maxConns connections to databaseURL (a [URL], or a
// [LoginAs] user's), closed when t ends.
func PoolAt(t testing.TB, databaseURL string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatalf("pgtest: pool config: %v", err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// migrator applies the project's goose migrations to pgtestdb's template database.
type migrator struct{}

func (migrator) Hash() (string, error) { return schema.Hash() }

func (migrator) Migrate(ctx context.Context, db *sql.DB, _ pgtestdb.Config) error {
	_, err := schema.Migrate(ctx, db)
	return err
}

// loginPassword is the password of every login user [LoginAs] creates.
const loginPassword = "coupon-test-login"

// LoginAs creates a login user that is a member of the group role group (coupon_issue,
// coupon_relay or coupon_admin, 00008_roles.sql) and nothing else, as a deploy script grants a
// runtime user, and returns databaseURL (from [URL]) connecting as that user. The user is
// dropped when t ends.
func LoginAs(t testing.TB, databaseURL, group string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	user := fmt.Sprintf("%s_%s", group, strings.ReplaceAll(uuid.NewString(), "-", "")[:12])
	name := pgx.Identifier{user}.Sanitize()
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s' IN ROLE %s`,
		name, loginPassword, pgx.Identifier{group}.Sanitize())); err != nil {
		t.Fatalf("pgtest: create login user in %s: %v", group, err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, databaseURL)
		if err != nil {
			t.Errorf("pgtest: drop %s: %v", user, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP ROLE `+name); err != nil {
			t.Errorf("pgtest: drop %s: %v", user, err)
		}
	})
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", databaseURL, err)
	}
	u.User = url.UserPassword(user, loginPassword)
	return u.String()
}

// socketAdmin names the role [overTCP] makes for one test binary's run on a server reached over
// its Unix socket: a superuser, as the throwaway server's "postgres" is, with a password login,
// so that it and the tests' own roles may connect over TCP. Test binaries run side by side, so
// each has a role of its own (the name ends in a random suffix), dropped when it ends.
const socketAdmin = "coupon_test_admin_"

// overTCP returns serverURL, or for a URL that reaches the server over its Unix socket (a host
// that is a directory), a URL of the same server over TCP on 127.0.0.1 at the socket's port,
// with a function that undoes what it made. The tests log in as roles of their own with
// passwords (pgtestdb's template owner, [LoginAs]'s users), which a socket's peer authentication
// refuses (it lets an OS user in only as the database user of the same name). So overTCP logs
// in over the socket, as the URL says (a superuser, as the README makes the OS user), makes a
// socketAdmin role (SUPERUSER LOGIN, a random password) and the tests' own testRole, and
// returns a URL for its socketAdmin over TCP, where the server must listen (Debian's default:
// listen_addresses = 'localhost', with password authentication). done drops the socketAdmin.
func overTCP(ctx context.Context, serverURL string) (tcpURL string, done func(), err error) {
	cc, err := pgx.ParseConfig(serverURL)
	if err != nil {
		return "", nil, err
	}
	if !strings.HasPrefix(cc.Host, "/") {
		return serverURL, func() {}, nil
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return "", nil, fmt.Errorf("over the socket %s: %w", cc.Host, err)
	}
	defer conn.Close(ctx)
	random := strings.ReplaceAll(uuid.NewString(), "-", "")
	admin, password := socketAdmin+random[:12], random[12:]
	// testRole too, as pgtestdb would make it: a run stopped halfway through making it leaves
	// a role that pgtestdb, finding it, would not finish.
	for _, r := range []struct{ name, settings string }{
		{admin, "SUPERUSER LOGIN PASSWORD " + quoteLiteral(password)},
		{testRole.Username, "LOGIN PASSWORD " + quoteLiteral(testRole.Password) + " " + testRole.Capabilities},
	} {
		if _, err := conn.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = %[1]s) THEN CREATE ROLE %[2]s; END IF;
END $$;
ALTER ROLE %[2]s %[3]s`, quoteLiteral(r.name), pgx.Identifier{r.name}.Sanitize(), r.settings)); err != nil {
			return "", nil, fmt.Errorf("making role %s (the socket's user must be a superuser): %w", r.name, err)
		}
	}
	u := &url.URL{Scheme: "postgres", User: url.UserPassword(admin, password),
		Host: fmt.Sprintf("127.0.0.1:%d", cc.Port), Path: "/" + cc.Database, RawQuery: "sslmode=disable"}
	return u.String(), func() { dropRole(cc, admin) }, nil
}

// dropRole ends the sessions of role and drops it, over the connection cc describes.
func dropRole(cc *pgx.ConnConfig, role string) {
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: drop role %s: %v\n", role, err)
		return
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE usename = $1`, role)
	if err == nil {
		_, err = conn.Exec(ctx, `DROP ROLE `+pgx.Identifier{role}.Sanitize())
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: drop role %s: %v\n", role, err)
	}
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
