package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/internal/lab/hotbench"
	"github.com/mops/coupon-api/internal/testkit/localpg"
)

// readPool is bench's streaming replica of its throwaway server (`bench --dry-runs --read-pool`),
// which IssueCoupon's dry runs go to (DATABASE_READ_URL), and what the dry runs' answers said of
// it: how many carried its lag (X-Read-Pool-Lag-Ms), and the lags.
type readPool struct {
	standby *localpg.Server
	primary string // the throwaway server's URL

	mu       sync.Mutex
	answered int       // dry runs answered, by either server
	lags     []float64 // ms, one per dry run the replica answered
}

// checkReadPool refuses --read-pool without --dry-runs, beside --standby, or with DATABASE_URL
// set (the replica is of bench's throwaway server): usage errors.
func checkReadPool(readPool, dryRuns bool, standby time.Duration) error {
	switch {
	case !readPool:
		return nil
	case !dryRuns:
		return flagError("--read-pool: the replica answers the dry runs; add --dry-runs")
	case standby > 0:
		return flagError("--read-pool: not with --standby (one replica at a time)")
	case os.Getenv("DATABASE_URL") != "":
		return flagError("--read-pool: bench adds a replica only to its throwaway server; unset DATABASE_URL")
	}
	return nil
}

// benchServers is [benchServer], and withReplica a streaming (asynchronous) replica of the
// throwaway server as well, started directly on it (no proxy): rp, nil without it. stop
// stops the replica before the server.
func benchServers(ctx context.Context, cmd *cobra.Command, exe string, standby time.Duration, withReplica bool) (
	serverURL string, cpu func() (time.Duration, error), stop func(), rp *readPool, err error) {
	if !withReplica {
		serverURL, cpu, stop, err = benchServer(ctx, cmd, exe, standby)
		return serverURL, cpu, stop, nil, err
	}
	srv, err := startThrowaway(ctx, cmd)
	if err != nil {
		return "", nil, nil, nil, err
	}
	sb, err := srv.StartStandby(ctx, fmt.Sprintf("127.0.0.1:%d", srv.Port()))
	if err != nil {
		_ = srv.Stop()
		return "", nil, nil, nil, err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "streaming replica on 127.0.0.1:%d (asynchronous): IssueCoupon's read pool for the dry runs\n", sb.Port())
	stop = func() { _ = sb.Stop(); _ = srv.Stop() }
	return srv.URL(), srv.CPUTime, stop, &readPool{standby: sb, primary: srv.URL()}, nil
}

// serveBenched is [serveBenchedIssueCoupon] on proxied, with rp, when not nil, as IssueCoupon's
// read pool ([readPool.serve]) on database dbURL's copy.
func (rp *readPool) serveBenched(ctx context.Context, proxied, dbURL string, poolSize int) (*localServer, error) {
	if rp != nil {
		if err := rp.serve(ctx, dbURL, poolSize); err != nil {
			return nil, err
		}
	}
	return serveBenchedIssueCoupon(ctx, proxied, poolSize)
}

// writeTable is [hotbench.WriteTable], then, with a replica, [readPool.report].
func (rp *readPool) writeTable(w io.Writer, format string, rep hotbench.Report) error {
	if err := hotbench.WriteTable(w, format, rep); err != nil {
		return err
	}
	if rp != nil {
		rp.report(w)
	}
	return nil
}

// serve makes IssueCoupon, served next, open its read pool of poolSize connections on database
// dbURL's copy on the replica (DATABASE_READ_URL), once the replica has replayed it.
func (rp *readPool) serve(ctx context.Context, dbURL string, poolSize int) error {
	u, err := url.Parse(dbURL)
	if err != nil {
		return err
	}
	u.Host = fmt.Sprintf("127.0.0.1:%d", rp.standby.Port())
	readURL, err := withPoolSize(u.String(), poolSize)
	if err != nil {
		return err
	}
	if err := caughtUp(ctx, rp.primary, rp.standby.URL()); err != nil {
		return err
	}
	return os.Setenv("DATABASE_READ_URL", readURL)
}

// catchUpTimeout bounds how long bench waits for its replica to replay a new database.
const catchUpTimeout = time.Minute

// caughtUp waits until the replica at replicaURL has replayed the WAL the primary at
// primaryURL has written so far.
func caughtUp(ctx context.Context, primaryURL, replicaURL string) error {
	var written string
	if err := queryOnce(ctx, primaryURL, `SELECT pg_current_wal_insert_lsn()::text`, &written); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, catchUpTimeout)
	defer cancel()
	for {
		var replayed bool
		if err := queryOnce(ctx, replicaURL, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, &replayed, written); err != nil {
			return err
		}
		if replayed {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the replica has not replayed the WAL to %s: %w", written, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// queryOnce scans the one row of query on a connection of its own to dbURL into dest.
func queryOnce(ctx context.Context, dbURL, query string, dest any, args ...any) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, query, args...).Scan(dest)
}

// instrument makes cfg's dry runs note which server answered (the lag header) and its CPU
// counted as the replica's.
func (rp *readPool) instrument(cfg *hotbench.Config, client *http.Client, dryURL string) {
	if rp == nil {
		return
	}
	cfg.ReplicaCPU = rp.standby.CPUTime
	cfg.DryRun = func(ctx context.Context, memberID, campaignID string) (string, error) {
		return rp.dryRun(ctx, client, dryURL, memberID, campaignID)
	}
}

// dryRun asks IssueCoupon at dryURL for one dry run and notes its X-Read-Pool-Lag-Ms.
func (rp *readPool) dryRun(ctx context.Context, client *http.Client, dryURL, memberID, campaignID string) (string, error) {
	b, _ := json.Marshal(map[string]any{"member_id": memberID, "campaign_id": campaignID, "dry_run": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, dryURL, bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var answer struct {
		Result string `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil || answer.Result == "" {
		return "", fmt.Errorf("HTTP %d without a result: %v", resp.StatusCode, err)
	}
	rp.mu.Lock()
	defer rp.mu.Unlock()
	rp.answered++
	if lag, err := strconv.ParseFloat(resp.Header.Get(issue.HeaderReadLag), 64); err == nil {
		rp.lags = append(rp.lags, lag)
	}
	return answer.Result, nil
}

// report writes which server answered the dry runs and the replica's lag as it measured it in
// each answer: its median, 99th percentile and largest, in ms.
func (rp *readPool) report(w io.Writer) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	fmt.Fprintf(w, "\nthe replica answered %d of %d dry runs (the others: the primary, past ISSUE_DRY_RUN_MAX_LAG or on an error)", len(rp.lags), rp.answered)
	if len(rp.lags) == 0 {
		fmt.Fprintln(w)
		return
	}
	s := slices.Sorted(slices.Values(rp.lags))
	at := func(p float64) float64 { return s[min(len(s)-1, int(p*float64(len(s))))] }
	fmt.Fprintf(w, "; its lag as it measured it: median %.3f ms, p99 %.3f ms, largest %.3f ms\n", at(0.5), at(0.99), s[len(s)-1])
}
