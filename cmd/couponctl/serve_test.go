package main

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/campaign"
	"github.com/mops/coupon-api/internal/localpg"
	"github.com/mops/coupon-api/internal/proctest"
	"github.com/mops/coupon-api/internal/syncbuf"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
)

// TestServeChecksThenServesThenStops: serve refuses to start against a closed port and against
// an unmigrated database (naming couponctl migrate), never saying "serving"; against a migrated
// one it prints the effective settings once, serves, and on its context's end (SIGTERM) stops
// and returns nil.
func TestServeChecksThenServesThenStops(t *testing.T) {
	ctx := context.Background()
	srv, err := localpg.Start(ctx, localpg.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	t.Setenv("FUNCTION_TARGET", "IssueCoupon")
	t.Setenv("DB_POOL_MAX_CONNS", "6")

	for _, tc := range []struct{ name, url, want string }{
		{"closed port", "postgres://postgres@127.0.0.1:" + proctest.FreePort(t) + "/postgres?sslmode=disable", "database unreachable"},
		{"unmigrated", srv.URL(), "couponctl migrate"},
	} {
		t.Setenv("DATABASE_URL", tc.url)
		t.Setenv("PORT", proctest.FreePort(t))
		var out bytes.Buffer
		cmd := rootCmd()
		cmd.SetArgs([]string{"serve"})
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		err := cmd.ExecuteContext(ctx)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(out.String(), "serving") {
			t.Errorf("%s: %v, output %q; want an error saying %q and no serving", tc.name, err, out.String(), tc.want)
		}
	}

	if _, err := schema.MigrateURL(ctx, srv.URL()); err != nil {
		t.Fatal(err)
	}
	pool, closePool, err := db.Open(ctx, db.Config{DatabaseURL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer closePool()
	if err := campaign.Create(ctx, pool, campaign.Campaign{ID: "SERVE", DiscountYen: 500, BudgetYen: 10_000}); err != nil {
		t.Fatal(err)
	}
	port := proctest.FreePort(t)
	t.Setenv("DATABASE_URL", srv.URL())
	t.Setenv("PORT", port)
	var out syncbuf.Buffer
	cmd := rootCmd()
	cmd.SetArgs([]string{"serve"})
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	serveCtx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- cmd.ExecuteContext(serveCtx) }()
	proctest.WaitServing(t, port, &out)
	resp, err := http.Post("http://127.0.0.1:"+port+"/", "application/json",
		strings.NewReader(`{"member_id": "m1", "campaign_id": "SERVE"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("POST: %s, want 201", resp.Status)
	}
	stop()
	if err := <-served; err != nil {
		t.Errorf("serve after its context ended: %v, want nil", err)
	}
	for _, want := range []string{"pool_max_conns=6", "budget=2.5s", "serving IssueCoupon", "shut down cleanly"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output does not say %q:\n%s", want, out.String())
		}
	}
}
