package legacy_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/legacy"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/issuance"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// legacyDDL is production's schema before the migration, as the Before code left it
// (docs/migration.md, "Legacy tables"): no unique index, no CHECK, no usage table, no outbox.
const legacyDDL = `
CREATE TABLE campaigns (campaign_id text PRIMARY KEY, discount_yen integer NOT NULL, budget_yen integer NOT NULL,
                        issued_yen integer NOT NULL DEFAULT 0);
CREATE TABLE issued_coupons (coupon_id uuid PRIMARY KEY, campaign_id text NOT NULL REFERENCES campaigns,
                             member_id text NOT NULL, month text NOT NULL, amount_yen integer NOT NULL,
                             issued_at timestamptz NOT NULL DEFAULT now(), redeemed_at timestamptz)`

// septDay is 10:00 JST on 20 September 2026, inside Silver Week.
var septDay = time.Date(2026, 9, 20, 10, 0, 0, 0, issuance.Tokyo)

// legacyDB returns a pool on a new database holding the legacy tables.
func legacyDB(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	exec(t, pool, legacyDDL)
	return pool
}

func exec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func scalar[T any](t *testing.T, pool *pgxpool.Pool, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func migrate(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := schema.MigrateURL(context.Background(), pool.Config().ConnString()); err != nil {
		t.Fatal(err)
	}
}

func service(t *testing.T, pool *pgxpool.Pool) *issuance.Service {
	t.Helper()
	pgtest.SetClock(t, pool, septDay)
	svc, err := issuance.New(pool, issuance.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func issue(t *testing.T, svc *issuance.Service, member, campaignID string) issuance.Outcome {
	t.Helper()
	out, err := svc.Issue(context.Background(), member, campaignID)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSeedExample is the small dirty database of docs/design.md ("Migrating data that is
// already broken"): m1 and m3 each hold an unredeemed and a redeemed SW-A coupon, and SW-A's live
// coupons reach 3,000 yen against a 2,000 yen budget while its counter says 2,000. After the migration the redeemed coupon of each pair
// stays live, the other is voided and marked; SW-A stays at 3,000 yen (recorded as a legacy
// overshoot, not drift); a new SW-A issue is BUDGET_EXCEEDED and m1's re-issue ALREADY_ISSUED
// with its live coupon.
func TestSeedExample(t *testing.T) {
	t.Parallel()
	pool := legacyDB(t, 4)
	exec(t, pool, `
INSERT INTO campaigns VALUES ('SW-A', 1000, 2000, 2000), ('SW-B', 1000, 300000, 1000);
INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, redeemed_at) VALUES
 ('00000000-0000-0000-0000-0000000000a1', 'SW-A', 'm1', '2026-09', 1000, '2026-09-19 10:00+09', NULL),
 ('00000000-0000-0000-0000-0000000000a2', 'SW-A', 'm1', '2026-09', 1000, '2026-09-19 10:00:00.03+09', '2026-09-21 12:00+09'),
 ('00000000-0000-0000-0000-0000000000a3', 'SW-A', 'm3', '2026-09', 1000, '2026-09-19 11:00+09', '2026-09-22 12:00+09'),
 ('00000000-0000-0000-0000-0000000000a4', 'SW-A', 'm3', '2026-09', 1000, '2026-09-19 11:00:00.02+09', NULL),
 ('00000000-0000-0000-0000-0000000000a5', 'SW-A', 'm2', '2026-10', 1000, '2026-09-30 23:30+09', NULL),
 ('00000000-0000-0000-0000-0000000000b1', 'SW-B', 'm1', '2026-09', 1000, '2026-09-19 12:00+09', NULL)`)

	rep, err := legacy.Read(context.Background(), pool, issuance.DefaultMonthlyCapYen)
	if err != nil {
		t.Fatal(err)
	}
	if rep.DuplicatePairs != 2 || rep.RedeemedPairs != 2 || rep.ToVoid != 2 || rep.KeptRedeemed != 0 || rep.ClientMonthWrong != 1 {
		t.Errorf("legacy report %+v: want 2 duplicate pairs, both redeemed, 2 to void, 1 wrong client month", rep)
	}
	if rep.OvershootYen() != 1000 {
		t.Errorf("overshoot %d yen, want 1000 (SW-A: 3,000 live against 2,000)", rep.OvershootYen())
	}

	migrate(t, pool)
	type state struct {
		ID               string
		Voided, Legacy   bool
		Month, ClientMon string
	}
	rows, err := pool.Query(context.Background(), `SELECT coupon_id::text, voided_at IS NOT NULL, legacy_duplicate, month, client_month
		FROM issued_coupons ORDER BY coupon_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[state])
	if err != nil {
		t.Fatal(err)
	}
	want := []state{
		{"00000000-0000-0000-0000-0000000000a1", true, true, "2026-09", "2026-09"},   // m1 unredeemed duplicate
		{"00000000-0000-0000-0000-0000000000a2", false, false, "2026-09", "2026-09"}, // m1 redeemed: live
		{"00000000-0000-0000-0000-0000000000a3", false, false, "2026-09", "2026-09"}, // m3 redeemed: live
		{"00000000-0000-0000-0000-0000000000a4", true, true, "2026-09", "2026-09"},   // m3 unredeemed duplicate
		{"00000000-0000-0000-0000-0000000000a5", false, false, "2026-09", "2026-10"}, // the client's month was wrong
		{"00000000-0000-0000-0000-0000000000b1", false, false, "2026-09", "2026-09"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("coupons after the migration:\n got %v\nwant %v", got, want)
	}
	if n := scalar[int64](t, pool, `SELECT issued_yen FROM campaign_budgets WHERE campaign_id = 'SW-A'`); n != 3000 {
		t.Errorf("SW-A counter %d yen, want 3000 (rebuilt from the live coupons, over budget as it was)", n)
	}
	if n := scalar[int64](t, pool, `SELECT count(*) FROM notification_outbox WHERE sent_at IS NULL`); n != 0 {
		t.Errorf("%d legacy coupons left to push, want 0 (the Before code pushed them all)", n)
	}

	svc := service(t, pool)
	if out := issue(t, svc, "m9", "SW-A"); out.Result != issuance.ResultBudgetExceeded {
		t.Errorf("a new SW-A coupon: %+v, want BUDGET_EXCEEDED", out)
	}
	if out := issue(t, svc, "m1", "SW-A"); out.Result != issuance.ResultAlreadyIssued || out.CouponID != "00000000-0000-0000-0000-0000000000a2" {
		t.Errorf("m1 again: %+v, want ALREADY_ISSUED with the live (redeemed) coupon ...a2", out)
	}
	if out := issue(t, svc, "m2", "SW-B"); out.Result != issuance.ResultIssued {
		t.Errorf("m2 SW-B: %+v, want ISSUED", out)
	}
	rc, err := reconcile.Check(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if v := rc.Violations(); len(v) > 0 {
		t.Errorf("reconcile after the migration: %v, want no fault", v)
	}
	if f := rc.Facts(); len(f) == 0 || !strings.Contains(strings.Join(f, "\n"), "SW-A: 1000 yen over") {
		t.Errorf("reconcile facts %q: want SW-A's legacy overshoot of 1000 yen", f)
	}
}

// dirty is a generated legacy data set and what its figures must be, computed in Go.
type dirty struct {
	coupons, pairs, toVoid, keptRedeemed, wrongMonths int64
	live                                              map[string]int64 // campaign -> live yen
	budgets                                           map[string]int64
}

// generate fills the legacy tables with coupons of campaigns L00-L19 for members l0001..: random
// duplicates (double taps the Before code let through), redeemed flags, drifted counters and
// client months that are sometimes wrong, and computes the expected figures.
func generate(t testing.TB, pool *pgxpool.Pool, seed uint64, coupons int) dirty {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	d := dirty{live: map[string]int64{}, budgets: map[string]int64{}}
	var camps, ids, cids, members, months []string
	var amounts []int32
	var issued []time.Time
	var redeemed []*time.Time
	for c := range 20 {
		id := fmt.Sprintf("L%02d", c)
		budget := int64(rng.IntN(coupons/10)+coupons/40+1) * 1000 // about half the campaigns end over budget
		d.budgets[id] = budget
		camps = append(camps, id)
	}
	type key struct{ c, m string }
	byPair := map[key][]int{}
	start := time.Date(2026, 8, 1, 0, 0, 0, 0, issuance.Tokyo)
	for i := 0; len(ids) < coupons; i++ {
		c := camps[rng.IntN(len(camps))]
		m := fmt.Sprintf("l%04d", rng.IntN(coupons/3)+1)
		copies := 1
		if rng.IntN(10) == 0 { // a double tap the Before code let through, sometimes three
			copies = 2 + rng.IntN(2)
		}
		at := start.Add(time.Duration(rng.Int64N(int64(60 * 24 * time.Hour))))
		for k := range copies {
			n := len(ids)
			ids = append(ids, fmt.Sprintf("%08x-0000-4000-8000-%012x", i, k))
			cids = append(cids, c)
			members = append(members, m)
			amounts = append(amounts, 1000)
			when := at.Add(time.Duration(k*20) * time.Millisecond)
			issued = append(issued, when)
			month := when.In(issuance.Tokyo).Format("2006-01")
			if rng.IntN(10) == 0 { // the client chose a UTC or stale month
				month = when.UTC().AddDate(0, -1, 0).Format("2006-01")
			}
			if month != when.In(issuance.Tokyo).Format("2006-01") {
				d.wrongMonths++
			}
			months = append(months, month)
			var r *time.Time
			if rng.IntN(3) == 0 {
				rt := when.Add(48 * time.Hour)
				r = &rt
			}
			redeemed = append(redeemed, r)
			byPair[key{c, m}] = append(byPair[key{c, m}], n)
		}
	}
	d.coupons = int64(len(ids))
	for k, idx := range byPair {
		// the migration's rule: a redeemed coupon first, then the earliest, then the id
		sort.Slice(idx, func(a, b int) bool {
			ra, rb := redeemed[idx[a]] != nil, redeemed[idx[b]] != nil
			if ra != rb {
				return ra
			}
			if !issued[idx[a]].Equal(issued[idx[b]]) {
				return issued[idx[a]].Before(issued[idx[b]])
			}
			return ids[idx[a]] < ids[idx[b]]
		})
		if len(idx) > 1 {
			d.pairs++
		}
		for rank, n := range idx {
			switch {
			case rank == 0:
				d.live[k.c] += int64(amounts[n])
			case redeemed[n] != nil:
				d.keptRedeemed++
				d.live[k.c] += int64(amounts[n])
			default:
				d.toVoid++
			}
		}
	}
	batch := &pgx.Batch{}
	for _, c := range camps {
		// the Before code's counter drifted: lost updates under-count, re-tries over-count
		batch.Queue(`INSERT INTO campaigns VALUES ($1, 1000, $2, $3)`, c, d.budgets[c], max(0, d.live[c]+int64(rng.IntN(9)-4)*1000))
	}
	if err := pool.SendBatch(context.Background(), batch).Close(); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, redeemed_at)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::integer[], $6::timestamptz[], $7::timestamptz[])`,
		ids, cids, members, months, amounts, issued, redeemed)
	return d
}

// TestGeneratedDirtyData: a generated legacy data set through report, migrate and reconcile, then
// the Silver Week load on top. The report's figures match the ones computed in Go, the rebuilt
// counters equal the live coupons, reconcile finds no fault, and every rule holds after the load.
func TestGeneratedDirtyData(t *testing.T) {
	t.Parallel()
	pool := legacyDB(t, 32)
	d := generate(t, pool, 11, 3000)
	rep, err := legacy.Read(context.Background(), pool, issuance.DefaultMonthlyCapYen)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Coupons != d.coupons || rep.DuplicatePairs != d.pairs || rep.ToVoid != d.toVoid ||
		rep.KeptRedeemed != d.keptRedeemed || rep.ClientMonthWrong != d.wrongMonths {
		t.Errorf("report %d coupons, %d pairs, %d to void, %d kept redeemed, %d wrong months; want %d, %d, %d, %d, %d",
			rep.Coupons, rep.DuplicatePairs, rep.ToVoid, rep.KeptRedeemed, rep.ClientMonthWrong,
			d.coupons, d.pairs, d.toVoid, d.keptRedeemed, d.wrongMonths)
	}
	var overshoot int64
	for c, live := range d.live {
		overshoot += max(live-d.budgets[c], 0)
	}
	if rep.OvershootYen() != overshoot {
		t.Errorf("overshoot %d yen, want %d", rep.OvershootYen(), overshoot)
	}

	started := time.Now()
	migrate(t, pool)
	t.Logf("data set: %d coupons, %d duplicate pairs (%d voided, %d redeemed kept), %d wrong client months, %d yen over budget in %d campaigns; migrated in %s",
		d.coupons, d.pairs, d.toVoid, d.keptRedeemed, d.wrongMonths, overshoot, len(d.live), time.Since(started).Round(time.Millisecond))
	for c, live := range d.live {
		if n := scalar[int64](t, pool, `SELECT issued_yen FROM campaign_budgets WHERE campaign_id = $1`, c); n != live {
			t.Errorf("%s counter %d yen, want its live coupons' %d", c, n, live)
		}
	}
	checkNoFault(t, pool)

	// The Silver Week load on top, on its own campaigns and members.
	for _, c := range silverweek.Campaigns {
		if err := campaign.Create(context.Background(), pool, campaign.Campaign{ID: c.ID, DiscountYen: c.DiscountYen, BudgetYen: c.BudgetYen}); err != nil {
			t.Fatal(err)
		}
	}
	svc := service(t, pool)
	var resends atomic.Int64
	reqs := silverweek.Requests(silverweek.DefaultMembers, silverweek.Campaigns, silverweek.DefaultTapGap, 1)
	stats := silverweek.Run(context.Background(), reqs, 32, silverweek.Resending(func(ctx context.Context, r silverweek.Request) (string, error) {
		out, err := svc.Issue(ctx, r.MemberID, r.CampaignID)
		return string(out.Result), err
	}, &resends), nil)
	if stats.Errors > 0 {
		t.Fatalf("%d requests failed: %v", stats.Errors, stats.FirstErr)
	}
	if n := scalar[int64](t, pool, `SELECT count(*) FROM issued_coupons WHERE campaign_id LIKE 'SW-%'`); n != 600 {
		t.Errorf("Silver Week coupons: %d, want 600", n)
	}
	checkNoFault(t, pool)
}

func checkNoFault(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	rc, err := reconcile.Check(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if v := rc.Violations(); len(v) > 0 {
		t.Errorf("reconcile faults: %v", v)
	}
}

// catalog describes a schema: tables and columns, constraints and indexes, one line each.
func catalog(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' null=' || is_nullable ||
       ' default=' || COALESCE(column_default, '') || ' #' || ordinal_position
  FROM information_schema.columns WHERE table_schema = 'public' AND table_name <> 'goose_db_version'
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid) || ' valid=' || convalidated
  FROM pg_constraint WHERE connamespace = 'public'::regnamespace AND conrelid <> 'goose_db_version'::regclass
UNION ALL
SELECT 'index ' || indexname || ' ' || indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename <> 'goose_db_version'
UNION ALL
SELECT 'valid index ' || indexrelid::regclass || ' ' || indisvalid FROM pg_index WHERE indrelid IN
  (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)
ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// contents is a digest of every table's rows, for "nothing changed".
func contents(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var b strings.Builder
	for _, table := range []string{"campaigns", "campaign_budgets", "issued_coupons", "member_monthly_usage", "notification_outbox", "legacy_overshoot"} {
		fmt.Fprintf(&b, "%s %s\n", table, scalar[string](t, pool, `SELECT md5(COALESCE(string_agg(t::text, '|' ORDER BY t::text), '')) FROM `+table+` t`))
	}
	return b.String()
}

// TestBothWorldsEndAlike: the migrations on an empty database and on a database holding the
// legacy tables end with the same tables, columns, constraints and indexes; a second migration
// of the legacy database changes nothing.
func TestBothWorldsEndAlike(t *testing.T) {
	t.Parallel()
	empty := pgtest.Pool(t, 2) // an empty database migrated as the test harness does
	old := legacyDB(t, 4)
	generate(t, old, 3, 500)
	migrate(t, old)
	a, b := catalog(t, empty), catalog(t, old)
	if strings.Join(a, "\n") != strings.Join(b, "\n") {
		t.Errorf("schemas differ\nempty database:\n  %s\nlegacy database:\n  %s", strings.Join(a, "\n  "), strings.Join(b, "\n  "))
	}
	before := contents(t, old)
	applied, err := schema.MigrateURL(context.Background(), old.Config().ConnString())
	if err != nil || len(applied) != 0 {
		t.Errorf("second migration applied %v, %v; want nothing", applied, err)
	}
	if after := contents(t, old); after != before {
		t.Errorf("the second migration changed the tables:\n%s\nvs\n%s", before, after)
	}
}

// TestMigrationGivesUpOnALongTransaction: a long transaction holds issued_coupons (a report
// running for minutes). The migration step that must alter the table waits at most its
// lock_timeout, then gives up with 55P03 and writes nothing; a reader that queued behind it goes
// on. Run again once the table is free, the migration completes.
func TestMigrationGivesUpOnALongTransaction(t *testing.T) {
	t.Parallel()
	pool := legacyDB(t, 6)
	generate(t, pool, 5, 200)
	ctx := context.Background()
	long, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Rollback(ctx)
	if _, err := long.Exec(ctx, `SELECT count(*) FROM issued_coupons`); err != nil {
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() {
		_, err := schema.MigrateURL(ctx, pool.Config().ConnString())
		migrated <- err
	}()
	// Wait until the migration waits for the table, then queue a reader behind it.
	longPID := int(long.Conn().PgConn().PID())
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if len(migrated) > 0 {
			t.Fatalf("the migration ended (%v) before it was seen waiting for the table", <-migrated)
		}
		if pgtest.BlockedBy(t, pool, longPID) == 0 {
			return errors.New("the migration does not wait for the table yet")
		}
		return nil
	})
	read := make(chan error, 1)
	go func() {
		var n int64
		read <- pool.QueryRow(ctx, `SELECT count(*) FROM issued_coupons`).Scan(&n)
	}()
	err = <-migrated
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.LockNotAvailable {
		t.Fatalf("migration with the table held: %v, want 55P03 lock_not_available", err)
	}
	if err := <-read; err != nil {
		t.Errorf("the queued reader: %v", err)
	}
	if scalar[bool](t, pool, `SELECT to_regclass('campaign_budgets') IS NOT NULL OR EXISTS (
		SELECT 1 FROM information_schema.columns WHERE table_name = 'issued_coupons' AND column_name = 'voided_at')`) {
		t.Error("the failed step left part of its work behind")
	}
	if err := long.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	migrate(t, pool)
	checkNoFault(t, pool)
}

// TestInvalidIndexIsReplacedOrRefused: an interrupted concurrent build leaves an INVALID
// one_coupon_per_member that enforces nothing. While a live duplicate remains, the migration
// fails loudly (23505) and leaves no valid-looking index; once the duplicate is gone it drops the
// leftover and builds a valid index.
func TestInvalidIndexIsReplacedOrRefused(t *testing.T) {
	t.Parallel()
	pool := legacyDB(t, 4)
	ctx := context.Background()
	generate(t, pool, 9, 100)
	// Migrate up to 00002, then write a live duplicate (as a bug elsewhere might) and interrupt
	// a concurrent build over it.
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, schema.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `INSERT INTO issued_coupons (campaign_id, member_id, month, amount_yen)
		SELECT campaign_id, member_id, month, amount_yen FROM issued_coupons WHERE NOT legacy_duplicate LIMIT 1`)
	if _, err := pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY one_coupon_per_member
		ON issued_coupons (campaign_id, member_id) WHERE NOT legacy_duplicate`); err == nil {
		t.Fatal("the concurrent build over a duplicate succeeded")
	}
	if scalar[bool](t, pool, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'one_coupon_per_member'::regclass`) {
		t.Fatal("no INVALID leftover to test with")
	}
	_, err = schema.MigrateURL(ctx, pool.Config().ConnString())
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.UniqueViolation {
		t.Fatalf("migration over a live duplicate: %v, want 23505", err)
	}
	exec(t, pool, `DELETE FROM issued_coupons WHERE coupon_id = (SELECT coupon_id FROM issued_coupons
		WHERE client_month IS NULL AND NOT legacy_duplicate LIMIT 1)`)
	migrate(t, pool)
	if !scalar[bool](t, pool, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'one_coupon_per_member'::regclass`) {
		t.Error("one_coupon_per_member is not valid after the migration")
	}
}

// TestReconcileRepairAndRollback: a counter changed by hand is drift, named with its campaign and
// amount; Repair rebuilds it (and a usage row) from the live coupons; Rollback writes the
// counters back to campaigns.issued_yen for the Before code.
func TestReconcileRepairAndRollback(t *testing.T) {
	t.Parallel()
	pool := legacyDB(t, 8)
	generate(t, pool, 13, 300)
	migrate(t, pool)
	for _, c := range silverweek.Campaigns {
		if err := campaign.Create(context.Background(), pool, campaign.Campaign{ID: c.ID, DiscountYen: c.DiscountYen, BudgetYen: c.BudgetYen, Stripes: 4}); err != nil {
			t.Fatal(err)
		}
	}
	svc := service(t, pool)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() { issue(t, svc, silverweek.MemberID(i+1), "SW-B") })
	}
	wg.Wait()
	drifted := scalar[string](t, pool, `UPDATE campaign_budgets SET issued_yen = issued_yen - 3000
		WHERE campaign_id = (SELECT campaign_id FROM campaign_budgets WHERE campaign_id LIKE 'L%'
		                      AND issued_yen BETWEEN 3000 AND budget_yen ORDER BY campaign_id LIMIT 1)
		RETURNING campaign_id`)
	exec(t, pool, `UPDATE campaign_budgets SET issued_yen = 0 WHERE campaign_id = 'SW-B' AND stripe =
		(SELECT stripe FROM campaign_budgets WHERE campaign_id = 'SW-B' ORDER BY issued_yen DESC LIMIT 1)`)
	exec(t, pool, `UPDATE member_monthly_usage SET used_yen = used_yen + 1000 WHERE member_id = 'm0007'`)
	rc, err := reconcile.Check(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	v := strings.Join(rc.Violations(), "\n")
	for _, want := range []string{"R1 " + drifted, "drift -3000 yen", "R1 SW-B", "R3: 1 member-months whose used_yen"} {
		if !strings.Contains(v, want) {
			t.Errorf("violations %q: want %q", v, want)
		}
	}
	fixed, err := reconcile.Repair(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(fixed.Campaigns) != 2 || len(fixed.Usage) != 1 || len(fixed.Refused) != 0 {
		t.Errorf("repaired %+v: want 2 campaigns and 1 usage row", fixed)
	}
	checkNoFault(t, pool)
	if n := scalar[int64](t, pool, `SELECT count(*) FROM campaign_budgets WHERE issued_yen > budget_yen AND campaign_id LIKE 'SW-%'`); n != 0 {
		t.Errorf("%d SW-B stripes over their budget after the repair", n)
	}

	n, err := legacy.Rollback(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if n != 23 {
		t.Errorf("rollback wrote %d campaigns, want 23", n)
	}
	if bad := scalar[int64](t, pool, `SELECT count(*) FROM campaigns c
		WHERE issued_yen <> (SELECT SUM(issued_yen) FROM campaign_budgets b WHERE b.campaign_id = c.campaign_id)`); bad != 0 {
		t.Errorf("%d campaigns whose issued_yen is not their rebuilt counter after the rollback", bad)
	}
}

// BenchmarkMigrateLegacy migrates a generated legacy database of 100,000 coupons (fsync off, the
// test server): the time to migrate for docs/migration.md.
func BenchmarkMigrateLegacy(b *testing.B) {
	for range b.N {
		b.StopTimer()
		pool := legacyDB(b, 4)
		d := generate(b, pool, 21, 100_000)
		b.StartTimer()
		migrate(b, pool)
		b.StopTimer()
		b.ReportMetric(float64(d.coupons), "coupons")
		b.ReportMetric(float64(d.pairs), "dup_pairs")
		pool.Close()
		b.StartTimer()
	}
}
