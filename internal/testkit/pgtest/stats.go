package pgtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Deadlocks is how many deadlocks (SQLSTATE 40P01) the server detected in databaseURL's
// database, as the statistics count them. A backend flushes its counts when it exits (PostgreSQL
// 15 docs, 28.2.2 "Viewing Statistics"), so Deadlocks first waits, at most [PollTimeout], until
// no other session of the database runs: close the test's pools before calling it.
func Deadlocks(t testing.TB, databaseURL string) int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		t.Fatalf("pgtest: deadlocks: connect: %v", err)
	}
	defer conn.Close(ctx)
	Eventually(t, PollTimeout, func() error {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*)::int FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return fmt.Errorf("%d sessions of the database still run: close the pools first", n)
		}
		return nil
	})
	var deadlocks int64
	if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks); err != nil {
		t.Fatal(err)
	}
	return deadlocks
}
