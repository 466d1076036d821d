package pgtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// TestDeadlocksCountsOne: two sessions that lock two rows in opposite orders deadlock; the
// server ends one with 40P01, and Deadlocks counts it once the sessions have ended.
func TestDeadlocksCountsOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	if n := pgtest.Deadlocks(t, url); n != 0 {
		t.Fatalf("a new database: %d deadlocks", n)
	}
	setup, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec(ctx, `CREATE TABLE pair (id int PRIMARY KEY); INSERT INTO pair VALUES (1), (2)`); err != nil {
		t.Fatal(err)
	}
	setup.Close(ctx)

	var txs [2]pgx.Tx
	for i := range txs {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if txs[i], err = conn.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := txs[i].Exec(ctx, `SELECT FROM pair WHERE id = $1 FOR UPDATE`, i+1); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, 2)
	for i, tx := range txs {
		go func() {
			_, err := tx.Exec(ctx, `SELECT FROM pair WHERE id = $1 FOR UPDATE`, 2-i)
			_ = tx.Rollback(ctx)
			errs <- err
		}()
	}
	var deadlocked int
	for range txs {
		var pgErr *pgconn.PgError
		if err := <-errs; errors.As(err, &pgErr) && pgErr.Code == pgerrcode.DeadlockDetected {
			deadlocked++
		}
	}
	if deadlocked != 1 {
		t.Fatalf("%d sessions ended with 40P01, want 1", deadlocked)
	}
	for _, tx := range txs {
		tx.Conn().Close(ctx)
	}
	if n := pgtest.Deadlocks(t, url); n != 1 {
		t.Errorf("Deadlocks = %d, want 1", n)
	}
}
