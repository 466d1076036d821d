package issuance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestDryRunLosingTheDatabaseIsRetryExhausted: a dry run whose call loses the database, wrote
// nothing, so it answers RETRY_EXHAUSTED (503 with Retry-After), as an issuance does when an
// unreachable database outlasts its budget (docs/api.md), never an error (500 INTERNAL_ERROR,
// an ERROR log line). Two losses, each met for real: a pool whose server refuses the connection
// (a failed dial), and a call whose session the server ends while it runs (57P01
// admin_shutdown, as a restart or failover ends every pooled session: the call waits behind an
// ACCESS EXCLUSIVE lock on campaign_budgets until the test sees it waiting and terminates it).
// The broken variant is the dry run's answer before issue 33's try (brokenDryFailed): it
// answered both with the driver's error, 500 (seen against `couponctl serve` with its database
// stopped).
func TestDryRunLosingTheDatabaseIsRetryExhausted(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			// ask is the dry run of member for campaign S on s: DryRun, or in the broken variant the
			// same call answered by brokenDryFailed.
			ask := func(s *Service, member string) (DryRunOutcome, error) {
				if !broken {
					return s.DryRun(ctx, member, "S")
				}
				outs, err := s.dryCall(ctx, "S", []string{member})
				if err != nil {
					return brokenDryFailed(ctx, err)
				}
				return outs[0], nil
			}
			var wrong []string
			judge := func(loss string, out DryRunOutcome, err error) {
				if err != nil || out.Result != ResultRetryExhausted {
					wrong = append(wrong, fmt.Sprintf("%s: answered %+v, error %v; want RETRY_EXHAUSTED", loss, out, err))
				}
			}

			out, err := ask(refusingService(t), "m1")
			judge("connection refused", out, err)

			s, owner := onePool(t, nil)
			if out, err := s.DryRun(ctx, "m0", "S"); err != nil || out.Result != ResultAvailable { // the pool's one session
				t.Fatalf("the first dry run: %+v %v", out, err)
			}
			tx, err := owner.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, `LOCK TABLE campaign_budgets IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			type answer struct {
				out DryRunOutcome
				err error
			}
			answered := make(chan answer, 1)
			go func() {
				out, err := ask(s, "m1")
				answered <- answer{out, err}
			}()
			var pid int
			for pid == 0 {
				err := tx.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%issue_dry_run_batch(%'
					  AND pid <> pg_backend_pid()`).Scan(&pid)
				if err != nil {
					t.Fatal(err)
				}
				select {
				case a := <-answered:
					t.Fatalf("the dry run was answered before it waited for the lock: %+v %v", a.out, a.err)
				default:
				}
				time.Sleep(time.Millisecond)
			}
			if _, err := tx.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
			a := <-answered
			judge("session ended (57P01)", a.out, a.err)

			if broken {
				if len(wrong) == 0 {
					t.Fatal("the broken variant passed: the test would not see a lost database answered 500")
				}
				t.Logf("the broken variant: %v", wrong)
				return
			}
			for _, w := range wrong {
				t.Error(w)
			}
		})
	}
}

// refusingService is a Service whose pool's server refuses every connection: a port on which
// this process listened and stopped listening.
func refusingService(t *testing.T) *Service {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), fmt.Sprintf("postgres://nobody@%s/none?sslmode=disable", addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(pool, Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// brokenDryFailed is a dry run's answer to its call's error err before issue 33's try
// ((*dryJoined).failed then): a lost connection fell through to the error, 500.
func brokenDryFailed(caller context.Context, err error) (DryRunOutcome, error) {
	switch {
	case caller.Err() != nil:
		return DryRunOutcome{}, fmt.Errorf("issuance: dry run: %w", caller.Err())
	case err == nil, errors.Is(err, context.DeadlineExceeded), isTimeout(err), IsRetryable(err):
		return DryRunOutcome{Result: ResultRetryExhausted}, nil
	}
	return DryRunOutcome{}, fmt.Errorf("issuance: dry run: %w", err)
}
