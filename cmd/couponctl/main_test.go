package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
)

// refusingServer listens like a PostgreSQL server (on a Unix socket in a temporary directory
// when unix, else on loopback TCP) and refuses every login with a FATAL error of code and
// message, as a server's authentication does. It returns the DATABASE_URL to reach it as user.
func refusingServer(t *testing.T, unix bool, user, password, code, message string) string {
	t.Helper()
	var l net.Listener
	var err error
	var dbURL string
	if unix {
		// Not t.TempDir: its path holds the test's name, and a socket's path must be short and
		// free of the commas that separate hosts in host=.
		dir, derr := os.MkdirTemp("", "pgsock")
		if derr != nil {
			t.Fatal(derr)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		l, err = net.Listen("unix", filepath.Join(dir, ".s.PGSQL.5432"))
		dbURL = "postgres:///coupons?host=" + dir + "&port=5432&user=" + url.QueryEscape(user)
	} else {
		l, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		u := &url.URL{Scheme: "postgres", User: url.User(user), Host: l.Addr().String(), Path: "/coupons", RawQuery: "sslmode=disable"}
		if password != "" {
			u.User = url.UserPassword(user, password)
		}
		dbURL = u.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := pgproto3.NewBackend(c, c)
				for {
					msg, err := b.ReceiveStartupMessage()
					if err != nil {
						return
					}
					switch msg.(type) {
					case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
						if _, err := c.Write([]byte("N")); err != nil {
							return
						}
						continue
					}
					break
				}
				b.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code, Message: message})
				_ = b.Flush()
			}()
		}
	}()
	return dbURL
}

// TestLoginRefusalHints: a login the server refuses is explained by what it refused, for every
// verb that connects (migrate connects through goose, the others through the start-up check):
// peer authentication names the OS user and the database user and how to make them match, never
// DB_PASS or IAM; a password refusal names DB_PASS and DATABASE_URL's password, never peer
// authentication; a missing role says to create it; IAM names DB_IAM_AUTH and the grants; a
// message it cannot read (another language) is not taken for any one kind.
func TestLoginRefusalHints(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	other := "postgres"
	if me.Username == other {
		other = "coupon"
	}
	for _, c := range []struct {
		name           string
		unix           bool
		user, password string
		code, message  string
		want, not      []string
	}{
		{"peer as README's root route did", true, other, "", "28000", `Peer authentication failed for user "` + other + `"`,
			[]string{"peer authentication", `OS user "` + me.Username + `"`, "createuser --superuser " + me.Username, "user="},
			[]string{"DB_PASS", "IAM"}},
		{"password refused", false, "coupon", "wrong", "28P01", `password authentication failed for user "coupon"`,
			[]string{"password authentication", "DB_PASS", "DATABASE_URL"},
			[]string{"peer", "Peer authentication failed for user \"coupon\": "}},
		{"no password sent", false, "coupon", "", "28P01", `password authentication failed for user "coupon"`,
			[]string{"password authentication", "none was sent", "DB_PASS"},
			[]string{"peer"}},
		{"role missing", true, me.Username, "", "28000", `role "` + me.Username + `" does not exist`,
			[]string{"no database user", "createuser --superuser " + me.Username},
			[]string{"DB_PASS", "IAM", "password"}},
		{"Cloud SQL IAM", false, "coupon-issue@p.iam", "", "28000", `Cloud SQL IAM service account authentication failed for user "coupon-issue@p.iam"`,
			[]string{"Cloud SQL IAM authentication", "DB_IAM_AUTH", "roles/cloudsql.instanceUser"},
			[]string{"DB_PASS", "peer"}},
		{"NOLOGIN group role", false, "coupon_issue", "", "28000", `role "coupon_issue" is not permitted to log in`,
			[]string{"may not log in", "docs/roles.md"},
			[]string{"DB_PASS", "peer"}},
		{"pg_hba.conf", false, "coupon", "", "28000", `no pg_hba.conf entry for host "127.0.0.1", user "coupon", database "coupons", no encryption`,
			[]string{"pg_hba.conf", "sslmode=require"},
			[]string{"DB_PASS", "peer authentication"}},
		{"a message in German", true, other, "", "28000", `Peer-Authentifizierung für Benutzer »` + other + `« fehlgeschlagen`,
			[]string{"SQLSTATE 28000", "Peer-Authentifizierung", "peer or ident", "password", "IAM"},
			[]string{"(peer authentication)", "(password authentication)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("DATABASE_URL", refusingServer(t, c.unix, c.user, c.password, c.code, c.message))
			for _, verb := range [][]string{{"migrate"}, {"campaign", "list"}, {"outbox", "status"}} {
				_, _, err := runCLI(t, verb...)
				if err == nil {
					t.Fatalf("%s: no error", verb)
				}
				msg := err.Error()
				for _, w := range c.want {
					if !strings.Contains(msg, w) {
						t.Errorf("%s: the error does not say %q:\n%s", verb, w, msg)
					}
				}
				for _, n := range c.not {
					if strings.Contains(msg, n) {
						t.Errorf("%s: the error says %q, which does not fit:\n%s", verb, n, msg)
					}
				}
				if !strings.Contains(msg, c.message) {
					t.Errorf("%s: the server's own message is lost:\n%s", verb, msg)
				}
				if strings.Count(msg, "database refused") > 1 {
					t.Errorf("%s: explained twice:\n%s", verb, msg)
				}
			}
		})
	}
}

// couponctlBin runs the couponctl binary with args and env (added to the test's environment)
// and returns its exit code, stdout and stderr.
func couponctlBin(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(proctest.Build(t, "."), args...)
	cmd.Env = proctest.Env(env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// TestUnknownVerbPrintsUsage: a command line couponctl does not understand (an unknown verb, at
// the top or under a group, an unknown flag, an extra argument) prints the error once and the
// usage of the verb it was given to, and exits non-zero; a verb that fails prints its error
// without the usage; no arguments print the help and exit 0.
func TestUnknownVerbPrintsUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"nonsense"}, []string{`unknown command "nonsense" for "couponctl"`, "Usage:\n  couponctl [flags]\n  couponctl [command]", "Available Commands:", "demo", "migrate"}},
		{[]string{"demp"}, []string{`unknown command "demp"`, "did you mean demo?", "Available Commands:"}},
		{[]string{"campaign", "nonsense"}, []string{`unknown command "nonsense" for "couponctl campaign"`, "Usage:\n  couponctl campaign", "create"}},
		{[]string{"demo", "--bogus"}, []string{"unknown flag: --bogus", "Usage:\n  couponctl demo [flags]", "--members"}},
		{[]string{"demo", "extra"}, []string{`unknown command "extra" for "couponctl demo"`, "Usage:\n  couponctl demo [flags]"}},
		{[]string{"sim", "--runs", "many"}, []string{`invalid argument "many" for "--runs"`, "Usage:\n  couponctl sim [flags]"}},
	} {
		code, stdout, stderr := couponctlBin(t, []string{"DATABASE_URL="}, c.args...)
		if code == 0 {
			t.Errorf("%q: exit 0, want non-zero", c.args)
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%q: stderr does not say %q:\n%s", c.args, w, stderr)
			}
		}
		if n := strings.Count(stderr, "couponctl: "); n != 1 {
			t.Errorf("%q: %d error lines, want one:\n%s", c.args, n, stderr)
		}
		if stdout != "" {
			t.Errorf("%q: stdout %q, want the error and usage on stderr only", c.args, stdout)
		}
	}

	code, _, stderr := couponctlBin(t, []string{"DATABASE_URL="}, "migrate")
	if code != 1 || !strings.Contains(stderr, "couponctl: db: set DATABASE_URL") || strings.Contains(stderr, "Usage:") {
		t.Errorf("a verb that fails: exit %d, stderr %q; want 1 and its error without the usage", code, stderr)
	}
	code, stdout, _ := couponctlBin(t, nil)
	if code != 0 || !strings.Contains(stdout, "Available Commands:") {
		t.Errorf("no arguments: exit %d, stdout %q; want the help and 0", code, stdout)
	}
}

// TestExitCodes: every verb exits 0 when it did its work, 1 when it failed (one "couponctl: "
// line on stderr) or found something wrong (its report says what), and 2 when its command line
// is not understood or a flag value is refused (one "couponctl: " line and the verb's usage).
func TestExitCodes(t *testing.T) {
	dbURL := pgtest.URL(t)
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := campaign.Create(context.Background(), conn, campaign.Campaign{ID: "DRIFT", DiscountYen: 1000, BudgetYen: 10_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), `UPDATE campaign_budgets SET issued_yen = 3000 WHERE campaign_id = 'DRIFT'`); err != nil {
		t.Fatal(err)
	}
	longAgo, past := time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
	if err := campaign.Create(context.Background(), conn, campaign.Campaign{ID: "ENDED", DiscountYen: 1000, BudgetYen: 10_000,
		StartsAt: &longAgo, EndsAt: &past}); err != nil {
		t.Fatal(err)
	}
	db := []string{"DATABASE_URL=" + dbURL}
	// resume of an ended campaign is refused, naming campaign update --ends (before: "resume changed").
	if code, stdout, stderr := couponctlBin(t, db, "campaign", "resume", "ENDED", "--reason", "r"); code != 1 ||
		!strings.Contains(stderr, "couponctl campaign update ENDED --ends T") {
		t.Errorf("resume of an ended campaign: exit %d, want 1 naming campaign update --ends\n%s%s", code, stdout, stderr)
	}
	for _, c := range []struct {
		env  []string
		args []string
		code int
	}{
		{nil, []string{"--help"}, 0},
		{nil, []string{"outbox", "requeue", "--help"}, 0},
		{db, []string{"campaign", "list"}, 0},
		{db, []string{"reconcile"}, 1},                                 // a finding: the drifted counter, in the report
		{[]string{"DATABASE_URL="}, []string{"migrate"}, 1},            // a failure: no database named
		{db, []string{"audit", filepath.Join(t.TempDir(), "none")}, 1}, // a failure: no such log
		{db, []string{"campaign", "show", "NOPE"}, 1},
		{nil, []string{"nonsense"}, 2},
		{nil, []string{"demo", "--bogus"}, 2},
		{nil, []string{"demo", "--members", "0"}, 2},
		{db, []string{"demo"}, 2}, // DATABASE_URL without --yes
		{nil, []string{"campaign", "create"}, 2},
		{nil, []string{"campaign", "create", "--id", "X", "--discount-yen", "0", "--budget-yen", "10"}, 2},
		{nil, []string{"campaign", "create", "--id", "X", "--discount-yen", "100", "--budget-yen", "1000", "--starts", "tomorrow"}, 2},
		{nil, []string{"campaign", "show"}, 2},
		{nil, []string{"outbox", "requeue"}, 2},
		{nil, []string{"outbox", "requeue", "not-a-uuid"}, 2},
		{nil, []string{"outbox", "prune", "--older-than", "-1h"}, 2},
		{nil, []string{"outbox", "prune", "--batch", "0"}, 2},
		{nil, []string{"outbox", "prune", "--batch", "10001"}, 2},
		{nil, []string{"outbox", "prune", "--pause", "-1s"}, 2},
		{nil, []string{"line", "link", "--member", "m1", "--line-user", "U1"}, 2},
		{nil, []string{"line", "unlink"}, 2},
		{nil, []string{"load"}, 2},
		{nil, []string{"audit"}, 2},
		{nil, []string{"bench", "--rtt", "-1ms"}, 2},
		{nil, []string{"sim", "--format", "xml"}, 2},
		{nil, []string{"drill", "--faults", "flood"}, 2},
		{nil, []string{"drill", "--duration", "0s"}, 2},
		{nil, []string{"reconcile", "--format", "xml"}, 2},
		{nil, []string{"serve", "--listen", ""}, 2},
		{nil, []string{"legacy", "rollback"}, 2},
		{db, []string{"campaign", "update", "DRIFT", "--stripes", "0", "--reason", "r"}, 2},
		{db, []string{"campaign", "update", "DRIFT", "--coupon-valid-days", "-1", "--reason", "r"}, 2},
		{nil, []string{"campaign", "create", "--id", "X", "--discount-yen", "100", "--budget-yen", "1000", "--coupon-valid-days", "0"}, 2},
		{nil, []string{"outbox", "prune", "--older-than", "1ns"}, 2},
	} {
		code, _, stderr := couponctlBin(t, c.env, c.args...)
		if code != c.code {
			t.Errorf("%q: exit %d, want %d\n%s", c.args, code, c.code, stderr)
		}
		finding := c.args[0] == "reconcile" && len(c.args) == 1
		if c.code != 0 && !finding && strings.Count(stderr, "couponctl: ") != 1 {
			t.Errorf("%q: want one couponctl: line on stderr:\n%s", c.args, stderr)
		}
		if c.code == 2 && !strings.Contains(stderr, "Usage:") {
			t.Errorf("%q: exit 2 without the verb's usage:\n%s", c.args, stderr)
		}
	}
}
