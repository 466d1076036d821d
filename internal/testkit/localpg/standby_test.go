package localpg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/lab/latencyproxy"
)

// TestSyncStandby: a standby started through a latency proxy streams through it, and once
// required, a commit on the primary waits for it: with the standby stopped (SIGSTOP), the
// committing backend waits in SyncRep and its commit does not return; resumed, the commit
// returns and its row is on the standby.
func TestSyncStandby(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := Start(ctx, Options{Durable: true})
	if errors.Is(err, ErrBinariesMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Stop()
	proxy, err := latencyproxy.Start(fmt.Sprintf("127.0.0.1:%d", primary.Port()), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	standby, err := primary.StartStandby(ctx, proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Stop() // before the primary's
	if err := primary.RequireSyncStandby(ctx); err != nil {
		t.Fatal(err)
	}
	sconn, err := pgx.Connect(ctx, standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	var conninfo string
	if err := sconn.QueryRow(ctx, `SELECT current_setting('primary_conninfo')`).Scan(&conninfo); err != nil {
		t.Fatal(err)
	}
	sconn.Close(ctx)
	_, proxyPort, _ := strings.Cut(proxy.Addr(), ":")
	if !strings.Contains(conninfo, "port="+proxyPort+" ") && !strings.HasSuffix(conninfo, "port="+proxyPort) {
		t.Errorf("standby's primary_conninfo %q: want the proxy's port %s", conninfo, proxyPort)
	}

	conn, err := pgx.Connect(ctx, primary.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE synced (n int)`); err != nil {
		t.Fatal(err)
	}
	writer, err := pgx.Connect(ctx, primary.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(ctx)
	var writerPID int
	if err := writer.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&writerPID); err != nil {
		t.Fatal(err)
	}
	var before string // the WAL insert position before the commit: its record ends past it
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if _, err := standby.Pause(); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		_, err := writer.Exec(ctx, `INSERT INTO synced VALUES (1)`)
		committed <- err
	}()
	for {
		var event string
		if err := conn.QueryRow(ctx, `SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1`, writerPID).Scan(&event); err != nil {
			t.Fatal(err)
		}
		if event == "SyncRep" {
			break
		}
		select {
		case err := <-committed:
			t.Fatalf("the commit returned (%v) with the standby stopped", err)
		case <-ctx.Done():
			t.Fatalf("the committing backend never waited in SyncRep (wait event %q)", event)
		case <-time.After(10 * time.Millisecond):
		}
	}
	select {
	case err := <-committed:
		t.Fatalf("the commit returned (%v) while its backend waits in SyncRep", err)
	default:
	}
	standby.Resume()
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	sconn, err = pgx.Connect(ctx, standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(ctx)
	// A synchronous commit returns once the standby has flushed it (not replayed it): the WAL
	// it has received and flushed already ends past the commit's record.
	var flushed bool
	if err := sconn.QueryRow(ctx, `SELECT pg_last_wal_receive_lsn() > $1::pg_lsn`, before).Scan(&flushed); err != nil {
		t.Fatal(err)
	}
	if !flushed {
		t.Errorf("the commit returned, but the standby has not flushed WAL past %s", before)
	}
}
