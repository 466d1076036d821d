package schema_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
	"github.com/mops/coupon-api/schema"
)

// lockedFixture is two migrations: a table, then an ALTER of it under a short lock_timeout, which
// a transaction holding any lock on the table makes fail with 55P03.
var lockedFixture = fstest.MapFS{
	"00001_fleet_table.sql": {Data: []byte("-- +goose Up\nCREATE TABLE fleet_t (id int PRIMARY KEY);\n")},
	"00002_fleet_column.sql": {Data: []byte("-- +goose Up\nSET LOCAL lock_timeout = '1s';\n" +
		"ALTER TABLE fleet_t ADD COLUMN x int;\n")},
}

// migrateFirst applies the fixture's first migration to a new empty database and returns it,
// with a transaction (its backend pid) holding ACCESS SHARE on fleet_t, which the second one's
// ALTER TABLE waits for.
func migrateFirst(t *testing.T) (*sql.DB, pgx.Tx, int) {
	t.Helper()
	ctx := context.Background()
	dbURL := pgtest.EmptyURL(t)
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	first := fstest.MapFS{"00001_fleet_table.sql": lockedFixture["00001_fleet_table.sql"]}
	if _, err := (schema.Migrator{FS: first}).Up(ctx, db); err != nil {
		t.Fatalf("first migration: %v", err)
	}
	holder, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close(context.Background()) })
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE fleet_t IN ACCESS SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	return db, tx, int(holder.PgConn().PID())
}

func hasColumnX(t *testing.T, db *sql.DB) bool {
	t.Helper()
	var n int
	err := db.QueryRow(`SELECT count(*) FROM information_schema.columns
		WHERE table_name = 'fleet_t' AND column_name = 'x'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// TestMigrateRetriesALockedMigration: a migration that waits past its lock_timeout for a lock an
// open transaction holds is reported (migration, SQLSTATE, blocker, wait, try) and run again; once
// the transaction ends, it applies.
func TestMigrateRetriesALockedMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, tx, holderPID := migrateFirst(t)
	var report syncbuf.Buffer
	type result struct {
		applied []int64
		err     error
	}
	done := make(chan result, 1)
	go func() {
		m := schema.Migrator{FS: lockedFixture, Tries: 1000, BackoffBase: 10 * time.Millisecond,
			BackoffCap: 50 * time.Millisecond, Report: &report, BlockerPoll: 10 * time.Millisecond}
		applied, err := m.Up(ctx, db)
		done <- result{applied, err}
	}()
	retried := fmt.Sprintf("00002_fleet_column.sql failed on a lock (SQLSTATE 55P03: lock_timeout, blocked by pid %d (idle in transaction)); retrying in", holderPID)
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if !strings.Contains(report.String(), retried) || !strings.Contains(report.String(), "(try 3 of 1000)") {
			return fmt.Errorf("no second retry reported yet: %q", report.String())
		}
		return nil
	})
	if hasColumnX(t, db) {
		t.Fatal("the column is there while its table is locked")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("after the lock was released: %v\nreport:\n%s", r.err, report.String())
	}
	if fmt.Sprint(r.applied) != "[2]" {
		t.Errorf("applied %v, want [2]", r.applied)
	}
	if !hasColumnX(t, db) {
		t.Error("the column is missing after the migration applied")
	}
	t.Logf("report:\n%s", report.String())
}

// TestMigrateGivesUpNamingTheBlocker: a lock never released ends in a LockError after Tries
// tries, naming the migration, the SQLSTATE and the session that held the lock, and saying what
// to do; nothing of the migration is applied.
func TestMigrateGivesUpNamingTheBlocker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _, holderPID := migrateFirst(t)
	var report syncbuf.Buffer
	m := schema.Migrator{FS: lockedFixture, Tries: 2, BackoffBase: 10 * time.Millisecond,
		Report: &report, BlockerPoll: 10 * time.Millisecond}
	_, err := m.Up(ctx, db)
	var lerr *schema.LockError
	if !errors.As(err, &lerr) {
		t.Fatalf("err = %v, want a *schema.LockError", err)
	}
	if lerr.Version != 2 || lerr.SQLState != "55P03" || lerr.Tries != 2 {
		t.Errorf("LockError{Version: %d, SQLState: %s, Tries: %d}, want 2, 55P03, 2", lerr.Version, lerr.SQLState, lerr.Tries)
	}
	if len(lerr.Blockers) != 1 || lerr.Blockers[0].PID != holderPID || lerr.Blockers[0].State != "idle in transaction" {
		t.Errorf("blockers %+v, want the holder, pid %d, idle in transaction", lerr.Blockers, holderPID)
	}
	for _, want := range []string{
		"migration 00002_fleet_column.sql gave up after 2 tries on a lock (SQLSTATE 55P03: lock_timeout)",
		fmt.Sprintf("held by pid %d", holderPID), "LOCK TABLE fleet_t IN ACCESS SHARE MODE",
		"then run migrate again",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the give-up does not say %q:\n%s", want, err)
		}
	}
	out := report.String()
	if strings.Count(out, "retrying in") != 1 || !strings.Contains(out, "(try 2 of 2)") {
		t.Errorf("report, want one retry (try 2 of 2):\n%s", out)
	}
	if hasColumnX(t, db) {
		t.Error("the column was added although the migration gave up")
	}
	t.Logf("give-up:\n%s", err)
}
