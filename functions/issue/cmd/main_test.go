package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/campaign"
	"github.com/mops/coupon-api/internal/pgtest"
	"github.com/mops/coupon-api/internal/proctest"
	"github.com/mops/coupon-api/internal/syncbuf"
)

func TestMain(m *testing.M) { pgtest.Main(m, proctest.RemoveBuilds) }

// start runs this main with env (see proctest.Env).
func start(t *testing.T, env ...string) (*exec.Cmd, *syncbuf.Buffer) {
	t.Helper()
	return proctest.Start(t, proctest.Build(t, "."), env...)
}

// TestStartUpRefusesABadDatabase: against a closed port, an unmigrated database or a zero lock
// timeout, the main exits 1 at start-up with what is wrong, instead of serving 500s.
func TestStartUpRefusesABadDatabase(t *testing.T) {
	t.Parallel()
	unmigrated := unmigratedURL(t)
	closed := "postgres://u@127.0.0.1:" + proctest.FreePort(t) + "/coupons?sslmode=disable"
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"closed port", []string{"DATABASE_URL=" + closed}, "database unreachable"},
		{"unmigrated", []string{"DATABASE_URL=" + unmigrated}, "couponctl migrate"},
		{"zero lock timeout", []string{"DATABASE_URL=" + unmigrated, "ISSUE_LOCK_TIMEOUT=0s"}, "ISSUE_LOCK_TIMEOUT"},
	} {
		cmd, out := start(t, append(tc.env, "PORT="+proctest.FreePort(t))...)
		err := cmd.Wait()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(out.String(), tc.want) {
			t.Errorf("%s: %v, output %q; want exit 1 saying %q", tc.name, err, out.String(), tc.want)
		}
		if strings.Contains(out.String(), "serving") {
			t.Errorf("%s: said it was serving: %q", tc.name, out.String())
		}
	}
}

// unmigratedURL is a database whose schema version is gone, as if never migrated.
func unmigratedURL(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DROP TABLE goose_db_version`); err != nil {
		t.Fatal(err)
	}
	return url
}

// TestFrameworkStartsAsTheMain: IssueCoupon as the functions framework serves it (init's
// registration; the demo serves it so) starts as this main does: against an unmigrated database
// its first request answers 500 and the log says to run couponctl migrate; against a migrated
// one the next request starts it again and is answered.
func TestFrameworkStartsAsTheMain(t *testing.T) {
	var log syncbuf.Buffer
	defaultLog := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&log, nil)))
	t.Cleanup(func() { slog.SetDefault(defaultLog) })
	t.Setenv("FUNCTION_TARGET", "IssueCoupon")
	t.Setenv("DATABASE_URL", unmigratedURL(t))
	port := proctest.FreePort(t)
	go func() { _ = funcframework.StartHostPort("127.0.0.1", port) }() // serves until the test binary exits
	post := func() int {
		t.Helper()
		for i := 0; ; i++ {
			resp, err := http.Post("http://127.0.0.1:"+port+"/", "application/json",
				strings.NewReader(`{"member_id": "m1", "campaign_id": "OPEN"}`))
			if err != nil && i < 250 && strings.Contains(err.Error(), "refused") {
				time.Sleep(20 * time.Millisecond) // not serving yet
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
	}
	if got := post(); got != http.StatusInternalServerError || !strings.Contains(log.String(), "couponctl migrate") {
		t.Errorf("unmigrated: %d, log %q; want 500 and a log line naming couponctl migrate", got, log.String())
	}

	migrated := pgtest.URL(t)
	conn, err := pgx.Connect(context.Background(), migrated)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := campaign.Create(context.Background(), conn, campaign.Campaign{ID: "OPEN", DiscountYen: 500, BudgetYen: 10_000}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DATABASE_URL", migrated)
	if got := post(); got != http.StatusCreated {
		t.Errorf("migrated: %d, want 201; log %q", got, log.String())
	}
	// The instance keeps its pool for the process's life: end its sessions, waiting up to 5 s
	// for each, so that the database can be dropped.
	if _, err := conn.Exec(context.Background(), `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
}

// TestSIGTERMDrains: SIGTERM arrives while 10 requests wait on a locked campaign row. The main
// stops accepting at once, lets the 10 finish once the row is free (every one answered 201,
// none cut), closes the pool and exits 0.
func TestSIGTERMDrains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	observer, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close(ctx)
	if err := campaign.Create(ctx, observer, campaign.Campaign{ID: "HELD", DiscountYen: 100, BudgetYen: 100_000}); err != nil {
		t.Fatal(err)
	}
	port := proctest.FreePort(t)
	// ISSUE_BATCH_MAX=1: one call per request, so that the 10 requests in flight are 10 sessions
	// the test sees waiting behind the hold.
	cmd, out := start(t, "DATABASE_URL="+dbURL, "PORT="+port, "DB_POOL_MAX_CONNS=10", "FUNCTION_TARGET=IssueCoupon",
		"ISSUE_LOCK_TIMEOUT=2s", "ISSUE_STATEMENT_TIMEOUT=2400ms", "ISSUE_BATCH_MAX=1")
	base := "http://127.0.0.1:" + port + "/"
	proctest.WaitServing(t, port, out)
	if !strings.Contains(out.String(), "pool_max_conns=10") {
		t.Errorf("start-up line without the effective pool size: %s", out.String())
	}

	hold := pgtest.HoldCampaign(t, dbURL, "HELD")
	statuses := make(chan string, 10)
	for i := range 10 {
		go func() {
			body := fmt.Sprintf(`{"member_id": "t%d", "campaign_id": "HELD"}`, i)
			resp, err := http.Post(base, "application/json", strings.NewReader(body))
			if err != nil {
				statuses <- err.Error()
				return
			}
			resp.Body.Close()
			statuses <- resp.Status
		}()
	}
	hold.WaitBlocked(10)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ { // stops accepting: new connections are refused while the 10 drain
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second)
		if err != nil {
			break
		}
		c.Close()
		if i > 200 {
			t.Fatal("still accepting connections after SIGTERM")
		}
		time.Sleep(5 * time.Millisecond)
	}
	hold.Release()
	for range 10 {
		if s := <-statuses; s != "201 Created" {
			t.Errorf("request in flight at SIGTERM: %s, want 201 Created", s)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "shut down cleanly") {
		t.Errorf("no clean shutdown in the log: %s", out.String())
	}
	var coupons int
	if err := observer.QueryRow(ctx, `SELECT count(*) FROM issued_coupons`).Scan(&coupons); err != nil || coupons != 10 {
		t.Errorf("coupons: %d (%v), want 10", coupons, err)
	}
}
