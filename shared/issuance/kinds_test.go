package issuance_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// The campaign kinds of issue 33 (00025_campaign_kinds.sql), judged inside issue_coupons_batch_v2
// and issue_dry_run_batch. The calls below go to the functions directly, on sessions without a
// lock_timeout, so that a call made to wait keeps waiting until the test lets it go.

// kindsDB is one test's migrated database: its URL, a pool as its owner (set-up, counts) and a
// pool as a coupon_issue login (the calls).
type kindsDB struct {
	url          string
	owner, issue *pgxpool.Pool
}

func newKindsDB(t *testing.T) kindsDB {
	t.Helper()
	dbURL := pgtest.URL(t)
	return kindsDB{url: dbURL, owner: prodPool(t, dbURL, 4), issue: prodPool(t, pgtest.LoginAs(t, dbURL, "coupon_issue"), 16)}
}

// create makes campaign id: 1,000 yen coupons, a budget of coupons over stripes, the releases
// given (instant to count), audience-only or not.
func (d kindsDB) create(t *testing.T, id string, coupons, stripes int, releases map[time.Time]int32, audienceOnly bool) {
	t.Helper()
	var at []time.Time
	var n []int32
	for a, c := range releases {
		at, n = append(at, a), append(n, c)
	}
	create := func() {
		if _, err := d.owner.Exec(context.Background(), `SELECT count(*) FROM campaign_create($1, 1000, $2, $3, NULL, NULL, NULL, NULL,
		'test', $4, $5, $6)`, id, coupons*1000, stripes, at, n, audienceOnly); err != nil {
			t.Fatal(err)
		}
	}
	if len(at) == 0 {
		create()
		return
	}
	// A release may have passed: the campaign is made a minute before its first (campaign_create
	// refuses a passed one, 00034).
	pgtest.AtClock(t, d.owner, slices.MinFunc(at, time.Time.Compare).Add(-time.Minute), create)
}

// sqlIssueOne issues one coupon of campaign $1 to member $2 through issue_coupons_batch_v2, and
// answers the result and the session's pid.
const sqlIssueOne = `SELECT result, pg_backend_pid() FROM issue_coupons_batch_v2($1, ARRAY[gen_random_uuid()], ARRAY[$2::text],
	ARRAY[now()], NULL, ARRAY[NULL::text])`

type called struct {
	result string
	err    error
}

// issueAsync issues member's coupon of campaignID on its own connection and sends the answer.
func (d kindsDB) issueAsync(campaignID, member string) <-chan called {
	done := make(chan called, 1)
	go func() {
		var c called
		var pid int
		c.err = d.issue.QueryRow(context.Background(), sqlIssueOne, campaignID, member).Scan(&c.result, &pid)
		done <- c
	}()
	return done
}

// releaseOnlyByReads is the broken variant of a release judged before the writes: the reads
// still refuse from the committed state (release_share), but the statements that lock and write
// a stripe no longer cap it by release_room.
var releaseOnlyByReads = [][2]string{
	{"(NOT v.releases OR release_room(", "(true OR release_room("},
	{"CASE WHEN v.releases THEN release_room(", "CASE WHEN false THEN release_room("},
}

// TestReleaseCapsTheStripeWrite: a release is judged on the stripe, in the statement that locks
// and writes it. Campaign DROP has 10 coupons of budget and 2 released. Another session holds
// its stripe; five members ask, each reads room (2 released, 0 issued) and waits for the stripe
// (pg_blocking_pids); the holder lets go. Exactly 2 coupons may commit, counted with SQL, the
// others answered BUDGET_EXCEEDED. The broken variant, the release judged only by the reads,
// lets all five through: a lost update of the released count, as a budget read before its row's
// lock would be.
func TestReleaseCapsTheStripeWrite(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			d := newKindsDB(t)
			if broken {
				pgtest.BreakFunction(t, d.owner, "issue_coupons_batch_v3", releaseOnlyByReads...)
			}
			d.create(t, "DROP", 10, 1, map[time.Time]int32{time.Now().Add(-time.Hour): 2, time.Now().Add(time.Hour): 8}, false)
			hold := pgtest.HoldCampaign(t, d.url, "DROP")
			answers := make([]<-chan called, 5)
			for i := range answers {
				answers[i] = d.issueAsync("DROP", fmt.Sprintf("m%d", i))
			}
			hold.WaitBlocked(len(answers))
			hold.Release()
			got := map[string]int{}
			for i, a := range answers {
				c := waitDone(t, a, fmt.Sprintf("member m%d", i))
				if c.err != nil {
					t.Fatal(c.err)
				}
				got[c.result]++
			}
			coupons := count(t, d.owner, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'DROP'`)
			issued := count(t, d.owner, `SELECT sum(issued_yen) FROM campaign_budgets WHERE campaign_id = 'DROP'`)
			switch {
			case broken && coupons <= 2:
				t.Errorf("the broken variant issued %d coupons of 2 released: the test would not see it", coupons)
			case broken:
				t.Logf("the broken variant: %d coupons of 2 released (%v)", coupons, got)
			case coupons != 2 || issued != 2000 || got["ISSUED"] != 2 || got["BUDGET_EXCEEDED"] != 3:
				t.Errorf("%d coupons, %d yen on the stripe, answers %v; want 2, 2000 and 2 ISSUED, 3 BUDGET_EXCEEDED", coupons, issued, got)
			}
		})
	}
}

// TestAudienceRemovalIsFinal: an audience is judged inside the issuance's transaction and held
// to its COMMIT. Member m1 of audience-only AUD asks while another session holds AUD's stripe, so
// its call waits there, past its audience read; an operator then removes m1. The removal must
// wait for m1's call (pg_blocking_pids), which commits its coupon first: no coupon of a member
// commits after the removal that took the member out has returned. The broken variant reads the
// audience row without holding it, as a check made outside the transaction would: the removal
// returns at once, and m1's coupon commits after it.
func TestAudienceRemovalIsFinal(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := newKindsDB(t)
			if broken {
				pgtest.BreakFunction(t, d.owner, "issue_coupons_batch_v3", [2]string{" ORDER BY a.member_id FOR KEY SHARE)", ")"})
			}
			d.create(t, "AUD", 10, 1, nil, true)
			if _, err := d.owner.Exec(ctx, `SELECT campaign_audience_change('AUD', '{m1}', true, 'test')`); err != nil {
				t.Fatal(err)
			}
			hold := pgtest.HoldCampaign(t, d.url, "AUD")
			answer := d.issueAsync("AUD", "m1")
			caller := hold.WaitBlocked(1)[0]
			remover := connect(t, d.url)
			removerPID := int(remover.PgConn().PID())
			removed := make(chan called, 1)
			go func() {
				var n int
				err := remover.QueryRow(ctx, `SELECT campaign_audience_change('AUD', '{m1}', false, 'test')`).Scan(&n)
				removed <- called{result: fmt.Sprint(n), err: err}
			}()
			// Either the removal waits for m1's call, or (the broken variant) it has returned.
			var early *called
			pgtest.Eventually(t, pgtest.PollTimeout, func() error {
				select {
				case r := <-removed:
					early = &r
					return nil
				default:
				}
				for _, w := range pgtest.WaitersOf(t, d.owner, caller) {
					if w == removerPID {
						return nil
					}
				}
				return errors.New("the removal neither waits for m1's call nor has returned")
			})
			hold.Release()
			c := waitDone(t, answer, "m1's call")
			r := early
			if r == nil {
				late := waitDone(t, removed, "the removal")
				r = &late
			}
			if c.err != nil || r.err != nil {
				t.Fatalf("m1's call: %v; the removal: %v", c.err, r.err)
			}
			coupons := count(t, d.owner, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'AUD' AND member_id = 'm1'`)
			switch {
			case broken && (early == nil || coupons != 1):
				t.Errorf("the broken variant: the removal returned first %v, m1 holds %d coupon: the test would not see it", early != nil, coupons)
			case broken:
				t.Logf("the broken variant: the removal returned, then m1's coupon committed (%s)", c.result)
			case early != nil:
				t.Errorf("the removal returned while m1's call was in flight; m1 then answered %s and holds %d coupon", c.result, coupons)
			case c.result != "ISSUED" || coupons != 1 || r.result != "1":
				t.Errorf("m1 answered %s with %d coupon, the removal removed %s; want ISSUED, 1 and 1 (the removal after the coupon)", c.result, coupons, r.result)
			}
		})
	}
}

// dryRun is one dry run's answer.
type dryRun struct {
	result, reason, coupon string
	amount, remaining      *int
	expires, next          *time.Time
}

// sqlDryRunCols are a dry run's answer's columns, as [dryRun.scan] takes them.
const sqlDryRunCols = `result, coalesce(reason, ''), coalesce(coupon, ''), amount, remaining_coupons, expires_at, next_release_at`

func (r *dryRun) scan(row interface{ Scan(...any) error }) error {
	return row.Scan(&r.result, &r.reason, &r.coupon, &r.amount, &r.remaining, &r.expires, &r.next)
}

// same reports whether r and o answer alike, each field compared.
func (r dryRun) same(o dryRun) bool {
	intEq := func(a, b *int) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	timeEq := func(a, b *time.Time) bool { return (a == nil) == (b == nil) && (a == nil || a.Equal(*b)) }
	return r.result == o.result && r.reason == o.reason && r.coupon == o.coupon && intEq(r.amount, o.amount) &&
		intEq(r.remaining, o.remaining) && timeEq(r.expires, o.expires) && timeEq(r.next, o.next)
}

func (r dryRun) String() string {
	deref := func(p any) any {
		switch v := p.(type) {
		case *int:
			if v != nil {
				return *v
			}
		case *time.Time:
			if v != nil {
				return v.UTC().Format(time.RFC3339Nano)
			}
		}
		return nil
	}
	return fmt.Sprintf("{%s reason %q coupon %q amount %v remaining %v expires %v next %v}", r.result, r.reason, r.coupon,
		deref(r.amount), deref(r.remaining), deref(r.expires), deref(r.next))
}

// dryRun asks issue_dry_run_batch for one member alone, as IssueCoupon asks for a dry run that
// no other dry run of its campaign joined.
func (d kindsDB) dryRun(t *testing.T, campaignID, member string) dryRun {
	t.Helper()
	return d.dryGroup(t, campaignID, member)[0]
}

// dryGroup asks issue_dry_run_batch, members as one group, and returns their answers in order.
func (d kindsDB) dryGroup(t *testing.T, campaignID string, members ...string) []dryRun {
	t.Helper()
	rows, err := d.issue.Query(context.Background(), `SELECT i, `+sqlDryRunCols+` FROM issue_dry_run_batch($1, $2) ORDER BY i`,
		campaignID, members)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []dryRun
	for rows.Next() {
		var i int
		var r dryRun
		if err := rows.Scan(&i, &r.result, &r.reason, &r.coupon, &r.amount, &r.remaining, &r.expires, &r.next); err != nil {
			t.Fatal(err)
		}
		if i != len(out)+1 {
			t.Fatalf("issue_dry_run_batch answered entry %d as the %d-th row", i, len(out)+1)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) != len(members) {
		t.Fatalf("issue_dry_run_batch answered %d rows for %d members", len(out), len(members))
	}
	return out
}

// written is every row and counter an issuance writes, summed: a dry run must leave it as it is.
const written = `SELECT (SELECT count(*) FROM issued_coupons) + (SELECT count(*) FROM notification_outbox)
	+ (SELECT coalesce(sum(used_yen), 0) FROM member_monthly_usage) + (SELECT coalesce(sum(issued_yen), 0) FROM campaign_budgets)`

// TestDryRunAnswersAsTheIssuance: in each state a campaign and a member can be in, the dry run
// answers what the issuance then answers (AVAILABLE for ISSUED), with the remaining coupons and
// the next release where they apply, and writes nothing (counted with SQL). It answers alike
// alone (a group of one) and in a group: the member twice in one group with
// another member between, each entry answered as that member alone, every field compared.
func TestDryRunAnswersAsTheIssuance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newKindsDB(t)
	next := time.Now().Add(time.Hour).Truncate(time.Second)
	d.create(t, "REL", 10, 3, map[time.Time]int32{time.Now().Add(-time.Hour): 2, next: 3}, false)
	d.create(t, "LATER", 10, 1, map[time.Time]int32{next: 3}, false)
	d.create(t, "AUD", 10, 1, nil, true)
	d.create(t, "BIG", 10, 1, nil, false)
	if _, err := d.owner.Exec(ctx, `SELECT campaign_audience_change('AUD', '{in}', true, 'test');
		UPDATE campaign_budgets SET discount_yen = 2500 WHERE campaign_id = 'BIG'`); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		campaign, member, want, issued, reason string
		remaining                              int // -1: none
		next                                   bool
	}{
		{"REL", "a", "AVAILABLE", "ISSUED", "", 2, true},
		{"REL", "a", "ALREADY_ISSUED", "ALREADY_ISSUED", "", -1, false},
		{"REL", "b", "AVAILABLE", "ISSUED", "", 1, true},
		{"REL", "c", "BUDGET_EXCEEDED", "BUDGET_EXCEEDED", "", 0, true},
		{"LATER", "a", "CAMPAIGN_NOT_ACTIVE", "CAMPAIGN_NOT_ACTIVE", "NOT_STARTED", -1, true},
		{"AUD", "out", "NOT_ELIGIBLE", "NOT_ELIGIBLE", "", -1, false},
		{"AUD", "in", "AVAILABLE", "ISSUED", "", 10, false},
		{"BIG", "z", "MONTHLY_CAP", "MONTHLY_CAP", "", -1, false},
		{"NOPE", "a", "UNKNOWN_CAMPAIGN", "UNKNOWN_CAMPAIGN", "", -1, false},
	} {
		before := count(t, d.owner, written)
		got := d.dryRun(t, s.campaign, s.member)
		other := d.dryRun(t, s.campaign, "other")
		for k, g := range d.dryGroup(t, s.campaign, s.member, "other", s.member) {
			if alone := map[bool]dryRun{true: got, false: other}[k != 1]; !g.same(alone) {
				t.Errorf("%s %s: entry %d of a group answered %v, alone %v", s.campaign, s.member, k+1, g, alone)
			}
		}
		if after := count(t, d.owner, written); after != before {
			t.Errorf("%s %s: the dry run wrote (%d before, %d after)", s.campaign, s.member, before, after)
		}
		remaining := -1
		if got.remaining != nil {
			remaining = *got.remaining
		}
		if got.result != s.want || got.reason != s.reason || remaining != s.remaining || (got.next != nil) != s.next ||
			(got.next != nil && !got.next.Equal(next)) {
			t.Errorf("%s %s: dry run %s %q remaining %d next %v; want %s %q %d, next release given %v", s.campaign, s.member,
				got.result, got.reason, remaining, got.next, s.want, s.reason, s.remaining, s.next)
		}
		var issued string
		if err := d.issue.QueryRow(ctx, sqlIssueOne, s.campaign, s.member).Scan(&issued, new(int)); err != nil {
			t.Fatal(err)
		}
		if issued != s.issued {
			t.Errorf("%s %s: the issuance after the dry run answered %s, want %s", s.campaign, s.member, issued, s.issued)
		}
	}
}

// TestDryRunTakesNoLock: a dry run answers while another session holds every budget stripe of
// the campaign and the member's month row in an open transaction, as a busy issuance does, asked
// alone (a group of one) and as a group of three entries. The broken variant reads stripe 0 FOR
// UPDATE: it waits for the holder (pg_blocking_pids), and the test sees it wait.
func TestDryRunTakesNoLock(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := newKindsDB(t)
			if broken {
				pgtest.BreakFunction(t, d.owner, "issue_dry_run_batch",
					[2]string{" STABLE SECURITY DEFINER", " VOLATILE SECURITY DEFINER"},
					[2]string{"  SELECT * INTO v FROM campaign_judge(p_campaign_id, v_at);",
						"  PERFORM FROM campaign_budgets b WHERE b.campaign_id = p_campaign_id AND b.stripe = 0 FOR UPDATE;\n  SELECT * INTO v FROM campaign_judge(p_campaign_id, v_at);"})
			}
			d.create(t, "HOT", 10, 2, map[time.Time]int32{time.Now().Add(-time.Hour): 4}, false)
			for _, ask := range []struct{ by, sql string }{
				{"alone", `SELECT ` + sqlDryRunCols + ` FROM issue_dry_run_batch('HOT', ARRAY['m1'])`},
				// The group's answers folded into one row: AVAILABLE,AVAILABLE,AVAILABLE.
				{"group", `SELECT string_agg(result, ',' ORDER BY i), '', '', min(amount), min(remaining_coupons), min(expires_at),
					min(next_release_at) FROM issue_dry_run_batch('HOT', ARRAY['m1', 'm2', 'm1'])`},
			} {
				want := map[string]string{"alone": "AVAILABLE", "group": "AVAILABLE,AVAILABLE,AVAILABLE"}[ask.by]
				hold := pgtest.HoldCampaign(t, d.url, "HOT")
				asked := make(chan dryRun, 1)
				go func() {
					var r dryRun
					if err := r.scan(d.issue.QueryRow(ctx, ask.sql)); err != nil {
						r.result = err.Error()
					}
					asked <- r
				}()
				var got *dryRun
				waited := false
				pgtest.Eventually(t, pgtest.PollTimeout, func() error {
					select {
					case r := <-asked:
						got = &r
						return nil
					default:
					}
					if hold.Blocked() > 0 {
						waited = true
						return nil
					}
					return errors.New("the dry run neither answered nor waits for the holder")
				})
				hold.Release()
				if got == nil {
					r := waitDone(t, asked, "the dry run")
					got = &r
				}
				switch {
				case broken && !waited:
					t.Errorf("%s: the broken variant answered %s without waiting: the test would not see it", ask.by, got.result)
				case broken:
					t.Logf("%s: the broken variant waited for the holder, then answered %s", ask.by, got.result)
				case waited || got.result != want || got.remaining == nil || *got.remaining != 4:
					t.Errorf("%s: waited %v, answered %v; want %s with 4 remaining, at once", ask.by, waited, got, want)
				}
			}
		})
	}
}

// TestReleasesThroughLiveChanges: on a campaign with releases, a void gives its coupon back to
// what is released now, a re-stripe keeps the released count exact over the new stripes, and a
// pause and a resume work as on any campaign. Each step is judged by the answers and by SQL:
// the live coupons never exceed the released count.
func TestReleasesThroughLiveChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newKindsDB(t)
	d.create(t, "LIVE", 10, 2, map[time.Time]int32{time.Now().Add(-time.Hour): 4, time.Now().Add(time.Hour): 6}, false)
	member := 0
	ask := func(want string) {
		t.Helper()
		member++
		var got string
		if err := d.issue.QueryRow(ctx, sqlIssueOne, "LIVE", fmt.Sprintf("m%d", member)).Scan(&got, new(int)); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("member m%d: %s, want %s", member, got, want)
		}
		if live := count(t, d.owner, `SELECT count(*) FROM issued_coupons WHERE campaign_id = 'LIVE' AND voided_at IS NULL`); live > 4 {
			t.Fatalf("%d live coupons of 4 released", live)
		}
	}
	change := func(sql string) {
		t.Helper()
		if _, err := d.owner.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		ask("ISSUED")
	}
	ask("BUDGET_EXCEEDED")
	change(`SELECT coupon_void(coupon_id, 'test', false) FROM issued_coupons WHERE campaign_id = 'LIVE' AND member_id = 'm1'`)
	ask("ISSUED")
	ask("BUDGET_EXCEEDED")
	change(`SELECT count(*) FROM campaign_change_budget('LIVE', NULL, NULL, 3, 'test')`)
	ask("BUDGET_EXCEEDED")
	change(`SELECT coupon_void(coupon_id, 'test', false) FROM issued_coupons WHERE campaign_id = 'LIVE' AND member_id = 'm2'`)
	change(`SELECT count(*) FROM campaign_change_budget('LIVE', NULL, 4000, 5, 'test')`)
	ask("ISSUED")
	ask("BUDGET_EXCEEDED")
	change(`SELECT count(*) FROM campaign_change_state('LIVE', 'pause', NULL, NULL, false, false, 'test')`)
	change(`SELECT coupon_void(coupon_id, 'test', false) FROM issued_coupons WHERE campaign_id = 'LIVE' AND member_id = 'm3'`)
	ask("CAMPAIGN_NOT_ACTIVE")
	change(`SELECT count(*) FROM campaign_change_state('LIVE', 'resume', NULL, NULL, false, false, 'test')`)
	ask("ISSUED")
	ask("BUDGET_EXCEEDED")
	if n := count(t, d.owner, `SELECT count(*) FROM campaign_budgets WHERE campaign_id = 'LIVE'`); n != 5 {
		t.Errorf("%d stripes, want 5", n)
	}
	assertRules(t, d.owner)
}

// TestPreviousReleaseKnowsItsAnswers: the previous release's four entries answer a member outside
// an audience-only campaign's audience UNKNOWN_CAMPAIGN, a code it knows (docs/deploy.md,
// "Campaign kinds"), in their old six columns, and write nothing. The broken variant, wrappers
// that pass the new code through, answers NOT_ELIGIBLE, which that release answers 500.
func TestPreviousReleaseKnowsItsAnswers(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := newKindsDB(t)
			if broken {
				for _, fn := range []string{"issue_coupons_batch", "grant_coupons_batch"} {
					pgtest.BreakFunction(t, d.owner, fn, [2]string{"CASE b.result WHEN 'NOT_ELIGIBLE' THEN 'UNKNOWN_CAMPAIGN' ELSE b.result END", "b.result"})
				}
			}
			d.create(t, "AUD", 10, 1, nil, true)
			args := `'AUD', ARRAY[gen_random_uuid()], ARRAY['out'], ARRAY[now()], 2000, ARRAY[NULL::text]`
			one := `gen_random_uuid(), 'AUD', 'out', now(), 2000, NULL`
			var wrong []string
			for _, c := range []struct {
				sql     string
				columns int // as 00024 answered
			}{
				{`SELECT * FROM issue_coupons_batch(` + args + `)`, 6}, {`SELECT * FROM grant_coupons_batch(` + args + `)`, 6},
				{`SELECT * FROM issue_coupon(` + one + `)`, 5}, {`SELECT * FROM grant_coupon(` + one + `)`, 5},
			} {
				rows, err := d.owner.Query(ctx, c.sql)
				if err != nil {
					t.Fatal(err)
				}
				results := map[string]bool{}
				for rows.Next() {
					vals, err := rows.Values()
					if err != nil {
						t.Fatal(err)
					}
					for _, v := range vals {
						if s, ok := v.(string); ok && (s == "NOT_ELIGIBLE" || s == "UNKNOWN_CAMPAIGN") {
							results[s] = true
						}
					}
				}
				if rows.Err() != nil {
					t.Fatal(rows.Err())
				}
				if n := len(rows.FieldDescriptions()); n != c.columns || !results["UNKNOWN_CAMPAIGN"] || results["NOT_ELIGIBLE"] {
					wrong = append(wrong, fmt.Sprintf("%s: %d columns (want %d), results %v", c.sql, n, c.columns, results))
				}
			}
			if n := count(t, d.owner, written); n != 0 {
				wrong = append(wrong, fmt.Sprintf("%d rows and yen written", n))
			}
			switch {
			case broken && len(wrong) == 0:
				t.Error("the broken variant answered only known codes: the test would not see it")
			case broken:
				t.Logf("the broken variant: %v", wrong)
			case len(wrong) > 0:
				t.Errorf("the previous release's entries: %v", wrong)
			}
		})
	}
}

// TestNextReleaseIsWhenCouponsOpen: next_release_at names when more coupons open, never an
// instant they cannot (00027's release_next): for a release before the campaign's start, the
// start; for a release at or after the end (an end moved earlier), none. The issuance and the dry
// run answer alike. The broken variant, 00025's rule (the first release after now, whatever the
// period), is kept as a fixture and must be seen.
func TestNextReleaseIsWhenCouponsOpen(t *testing.T) {
	t.Parallel()
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprint("broken=", broken), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := newKindsDB(t)
			if broken {
				pgtest.BreakFunction(t, d.owner, "release_next", [2]string{"greatest(r.at, p_starts)", "r.at"},
					[2]string{"o.at < least(p_ends, p_until, 'infinity')", "true"})
			}
			now := scalar[time.Time](t, d.owner, `SELECT clock_timestamp()`)
			starts, early, late := now.Add(2*time.Hour), now.Add(time.Hour), now.Add(3*time.Hour)
			// EARLY: a release an hour before a start two hours away; its coupons open at the start.
			d.create(t, "EARLY", 10, 2, map[time.Time]int32{early: 5}, false)
			// GONE: one release open now, one in three hours; then its end is moved to two hours.
			d.create(t, "GONE", 10, 2, map[time.Time]int32{now.Add(-time.Hour): 1, late: 5}, false)
			for _, change := range []struct {
				campaign            string
				starts, ends        *time.Time
				setStarts, setsEnds bool
			}{{"EARLY", &starts, nil, true, false}, {"GONE", nil, &starts, false, true}} {
				if _, err := d.owner.Exec(ctx, `SELECT count(*) FROM campaign_change_state($1, 'period', $2, $3, $4, $5, 'test')`,
					change.campaign, change.starts, change.ends, change.setStarts, change.setsEnds); err != nil {
					t.Fatal(err)
				}
			}
			if r := (<-d.issueAsync("GONE", "first")); r.err != nil || r.result != "ISSUED" {
				t.Fatalf("GONE's first coupon: %s %v", r.result, r.err)
			}
			var wrong []string
			for _, c := range []struct {
				campaign string
				want     *time.Time
			}{{"EARLY", &starts}, {"GONE", nil}} {
				var issued *time.Time
				if err := d.issue.QueryRow(ctx, `SELECT next_release_at FROM issue_coupons_batch_v2($1, ARRAY[gen_random_uuid()], ARRAY['m'],
					ARRAY[now()], NULL, ARRAY[NULL::text])`, c.campaign).Scan(&issued); err != nil {
					t.Fatal(err)
				}
				dry := d.dryRun(t, c.campaign, "m")
				for _, got := range []struct {
					by string
					at *time.Time
				}{{"issue_coupons_batch_v2", issued}, {"issue_dry_run_batch", dry.next}} {
					if (got.at == nil) != (c.want == nil) || (got.at != nil && !got.at.Equal(*c.want)) {
						wrong = append(wrong, fmt.Sprintf("%s: %s answered next_release_at %v, want %v", c.campaign, got.by, got.at, c.want))
					}
				}
			}
			switch {
			case broken && len(wrong) == 0:
				t.Error("the broken variant named the right instants: the test would not see it")
			case broken:
				t.Logf("the broken variant: %v", wrong)
			case len(wrong) > 0:
				t.Error(wrong)
			}
		})
	}
}
