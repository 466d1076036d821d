package issuance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/localpg"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/telemetry"
)

// ignoringLag is the broken variant of lagWithin: a read pool answers whatever its lag.
func ignoringLag(*time.Duration, time.Duration) bool { return true }

// lagBlindToTheReceiver is the broken variant of sqlReadLag (as first written): a standby that
// has replayed all it received reads as fresh, even with no WAL receiver, cut off from the
// primary.
const lagBlindToTheReceiver = `(SELECT CASE WHEN NOT pg_is_in_recovery() OR pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
                  ELSE (extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1e6)::bigint END AS lag_us) l`

// readPoolServers starts a migrated primary, with campaign RP (100 yen, 100 coupons), and a
// streaming standby of it that has replayed the campaign; both count their calls of PL/pgSQL
// functions (track_functions, pg_stat_user_functions). Both stop when t ends, the standby first.
func readPoolServers(t *testing.T, ctx context.Context) (primary, standby *localpg.Server) {
	primary, err := localpg.Start(ctx, localpg.Options{Settings: map[string]string{"track_functions": "pl"}})
	if errors.Is(err, localpg.ErrBinariesMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Stop() })
	if _, err := schema.MigrateURL(ctx, primary.URL()); err != nil {
		t.Fatal(err)
	}
	admin := connectTo(t, ctx, primary.URL())
	if err := campaign.Create(ctx, admin, campaign.Campaign{ID: "RP", DiscountYen: 100, BudgetYen: 10_000}); err != nil {
		t.Fatal(err)
	}
	standby, err = primary.StartStandby(ctx, fmt.Sprintf("127.0.0.1:%d", primary.Port()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Stop() }) // runs before the primary's
	replica := connectTo(t, ctx, standby.URL())
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		var n int
		if err := replica.QueryRow(ctx, `SELECT count(*)::int FROM campaign_budgets WHERE campaign_id = 'RP'`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return errors.New("the standby has not replayed campaign RP")
		}
		return nil
	})
	return primary, standby
}

// connectTo is a connection to url, closed when t ends.
func connectTo(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// appPool is a pool on url whose sessions carry application_name app.
func appPool(t *testing.T, ctx context.Context, url, app string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// functionCalls closes pools (all on the servers of conns, under application_name app), waits
// until no session of app is left on each server of conns (a session's statistics are flushed
// when it ends), and returns each server's calls of function fn (pg_stat_user_functions).
func functionCalls(t *testing.T, ctx context.Context, app, fn string, pools []*pgxpool.Pool, conns ...*pgx.Conn) []int64 {
	t.Helper()
	for _, p := range pools {
		p.Close()
	}
	calls := make([]int64, len(conns))
	for i, c := range conns {
		pgtest.Eventually(t, pgtest.PollTimeout, func() error {
			var left int
			if err := c.QueryRow(ctx, `SELECT count(*)::int FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&left); err != nil {
				return err
			}
			if left > 0 {
				return fmt.Errorf("%d sessions of %s still open", left, app)
			}
			return nil
		})
		if err := c.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_user_functions WHERE funcname = $1`, fn).Scan(&calls[i]); err != nil {
			t.Fatal(err)
		}
	}
	return calls
}

// fallbacks is the coupon.dry_run.fallbacks of reason that reader has collected.
func fallbacks(t *testing.T, reader *sdkmetric.ManualReader, reason string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || m.Name != telemetry.MetricDryRunFallbacks {
				continue
			}
			for _, p := range sum.DataPoints {
				if v, _ := p.Attributes.Value(telemetry.AttrFallbackReason); v == attribute.StringValue(reason) {
					n += p.Value
				}
			}
		}
	}
	return n
}

// TestDryRunsOnTheReadPool: on a primary and a streaming standby (issue 42, item 4), a Service
// with the standby's pool as its read pool answers a herd of dry runs from the standby (its
// calls of issue_dry_run_batch, counted in pg_stat_user_functions on each server: all on the
// standby, none on the primary), each with the lag the standby measured; its issuance writes on
// the primary. Then, with the standby's replay paused and a coupon issued on the primary that
// the standby has received but not replayed (its measured lag past the 1 ms bound), that
// member's dry run falls back to the primary and answers the primary's truth, ALREADY_ISSUED,
// without a lag, and coupon.dry_run.fallbacks counts it. The broken variant (ignoringLag in
// place of lagWithin) answers from the standby, AVAILABLE: the check must see it. Last, with the
// standby cut off from the primary (no WAL receiver), a coupon it never receives: the dry run
// goes to the primary whatever the bound; the broken variant, lagBlindToTheReceiver, reads the
// standby as fresh.
func TestDryRunsOnTheReadPool(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	otel.SetMeterProvider(mp)
	primary, standby := readPoolServers(t, ctx)
	admin, replica := connectTo(t, ctx, primary.URL()), connectTo(t, ctx, standby.URL())

	t.Run("herd on the standby", func(t *testing.T) {
		const herd = 24
		writes, reads := appPool(t, ctx, primary.URL(), "rp_herd"), appPool(t, ctx, standby.URL(), "rp_herd")
		s, err := New(writes, Config{})
		if err != nil {
			t.Fatal(err)
		}
		s.UseReadPool(reads)
		start := make(chan struct{})
		outs := make([]DryRunOutcome, herd)
		errs := make([]error, herd)
		var wg sync.WaitGroup
		for i := range herd {
			wg.Go(func() {
				<-start
				outs[i], errs[i] = s.DryRun(ctx, fmt.Sprintf("h%02d", i), "RP")
			})
		}
		close(start)
		wg.Wait()
		for i, out := range outs {
			if errs[i] != nil || out.Result != ResultAvailable || out.ReadLag == nil {
				t.Errorf("dry run %d: %+v, %v; want AVAILABLE with the read pool's lag", i, out, errs[i])
			}
		}
		issued, err := s.Issue(ctx, "h00", "RP")
		if err != nil || issued.Result != ResultIssued {
			t.Fatalf("issue: %+v, %v", issued, err)
		}
		dry := functionCalls(t, ctx, "rp_herd", "issue_dry_run_batch", []*pgxpool.Pool{writes, reads}, admin, replica)
		if dry[0] != 0 || dry[1] == 0 {
			t.Errorf("calls of issue_dry_run_batch: %d on the primary, %d on the standby; want none on the primary", dry[0], dry[1])
		}
		t.Logf("%d dry runs: %d calls of issue_dry_run_batch on the standby, %d on the primary; lag %s", herd, dry[1], dry[0], *outs[0].ReadLag)
		var coupons int
		if err := admin.QueryRow(ctx, `SELECT count(*)::int FROM issued_coupons WHERE member_id = 'h00'`).Scan(&coupons); err != nil || coupons != 1 {
			t.Errorf("coupons of h00 on the primary: %d (%v); want 1", coupons, err)
		}
	})

	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("lagging standby, broken=", broken), func(t *testing.T) {
			if broken {
				saved := lagWithin
				lagWithin = ignoringLag
				t.Cleanup(func() { lagWithin = saved })
			}
			pgtest.Verdict(t, broken, laggingStandby(t, ctx, primary, standby, reader, fmt.Sprint("lag", broken)))
		})
	}

	// Last: the standby is cut off from the primary for the rest of the test.
	cutOff(t, ctx, replica)
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("standby cut off, broken=", broken), func(t *testing.T) {
			if broken {
				saved := sqlDryRunBatchLagged
				sqlDryRunBatchLagged = dryRunBatchLagged(lagBlindToTheReceiver)
				t.Cleanup(func() { sqlDryRunBatchLagged = saved })
			}
			pgtest.Verdict(t, broken, cutOffStandby(t, ctx, primary, standby, reader, fmt.Sprint("cut", broken)))
		})
	}
}

// cutOff stops the WAL receiver of the standby replica is connected to (primary_conninfo
// emptied and reloaded) and waits until pg_stat_wal_receiver shows none.
func cutOff(t *testing.T, ctx context.Context, replica *pgx.Conn) {
	t.Helper()
	for _, q := range []string{`ALTER SYSTEM SET primary_conninfo = ''`, `SELECT pg_reload_conf()`} {
		if _, err := replica.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		var receivers int
		if err := replica.QueryRow(ctx, `SELECT count(*)::int FROM pg_stat_wal_receiver`).Scan(&receivers); err != nil {
			return err
		}
		if receivers > 0 {
			return errors.New("the standby's WAL receiver still runs")
		}
		return nil
	})
}

// cutOffStandby issues member's coupon of RP on primary, which standby, cut off, never receives,
// and asks a Service whose read pool is standby's, with a bound of an hour, for member's dry
// run. It returns what is wrong with the answer: anything but the primary's ALREADY_ISSUED
// without a lag (a standby that cannot tell its lag does not answer), or a fallback not counted.
func cutOffStandby(t *testing.T, ctx context.Context, primary, standby *localpg.Server, reader *sdkmetric.ManualReader, member string) []string {
	t.Helper()
	writes, reads := appPool(t, ctx, primary.URL(), "rp_cut"), appPool(t, ctx, standby.URL(), "rp_cut")
	s, err := New(writes, Config{DryRunMaxLag: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s.UseReadPool(reads)
	issued, err := s.Issue(ctx, member, "RP")
	if err != nil || issued.Result != ResultIssued {
		t.Fatalf("issue: %+v, %v", issued, err)
	}
	before := fallbacks(t, reader, fallbackLag)
	out, err := s.DryRun(ctx, member, "RP")
	var problems []string
	if err != nil || out.Result != ResultAlreadyIssued || out.CouponID != issued.CouponID || out.ReadLag != nil {
		problems = append(problems, fmt.Sprintf("the dry run of %s answered %s (coupon %q, lag %v, err %v); want the primary's ALREADY_ISSUED %s without a lag",
			member, out.Result, out.CouponID, out.ReadLag, err, issued.CouponID))
	}
	if n := fallbacks(t, reader, fallbackLag) - before; n != 1 {
		problems = append(problems, fmt.Sprintf("%d dry runs counted in %s{reason=lag}; want 1", n, telemetry.MetricDryRunFallbacks))
	}
	return problems
}

// laggingStandby pauses standby's replay, issues member's coupon of RP on primary, waits until
// standby has received it and measures its lag past 1 ms, then asks a Service whose read pool is
// standby's, with a bound of 1 ms, for member's dry run; it resumes the replay before it returns.
// It returns what is wrong with the answer: anything but the primary's ALREADY_ISSUED without a
// lag, or a fallback not counted.
func laggingStandby(t *testing.T, ctx context.Context, primary, standby *localpg.Server, reader *sdkmetric.ManualReader, member string) []string {
	t.Helper()
	writes, reads := appPool(t, ctx, primary.URL(), "rp_lag"), appPool(t, ctx, standby.URL(), "rp_lag")
	s, err := New(writes, Config{DryRunMaxLag: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.UseReadPool(reads)
	replica := connectTo(t, ctx, standby.URL())
	// A lag is measured from the last transaction replayed: the standby replays one first.
	if before, err := s.Issue(ctx, member+"-before", "RP"); err != nil || before.Result != ResultIssued {
		t.Fatalf("issue: %+v, %v", before, err)
	}
	var written string
	if err := connectTo(t, ctx, primary.URL()).QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&written); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		var replayed bool
		if err := replica.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, written).Scan(&replayed); err != nil {
			return err
		}
		if !replayed {
			return fmt.Errorf("the standby has not replayed the WAL to %s", written)
		}
		return nil
	})
	if _, err := replica.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := replica.Exec(ctx, `SELECT pg_wal_replay_resume()`); err != nil {
			t.Error(err)
		}
	}()
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		var state string
		if err := replica.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state); err != nil {
			return err
		}
		if state != "paused" {
			return fmt.Errorf("replay %s", state)
		}
		return nil
	})
	issued, err := s.Issue(ctx, member, "RP")
	if err != nil || issued.Result != ResultIssued {
		t.Fatalf("issue: %+v, %v", issued, err)
	}
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		var lagUs *int64
		if err := replica.QueryRow(ctx, `SELECT lag_us FROM `+sqlReadLag).Scan(&lagUs); err != nil {
			return err
		}
		if lagUs == nil || *lagUs <= time.Millisecond.Microseconds() {
			return fmt.Errorf("the standby measures its lag as %s", lagText(lagUs))
		}
		return nil
	})
	before := fallbacks(t, reader, fallbackLag)
	out, err := s.DryRun(ctx, member, "RP")
	var problems []string
	if err != nil || out.Result != ResultAlreadyIssued || out.CouponID != issued.CouponID || out.ReadLag != nil {
		lag := "no lag"
		if err == nil && out.ReadLag != nil {
			lag = fmt.Sprint("a lag of ", *out.ReadLag)
		}
		problems = append(problems, fmt.Sprintf("the dry run of %s answered %s (coupon %q, %s, err %v); want the primary's ALREADY_ISSUED %s without a lag",
			member, out.Result, out.CouponID, lag, err, issued.CouponID))
	}
	if n := fallbacks(t, reader, fallbackLag) - before; n != 1 {
		problems = append(problems, fmt.Sprintf("%d dry runs counted in %s{reason=lag}; want 1", n, telemetry.MetricDryRunFallbacks))
	}
	return problems
}

// lagText is a measured lag in us for a message: "unknown" when nil.
func lagText(lagUs *int64) string {
	if lagUs == nil {
		return "unknown"
	}
	return fmt.Sprint(*lagUs, " us")
}
