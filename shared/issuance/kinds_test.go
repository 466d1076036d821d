package issuance_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

// The campaign kinds of issue 33 (00025_campaign_kinds.sql), judged inside issue_coupons_batch_v2
// and issue_dry_run. The calls below go to the functions directly, on sessions without a
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
	if _, err := d.owner.Exec(context.Background(), `SELECT count(*) FROM campaign_create($1, 1000, $2, $3, NULL, NULL, NULL, NULL,
		'test', $4, $5, $6)`, id, coupons*1000, stripes, at, n, audienceOnly); err != nil {
		t.Fatal(err)
	}
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
	{"(NOT v_releases OR release_room(", "(true OR release_room("},
	{"CASE WHEN v_releases THEN release_room(", "CASE WHEN false THEN release_room("},
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
				pgtest.BreakFunction(t, d.owner, "issue_coupons_batch_v2", releaseOnlyByReads...)
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
				pgtest.BreakFunction(t, d.owner, "issue_coupons_batch_v2", [2]string{" ORDER BY a.member_id FOR KEY SHARE)", ")"})
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
