package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestConsoleGrantAndRoles: `console grant`, as a user in coupon_admin, gives roles the database
// then answers (console_role_of), keeps emails in lower case, writes one history row per change
// and none for a grant of the role held; `console roles` lists the holders and the history. An
// unknown role or no reason exits 2 before the database; a malformed email exits 1 with the
// database's refusal, nothing written.
func TestConsoleGrantAndRoles(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	owner, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	t.Setenv("DATABASE_URL", pgtest.LoginAs(t, url, "coupon_admin"))

	for _, step := range []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"--email", "Hanako.Sato@Example.com", "--role", "operator", "--reason", "runs Silver Week"}, 0, "hanako.sato@example.com: viewer -> operator (change 1 at "},
		{[]string{"--email", "hanako.sato@example.com", "--role", "operator", "--reason", "again"}, 0, "hanako.sato@example.com is already operator: nothing changed"},
		{[]string{"--email", "hanako.sato@example.com", "--role", "approver", "--reason", "budget owner"}, 0, "operator -> approver (change 2 at "},
		{[]string{"--email", "taro@example.com", "--role", "operator", "--reason", "second pair of eyes"}, 0, "taro@example.com: viewer -> operator"},
		{[]string{"--email", "taro@example.com", "--role", "admin", "--reason", "x"}, 2, `role "admin": want viewer, operator or approver`},
		{[]string{"--email", "taro@example.com", "--role", "approver", "--reason", " "}, 2, "needs --reason TEXT"},
		{[]string{"--email", "taro at example.com", "--role", "approver", "--reason", "typo"}, 1, `email 'taro at example.com': want an address such as name@example.com`},
	} {
		code, out, errOut := cli(append([]string{"console", "grant"}, step.args...)...)
		if code != step.code || !strings.Contains(out+errOut, step.contains) {
			t.Errorf("console grant %q: exit %d, want %d with %q\n%s%s", step.args, code, step.code, step.contains, out, errOut)
		}
	}
	var roles string
	if err := owner.QueryRow(ctx, `SELECT console_role_of('HANAKO.SATO@example.com') || ' ' || console_role_of('taro@example.com') || ' ' ||
	    console_role_of('nobody@example.com') || ' ' || (SELECT count(*) FROM console_role_changes)`).Scan(&roles); err != nil {
		t.Fatal(err)
	}
	if want := "approver operator viewer 3"; roles != want {
		t.Errorf("roles by console_role_of, and history rows: %q, want %q", roles, want)
	}

	code, out, errOut := cli("console", "roles")
	if code != 0 {
		t.Fatalf("console roles: exit %d\n%s", code, errOut)
	}
	for _, want := range []string{"hanako.sato@example.com  approver", "taro@example.com         operator",
		"operator  approver  budget owner", "viewer    operator  second pair of eyes"} {
		if !strings.Contains(out, want) {
			t.Errorf("console roles lacks %q:\n%s", want, out)
		}
	}
}

// TestCampaignHistoryNamesThePerson: `campaign history` shows a change made through the console
// as the person's email beside the database login, and a change that applied a request with the
// request's number; a change made with couponctl shows the login alone.
func TestCampaignHistoryNamesThePerson(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	owner, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	console, err := pgxpool.New(ctx, pgtest.LoginAs(t, url, "coupon_console"))
	if err != nil {
		t.Fatal(err)
	}
	defer console.Close()
	t.Setenv("DATABASE_URL", pgtest.LoginAs(t, url, "coupon_admin"))
	if code, _, errOut := cli("campaign", "create", "--id", "HIST", "--discount-yen", "1000", "--budget-yen", "100000"); code != 0 {
		t.Fatalf("campaign create: exit %d\n%s", code, errOut)
	}
	for _, g := range [][]string{{"op@example.com", "operator"}, {"ap@example.com", "approver"}} {
		if code, _, errOut := cli("console", "grant", "--email", g[0], "--role", g[1], "--reason", "team"); code != 0 {
			t.Fatalf("console grant: exit %d\n%s", code, errOut)
		}
	}
	var request int64
	for _, sql := range []string{
		`SELECT count(*) FROM console_pause('HIST', true, 'op@example.com', 'stock check')`,
		`SELECT request_id FROM console_budget('HIST', NULL, 200000, NULL, 'op@example.com', 'Silver Week demand')`,
	} {
		if err := console.QueryRow(ctx, sql).Scan(&request); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if _, err := console.Exec(ctx, `SELECT * FROM console_decide($1, true, 'ap@example.com', 'within the budget plan')`, request); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := cli("campaign", "resume", "HIST", "--reason", "from the terminal"); code != 0 {
		t.Fatalf("campaign resume: exit %d\n%s", code, errOut)
	}
	code, out, errOut := cli("campaign", "history", "HIST")
	if code != 0 {
		t.Fatalf("campaign history: exit %d\n%s", code, errOut)
	}
	consoleUser := console.Config().ConnConfig.User
	for _, want := range []string{"op@example.com (" + consoleUser + ")  pause", "ap@example.com (" + consoleUser + ")  budget",
		"Silver Week demand (request 1)", "  coupon_admin_"} {
		if !strings.Contains(out, want) {
			t.Errorf("campaign history lacks %q:\n%s", want, out)
		}
	}
}
