package issue_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestOpenWithReadPool: with DATABASE_READ_URL set (here the primary's own database, under an
// application_name of its own), Open opens and checks the read pool beside the primary's, names
// it in the start-up settings (read_db), closes it with the instance, and its dry runs carry
// X-Read-Pool-Lag-Ms. A read pool it cannot reach fails Open, naming the read pool, and leaves no
// session of the primary's pool on the server.
func TestOpenWithReadPool(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	observer, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close(ctx)
	if err := campaign.Create(ctx, observer, campaign.Campaign{ID: "RP", DiscountYen: 100, BudgetYen: 1000}); err != nil {
		t.Fatal(err)
	}
	sessions := func(where string) func() error {
		return func() error {
			var n int
			if err := observer.QueryRow(ctx, `SELECT count(*)::int FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND `+where).Scan(&n); err != nil {
				return err
			}
			if n != 0 {
				return fmt.Errorf("%d sessions (%s) still on the server", n, where)
			}
			return nil
		}
	}
	t.Setenv("DATABASE_URL", dbURL)
	t.Setenv("DATABASE_READ_URL", dbURL+"&application_name=rp_read")
	in, err := issue.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(in.Settings, any("read_db")); i < 0 || len(in.Closers) != 2 {
		t.Errorf("settings %v, %d closers; want read_db and the read pool's closer", in.Settings, len(in.Closers))
	}
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"member_id": "m1", "campaign_id": "RP", "dry_run": true}`))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	in.Handler.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || rec.Header().Get(issue.HeaderReadLag) != "0.000" {
		t.Errorf("dry run: %d %s, %s %q; want 200 with the read pool's lag", rec.Code, rec.Body, issue.HeaderReadLag, rec.Header().Get(issue.HeaderReadLag))
	}
	for _, c := range in.Closers {
		if err := c.Close(ctx); err != nil {
			t.Errorf("close %s: %v", c.Name, err)
		}
	}
	pgtest.Eventually(t, pgtest.PollTimeout, sessions("application_name = 'rp_read'"))

	t.Setenv("DATABASE_READ_URL", "postgres://nobody@127.0.0.1:1/none?sslmode=disable")
	if _, err := issue.Open(ctx); err == nil || !strings.Contains(err.Error(), "read pool") {
		t.Fatalf("Open with an unreachable read pool: %v; want an error naming the read pool", err)
	}
	pgtest.Eventually(t, pgtest.PollTimeout, sessions("true"))
}
