package isolationlab_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"

	"github.com/mops/coupon-api/internal/lab/isolationlab"
	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// fresh hands each run a new migrated database of t's, dropped when t ends.
func fresh(t *testing.T) isolationlab.FreshDB {
	return func(context.Context) (string, func(), error) { return pgtest.URL(t), func() {}, nil }
}

// smallWeek is the Silver Week load scaled down: 40 members, SW-A with 10 coupons' budget so that
// it runs out, SW-B and SW-C with room for everyone. Right answer: 80 coupons (two per member).
func smallWeek() isolationlab.Load {
	l := isolationlab.SilverWeek()
	l.Members = 40
	l.Campaigns = []silverweek.Campaign{
		{ID: "SW-A", DiscountYen: 1000, BudgetYen: 10_000},
		{ID: "SW-B", DiscountYen: 1000, BudgetYen: 40_000},
		{ID: "SW-C", DiscountYen: 1000, BudgetYen: 40_000},
	}
	return l
}

func runOne(t *testing.T, name string, workers, run int, load isolationlab.Load) isolationlab.Measurement {
	t.Helper()
	s, err := isolationlab.StrategyNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	return runStrategy(t, s, workers, run, load)
}

func runStrategy(t *testing.T, s isolationlab.Strategy, workers, run int, load isolationlab.Load) isolationlab.Measurement {
	t.Helper()
	name := s.Name
	m, err := isolationlab.RunOne(context.Background(), s, workers, run, load, fresh(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s workers=%d: coupons %d, campaigns %+v, R2 %d, R3 %d, pushes %d (w/o coupon %d), retries %d, exhausted %d, errors %d %s",
		name, workers, m.Coupons, m.Campaigns, m.DuplicatePairs, m.MembersOverCap, m.Pushes, m.PushesWithoutCoupon,
		m.Retries, m.Exhausted, m.Errors, m.FirstErr)
	return m
}

// TestGoodAndSerializableHoldTheRules: the production path and the SERIALIZABLE proposal break
// no rule, counted with SQL after the run.
func TestGoodAndSerializableHoldTheRules(t *testing.T) {
	for _, name := range []string{"good", "serializable"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := runOne(t, name, 8, 1, smallWeek())
			if m.Errors > 0 {
				t.Fatalf("%d requests got no result, first: %s", m.Errors, m.FirstErr)
			}
			if v := m.Violations(); v != 0 {
				t.Errorf("%d violations, want 0", v)
			}
			// Right answer 80 coupons; each RETRY_EXHAUSTED wrote nothing and may cost its member
			// one coupon, so a loaded machine moves the count down by at most that many.
			if m.Coupons > 80 || m.Coupons < 80-int64(m.Exhausted) || m.Coupons == 0 {
				t.Errorf("%s: %d coupons with %d RETRY_EXHAUSTED, want 80 minus at most one per RETRY_EXHAUSTED",
					name, m.Coupons, m.Exhausted)
			}
			if name == "good" {
				if m.Pushes != m.Coupons {
					t.Errorf("good: %d outbox rows for %d coupons, want one each", m.Pushes, m.Coupons)
				}
			}
		})
	}
}

// TestBeforeBreaksR1AndR2: the incident's code loses updates on the budget counter (R1) and
// inserts duplicates (R2) under the same load, its races made to happen by a gate in its push
// (pushGate): the first 16 requests, two members' taps and some of a third's, all read before
// any writes. This proves the checks can fail.
func TestBeforeBreaksR1AndR2(t *testing.T) {
	t.Parallel()
	m := runStrategy(t, gated(t, "before", 16), 16, 1, smallWeek())
	r1 := false
	for _, c := range m.Campaigns {
		if c.OvershootYen > 0 || c.CounterYen != c.ActualYen {
			r1 = true
		}
	}
	if !r1 {
		t.Errorf("before: no R1 violation seen (overshoot or counter drift): %+v", m.Campaigns)
	}
	if m.DuplicatePairs == 0 {
		t.Errorf("before: no R2 duplicate pair seen")
	}
}

// TestRepeatableReadLetsTheWriteSkewThrough: one member asks for ten campaigns at once, each
// twice, all 20 requests held in their transactions by a gate in the push (pushGate) until each
// has read. At REPEATABLE READ every transaction sums the member's coupons in its own snapshot,
// finds none, and writes a row of a different campaign: nothing collides, so R3 breaks (write
// skew). The double taps do collide on the campaign row (40001), so R1 and R2 hold, and the
// pushes sent before the 40001 are for coupons that never existed.
func TestRepeatableReadLetsTheWriteSkewThrough(t *testing.T) {
	t.Parallel()
	ids, err := isolationlab.CampaignLetters(10)
	if err != nil {
		t.Fatal(err)
	}
	load := isolationlab.SilverWeek()
	load.Members = 1
	load.TapGap = 0
	load.Campaigns = nil
	for _, id := range ids {
		load.Campaigns = append(load.Campaigns, silverweek.Campaign{ID: id, DiscountYen: 1000, BudgetYen: 100_000})
	}
	workers := 2 * len(ids) // every request at once
	m := runStrategy(t, gated(t, "repeatable-read", workers), workers, 1, load)
	if m.DuplicatePairs != 0 || m.CounterDriftYen != 0 || m.OvershootYen() != 0 {
		t.Errorf("R1/R2 broken at REPEATABLE READ (R2 %d, drift %d yen, overshoot %d yen); want them held by 40001",
			m.DuplicatePairs, m.CounterDriftYen, m.OvershootYen())
	}
	if m.MembersOverCap == 0 {
		t.Errorf("repeatable-read: no member over the cap; the write skew was not caught")
	}
	if m.PushesWithoutCoupon == 0 {
		t.Errorf("repeatable-read: no push for a rolled-back coupon")
	}
}

// TestWriteTableAndChart renders two hand-made measurements in every format and as a chart.
func TestWriteTableAndChart(t *testing.T) {
	t.Parallel()
	ms := []isolationlab.Measurement{
		{Strategy: "before", Workers: 8, Run: 1, Requests: 1800, Coupons: 1500, CounterDriftYen: 900_000,
			Campaigns: []isolationlab.CampaignFigures{{CampaignID: "SW-A", BudgetYen: 100_000, CounterYen: 100_000,
				ActualYen: 400_000, OvershootYen: 300_000}},
			DuplicatePairs: 300, Retries: 0, Exhausted: 2},
		{Strategy: "good", Workers: 8, Run: 1, Requests: 1800, Coupons: 600, Retries: 18,
			Campaigns: []isolationlab.CampaignFigures{{CampaignID: "SW-A", BudgetYen: 100_000, CounterYen: 100_000,
				ActualYen: 100_000}}},
	}
	for _, format := range isolationlab.Formats {
		var buf bytes.Buffer
		if err := isolationlab.WriteTable(&buf, format, ms); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		out := buf.String()
		switch format {
		case "markdown":
			if lines := strings.Count(out, "\n"); lines != 4 || !strings.Contains(out, "| R1 over SW-A (yen) |") {
				t.Errorf("markdown: %d lines, want header, rule and two rows:\n%s", lines, out)
			}
		case "csv":
			rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
			if err != nil || len(rows) != 3 || rows[0][4] != "r1_overshoot_yen_SW-A" || rows[1][4] != "300000" {
				t.Errorf("csv: %v, %v", rows, err)
			}
		case "json":
			var back []isolationlab.Measurement
			if err := json.Unmarshal(buf.Bytes(), &back); err != nil || len(back) != 2 || back[0].DuplicatePairs != 300 {
				t.Errorf("json: %v, %+v", err, back)
			}
		case "text":
			if !strings.Contains(out, "RETRY_EXHAUSTED") || strings.Count(out, "\n") != 3 {
				t.Errorf("text:\n%s", out)
			}
		}
	}
	if ms[1].RetriedPct() != 1 {
		t.Errorf("retried %%: %v, want 1 (18 retries in 1800 requests)", ms[1].RetriedPct())
	}
	if err := isolationlab.WriteTable(&bytes.Buffer{}, "yaml", ms); err == nil {
		t.Errorf("format yaml: no error")
	}
	var png bytes.Buffer
	if err := isolationlab.WriteChart(&png, ms, 20*vg.Centimeter, 15*vg.Centimeter, "png"); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png.Bytes(), []byte("\x89PNG")) {
		t.Errorf("chart is not a PNG (%d bytes)", png.Len())
	}
}

// TestBeforeCodeIsCaught runs the incident's Before code through the full Silver Week traffic, its
// races made to happen (pushGate), and the same table check the issuance tests use
// (silverweek.Verify): the check must see it break R1
// (lost update on the counter, budget overshoot) and R2 (duplicates). This proves that check,
// which passes on the production path, can fail.
func TestBeforeCodeIsCaught(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, 32)
	if err := silverweek.CreateCampaigns(ctx, pool, silverweek.Campaigns); err != nil {
		t.Fatal(err)
	}
	if err := isolationlab.BreakSchema(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// Its races made to happen: the first 32 requests (every worker's first) all read before
	// any writes (pushGate).
	before := &isolationlab.Before{Pool: pool, CapYen: issuance.DefaultMonthlyCapYen, Month: "2026-09",
		Push: newPushGate(t, 32).wrap(nil)}
	reqs := silverweek.Requests(silverweek.DefaultMembers, silverweek.Campaigns, silverweek.DefaultTapGap, 32)
	silverweek.Run(ctx, reqs, 32, func(ctx context.Context, r silverweek.Request) (string, error) {
		return before.Issue(ctx, r.MemberID, r.CampaignID)
	}, nil)
	wrong, err := silverweek.Verify(ctx, pool, silverweek.DefaultMembers)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the check on the Before code:\n  %s", strings.Join(wrong, "\n  "))
	for _, rule := range []string{"R1 ", "R2:"} {
		if !slices.ContainsFunc(wrong, func(w string) bool { return strings.HasPrefix(w, rule) }) {
			t.Errorf("the check did not catch %s on the Before code", strings.TrimRight(rule, " :"))
		}
	}
}
