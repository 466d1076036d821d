package isolationlab_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/lab/isolationlab"
)

// smallFriday is the black-friday load scaled down: 100 coupons of 1,000 yen, 1,000 members;
// preallocated with 4 instances leasing 20 coupons, instance 0 dying after it issued 5.
func smallFriday() isolationlab.FirstCome {
	l := isolationlab.BlackFriday()
	l.Members, l.BudgetCoupons = 1_000, 100
	l.Instances, l.LeaseCoupons, l.KillAfter = 4, 20, 5
	return l
}

func runFriday(t *testing.T, s isolationlab.FirstComeStrategy, workers int) isolationlab.FirstComeMeasurement {
	t.Helper()
	m, err := isolationlab.RunFirstCome(context.Background(), s, workers, 1, smallFriday(), fresh(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %+v", s.Name, m)
	if m.Errors > 0 {
		t.Fatalf("%s: %d requests got no result, first: %s", s.Name, m.Errors, m.FirstErr)
	}
	return m
}

// TestBlackFridayIssuesExactlyTheBudget: at 32 clients, one row, 16 stripes and SERIALIZABLE
// each issue exactly the 100 coupons, nothing over, no rule broken, and no BUDGET_EXCEEDED while
// the committed coupons were below the budget. RETRY_EXHAUSTED is re-sent as the app does.
func TestBlackFridayIssuesExactlyTheBudget(t *testing.T) {
	for _, name := range []string{"good", "stripes-16", "serializable"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, err := isolationlab.FirstComeStrategyNamed(name)
			if err != nil {
				t.Fatal(err)
			}
			m := runFriday(t, s, 32)
			if m.Coupons != 100 || m.OvershootYen != 0 || m.StrandedYen != 0 || m.Violations != 0 {
				t.Errorf("%s: %d coupons, overshoot %d yen, counter drift %d yen, %d violations; want exactly 100 and none",
					name, m.Coupons, m.OvershootYen, m.StrandedYen, m.Violations)
			}
			if m.FalseRejections != 0 || m.RefusedBeforeLaterIssue != 0 {
				t.Errorf("%s: %d BUDGET_EXCEEDED answers while budget remained, want 0", name, m.FalseRejections)
			}
			if m.GaveUp != 0 {
				t.Errorf("%s: %d requests still RETRY_EXHAUSTED after the re-sends", name, m.GaveUp)
			}
		})
	}
}

// TestBlackFridayPreallocatedStrandsTheDeadSlice: pre-allocation never overshoots, and the
// slice of the instance that died is stranded: the budget counter holds it, no coupon does, and
// every other coupon of the budget was issued.
func TestBlackFridayPreallocatedStrandsTheDeadSlice(t *testing.T) {
	t.Parallel()
	s, err := isolationlab.FirstComeStrategyNamed("preallocated")
	if err != nil {
		t.Fatal(err)
	}
	// 8 workers: when instance 0 dies, after 5 issued of its first slice of 20, at most 7 more
	// of its slots are in flight (and may still issue), so at least 8 coupons of it are stranded
	// however the requests are scheduled. With 32 workers a slow start could hand out the whole
	// slice before the fifth issue.
	m := runFriday(t, s, 8)
	if m.OvershootYen != 0 || m.Violations != 0 {
		t.Errorf("overshoot %d yen, %d violations; want none", m.OvershootYen, m.Violations)
	}
	if m.StrandedYen < 8*1000 || m.StrandedYen%1000 != 0 {
		t.Errorf("stranded %d yen, want the dead instance's unused slice, at least 8 whole coupons", m.StrandedYen)
	}
	if m.RefusedBeforeLaterIssue > m.FalseRejections {
		t.Errorf("%d refused before a later issue > %d refused below the budget", m.RefusedBeforeLaterIssue, m.FalseRejections)
	}
	if got := m.Coupons + m.StrandedYen/1000; got != 100 {
		t.Errorf("%d coupons + %d yen stranded = %d coupons' worth, want the whole budget of 100", m.Coupons, m.StrandedYen, got)
	}
}

// TestBlackFridayCountsFalseRejections checks the false-rejection count on a stand-in that
// answers BUDGET_EXCEEDED to every request without writing: with nothing ever issued, every
// answer is a false rejection, and the count must say so (it is 0 for the strategies above).
func TestBlackFridayCountsFalseRejections(t *testing.T) {
	t.Parallel()
	refuses := isolationlab.FirstComeStrategy{Name: "always-refuses", Stripes: 1,
		New: func(isolationlab.FirstComeEnv) (isolationlab.IssueFunc, func(context.Context) (int, error), error) {
			return func(context.Context, string, string) (isolationlab.Outcome, error) {
				return isolationlab.Outcome{Result: "BUDGET_EXCEEDED", Attempts: 1}, nil
			}, nil, nil
		}}
	m := runFriday(t, refuses, 8)
	if m.FalseRejections != int64(m.Requests) || m.RefusedBeforeLaterIssue != 0 || m.LostCoupons() != 100 {
		t.Errorf("%d false rejections of %d requests (%d before a later issue), %d coupons lost; want every request (none, no issue came later) and all 100",
			m.FalseRejections, m.Requests, m.RefusedBeforeLaterIssue, m.LostCoupons())
	}
	var buf bytes.Buffer
	if err := isolationlab.WriteFirstComeTable(&buf, "markdown", []isolationlab.FirstComeMeasurement{m}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "| false rejections |") || strings.Count(buf.String(), "\n") != 3 {
		t.Errorf("markdown table:\n%s", buf.String())
	}
}

// TestBlackFridayCatchesTheBeforeCode runs the incident's code through the same first-come load,
// the first 32 requests held in their transactions by a gate in the push until all have read the
// counter (pushGate): its lost updates on the budget counter must show as coupons over the
// budget, which proves that the exact-budget checks above can fail.
func TestBlackFridayCatchesTheBeforeCode(t *testing.T) {
	t.Parallel()
	gate := newPushGate(t, 32)
	before := isolationlab.FirstComeStrategy{Name: "before", Stripes: 1, BeforeSchema: true,
		New: func(env isolationlab.FirstComeEnv) (isolationlab.IssueFunc, func(context.Context) (int, error), error) {
			b := &isolationlab.Before{Pool: env.Pool, CapYen: env.Load.CapYen, Month: "2026-11", Push: gate.wrap(nil)}
			return b.IssueOutcome, nil, nil
		}}
	m := runFriday(t, before, 32)
	if m.Coupons <= 100 || m.OvershootYen == 0 || m.Violations == 0 {
		t.Errorf("before: %d coupons, overshoot %d yen, %d violations; want the budget broken and counted", m.Coupons, m.OvershootYen, m.Violations)
	}
}
