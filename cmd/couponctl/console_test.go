package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
)

// TestConsoleRefusesAnUnverifiedNetworkConsole: `couponctl console` serves with one way of
// knowing who asks: --operator (no verification) only on a loopback address, or IAP assertions
// verified with --iap-jwks and --iap-audience; anything else is a usage error, exit 2, before
// the database is touched.
func TestConsoleRefusesAnUnverifiedNetworkConsole(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"console", "--operator", "a@example.jp", "--listen", "0.0.0.0:8090"}, "loopback"},
		{[]string{"console"}, "--iap-jwks FILE and --iap-audience AUD"},
		{[]string{"console", "--iap-jwks", "k.json"}, "--iap-audience"},
		{[]string{"console", "--operator", "a@example.jp", "--iap-jwks", "k.json", "--iap-audience", "x"}, "not both"},
		{[]string{"console", "--operator", "a@example.jp", "--listen", "8090"}, "HOST:PORT"},
		{[]string{"console", "--operator", "anything"}, "--operator \"anything\": want an email address"},
		{[]string{"console", "--operator", "Ops <ops@example.jp>"}, "want an email address"},
		{[]string{"console", "--operator", "ops@localhost"}, "want an email address"},
		{[]string{"console", "--operator", " ops@example.jp"}, "want an email address"},
	} {
		var out, errOut strings.Builder
		if code := run(context.Background(), tc.args, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want exit 2 saying %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// TestConsoleServesAsTheOperator: `couponctl console --operator` serves the console on loopback
// as that person, logged in as a coupon_console member, and stops on Ctrl-C (its context).
func TestConsoleServesAsTheOperator(t *testing.T) {
	url := pgtest.URL(t)
	t.Setenv("DATABASE_URL", pgtest.LoginAs(t, url, "coupon_console"))
	port := proctest.FreePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"console", "--operator", "Ops@Example.jp", "--listen", "127.0.0.1:" + port}, io.Discard, &stderr)
	}()
	base := "http://127.0.0.1:" + port + "/"
	var page string
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		resp, err := http.Get(base)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /: %s", resp.Status)
		}
		page = string(body)
		return nil
	})
	if !strings.Contains(page, "ops@example.jp") || !strings.Contains(page, "キャンペーン一覧") {
		t.Errorf("the list does not name the operator: %.400s", page)
	}
	if !strings.Contains(stderr.String(), base+" as ops@example.jp (--operator)") {
		t.Errorf("no URL in %q", stderr.String())
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d after its context ended, want 0: %s", code, stderr.String())
	}
}
