package drill

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/localpg"
)

// Fault is one kind of fault the drill injects.
type Fault string

// The faults, each held for its slot of the schedule (see [Options.Duration]).
const (
	// DBCrash stops the database as `pg_ctl stop -m immediate` does, then starts it again
	// (crash recovery). Only on the drill's own server.
	DBCrash Fault = "db-crash"
	// Kill ends the serving process with SIGKILL, then starts a new one.
	Kill Fault = "kill"
	// SIGTERM sends the serving process SIGTERM, as Cloud Run does before stopping an instance:
	// it drains its requests and must exit 0; then a new one is started.
	SIGTERM Fault = "sigterm"
	// Stall stops every database server process with SIGSTOP for [stallHold], then resumes
	// them: a database that hangs without failing. Only on the drill's own server.
	Stall Fault = "stall"
	// LINEOutage makes the LINE stand-in answer 503 to every push.
	LINEOutage Fault = "line-outage"
	// CampaignChange is an operator's work, not a fault: it pauses DR-B for its slot, raises
	// DR-A (sold out by then) by [raiseYen] halfway through, and resumes DR-B. From the pause's
	// return to the resume no coupon of DR-B may commit; the audit also finds any ISSUED answered
	// inside the pause (campaign_changes).
	CampaignChange Fault = "campaign-change"
	// Voids is an operator's work too: [voidCount] coupons of DR-B and DR-C voided one after the
	// other through the slot, every other one with reissue allowed. The audit allows their
	// earlier ISSUED answers; reconcile checks that their yen came back.
	Voids Fault = "voids"
	// HotCampaign is a first-come rush, not a fault: for its slot every client asks for DR-H,
	// one budget stripe, new members each, double taps included, so that IssueCoupon coalesces
	// them into batches; DR-H sells out. The audit covers its answers as every other.
	HotCampaign Fault = "hot-campaign"
	// Release is a scheduled release under its herd, not a fault: at the start of its slot the
	// drill creates DR-R, whose [releaseCoupons] coupons are all released halfway through the
	// slot (the database's clock), and every client asks for DR-R, new members each, double taps
	// included: NOT_STARTED before the instant, the release taken, BUDGET_EXCEEDED after. Its
	// audit: no coupon of DR-R issued before the instant (issued_at, read before the stripe write
	// that precedes the COMMIT), exactly the released coupons, and the answers audited as every
	// other (internal/lab/audit knows a campaign's first release).
	Release Fault = "release"
)

// Faults are every kind, in the default schedule's order.
var Faults = []Fault{DBCrash, Kill, SIGTERM, Stall, LINEOutage, CampaignChange, Voids, HotCampaign, Release}

// releaseCampaign is [Release]'s campaign; releaseCoupons of its 100 coupons' budget are released;
// releaseGrace bounds how long the herd stays on it past the slot until they are taken.
const (
	releaseCampaign = "DR-R"
	releaseCoupons  = 50
	releaseGrace    = 10 * time.Second
)

// voidCount is how many coupons [Voids] voids.
const voidCount = 20

// raiseYen is what [CampaignChange] adds to DR-A's budget: 20 more coupons.
const raiseYen = 20_000

// stallHold bounds how long [Stall] holds the database stopped: about the app's 3 s timeout, so
// that requests in flight outlast their 2.5 s budget.
const stallHold = 3 * time.Second

// ParseFaults parses a comma list of fault names (see [Faults]); each may appear once.
func ParseFaults(list string) ([]Fault, error) {
	var faults []Fault
	for name := range strings.SplitSeq(list, ",") {
		f := Fault(strings.TrimSpace(name))
		if !slices.Contains(Faults, f) {
			return nil, fmt.Errorf("fault %q: want one of %s", f, joinFaults(Faults))
		}
		if slices.Contains(faults, f) {
			return nil, fmt.Errorf("fault %q named twice", f)
		}
		faults = append(faults, f)
	}
	return faults, nil
}

func joinFaults(faults []Fault) string {
	names := make([]string, len(faults))
	for i, f := range faults {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}

// needsServer reports whether f acts on the database server's processes, which the drill owns
// only when it started the server itself.
func (f Fault) needsServer() bool { return f == DBCrash || f == Stall }

// event is one fault as it happened.
type event struct {
	fault      Fault
	start, end time.Time // injected; recovered
	note       string
	violation  string // what the fault showed wrong, "" when nothing
}

// injector injects the faults into the drill's processes.
type injector struct {
	db      *localpg.Server // nil when the drill does not own the database
	pool    *pgxpool.Pool   // the drill's own connections, for [CampaignChange], [Voids], [HotCampaign]
	traffic *traffic        // the load, for [HotCampaign]
	svc     *service
	stub    *linestub.Stub
	// holdWALWriter, when positive, is how long [DBCrash] holds the WAL writer stopped before
	// the crash at least ([BreakSyncCommitOff]): it holds it on until a request sent after the
	// hold began is answered ISSUED, at most [breakHoldMax].
	holdWALWriter time.Duration
}

// inject injects f, holds it for hold, and recovers from it. Its error means the drill cannot go
// on (a process that does not come back); what the fault showed wrong is the event's violation.
func (in *injector) inject(ctx context.Context, f Fault, hold time.Duration) (event, error) {
	ev := event{fault: f, start: time.Now()}
	var err error
	switch f {
	case DBCrash:
		err = in.crashDatabase(ctx, hold, &ev)
	case Kill:
		err = in.killService(ctx, hold, &ev)
	case SIGTERM:
		err = in.terminateService(ctx, hold, &ev)
	case Stall:
		err = in.stallDatabase(ctx, hold, &ev)
	case LINEOutage:
		in.stub.Default(linestub.Response{Status: http.StatusServiceUnavailable, Message: "drill: LINE outage"})
		err = sleep(ctx, hold)
		in.stub.Default(linestub.Response{})
		ev.note = "the LINE stand-in answered 503 to every push"
	case CampaignChange:
		err = in.changeCampaigns(ctx, hold, &ev)
	case Voids:
		err = in.voidCoupons(ctx, hold, &ev)
	case HotCampaign:
		err = in.rush(ctx, hold, &ev)
	case Release:
		err = in.release(ctx, hold, &ev)
	}
	ev.end = time.Now()
	return ev, err
}

// at is a time since the fault's injection began, as the notes give it: "+3.6 s".
func at(d time.Duration) string { return fmt.Sprintf("+%.1f s", d.Seconds()) }

// killNote says when the serving process was killed and from when a new one served, both since
// the injection began: no process served in between.
func killNote(killed, served time.Duration) string {
	return fmt.Sprintf("SIGKILL at %s; no process until a new one served from %s", at(killed), at(served))
}

// terminateNote says when the serving process got SIGTERM, when it had drained and exited, and
// from when a new one served: none accepted requests in between.
func terminateNote(signalled, exited, served time.Duration) string {
	return fmt.Sprintf("SIGTERM at %s, drained and exited at %s; no process until a new one served from %s",
		at(signalled), at(exited), at(served))
}

func (in *injector) crashDatabase(ctx context.Context, hold time.Duration, ev *event) error {
	held := ""
	if in.holdWALWriter > 0 {
		if err := in.db.HoldWALWriter(); err != nil {
			return err
		}
		heldAt := time.Now()
		if err := sleep(ctx, in.holdWALWriter); err != nil {
			return err
		}
		if err := in.awaitIssuedAfter(ctx, heldAt); err != nil {
			return err
		}
		held = fmt.Sprintf("WAL writer held %.1f s first (--break); ", time.Since(heldAt).Seconds())
	}
	crashed := time.Since(ev.start)
	if err := in.db.Crash(); err != nil {
		return err
	}
	if err := sleep(ctx, hold); err != nil {
		return err
	}
	restarted := time.Since(ev.start)
	if err := in.db.Up(ctx); err != nil {
		return fmt.Errorf("drill: the database does not come back after the crash: %w", err)
	}
	ev.note = fmt.Sprintf("%simmediate stop at %s; started at %s, crash recovery done and accepting from %s",
		held, at(crashed), at(restarted), at(time.Since(ev.start)))
	return nil
}

func (in *injector) killService(ctx context.Context, hold time.Duration, ev *event) error {
	killed := time.Since(ev.start)
	in.svc.kill()
	if err := sleep(ctx, hold); err != nil {
		return err
	}
	if err := in.svc.start(ctx); err != nil {
		return err
	}
	ev.note = killNote(killed, time.Since(ev.start))
	return nil
}

func (in *injector) terminateService(ctx context.Context, hold time.Duration, ev *event) error {
	signalled := time.Since(ev.start)
	took, err := in.svc.terminate()
	if err != nil {
		ev.violation = err.Error()
	}
	if err := sleep(ctx, hold-took); err != nil {
		return err
	}
	if err := in.svc.start(ctx); err != nil {
		return err
	}
	ev.note = terminateNote(signalled, signalled+took, time.Since(ev.start))
	return nil
}

func (in *injector) stallDatabase(ctx context.Context, hold time.Duration, ev *event) error {
	n, err := in.db.Pause()
	if err != nil {
		return err
	}
	err = sleep(ctx, hold)
	in.db.Resume()
	ev.note = fmt.Sprintf("SIGSTOP to the postmaster and %d children at +0.0 s, SIGCONT at %s", n-1, at(hold))
	return err
}

// changeCampaigns is [CampaignChange]: DR-B paused for hold, DR-A raised halfway, DR-B resumed;
// DR-B's coupons counted as the pause returned and before the resume must be as many.
func (in *injector) changeCampaigns(ctx context.Context, hold time.Duration, ev *event) error {
	const why = "couponctl drill: an operator's change under load"
	if _, err := campaign.Pause(ctx, in.pool, "DR-B", why); err != nil {
		return err
	}
	paused, pausedAt := 0, time.Since(ev.start)
	if err := in.pool.QueryRow(ctx, sqlCoupons, "DR-B").Scan(&paused); err != nil {
		return err
	}
	if err := sleep(ctx, hold/2); err != nil {
		return err
	}
	raisedAt := time.Since(ev.start)
	if _, err := campaign.Update(ctx, in.pool, "DR-A", campaign.Changes{AddBudgetYen: ptr[int64](raiseYen), Reason: why}); err != nil {
		return err
	}
	if err := sleep(ctx, hold-hold/2); err != nil {
		return err
	}
	before := 0
	if err := in.pool.QueryRow(ctx, sqlCoupons, "DR-B").Scan(&before); err != nil {
		return err
	}
	if _, err := campaign.Resume(ctx, in.pool, "DR-B", why); err != nil {
		return err
	}
	if before != paused {
		ev.violation = fmt.Sprintf("DR-B: %d coupons when its pause returned, %d before its resume", paused, before)
	}
	ev.note = fmt.Sprintf("DR-B paused at %s with %d coupons, %d before its resume at %s; DR-A raised by %d yen at %s",
		at(pausedAt), paused, before, at(time.Since(ev.start)), raiseYen, at(raisedAt))
	return nil
}

// voidCoupons is [Voids]: voidCount live coupons of DR-B and DR-C, chosen at random, voided
// spread over hold.
func (in *injector) voidCoupons(ctx context.Context, hold time.Duration, ev *event) error {
	rows, err := in.pool.Query(ctx, `SELECT coupon_id::text FROM issued_coupons
		WHERE campaign_id IN ('DR-B', 'DR-C') AND voided_at IS NULL ORDER BY random() LIMIT $1`, voidCount)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	pushes := map[string]int{}
	for i, id := range ids {
		if err := sleep(ctx, hold/time.Duration(len(ids)+1)); err != nil {
			return err
		}
		v, err := coupon.Void(ctx, in.pool, id, "couponctl drill: an operator's void under load", i%2 == 0)
		if err != nil {
			return err
		}
		pushes[v.Push]++
	}
	ev.note = fmt.Sprintf("%d coupons voided (every other one with reissue allowed); pushes: %d already sent, %d not sent (never will be), %d in flight",
		len(ids), pushes["sent"], pushes["not sent"], pushes["in flight"])
	return nil
}

// rush is [HotCampaign]: every client on DR-H for hold.
func (in *injector) rush(ctx context.Context, hold time.Duration, ev *event) error {
	in.traffic.setHot(hotCampaign.ID)
	err := sleep(ctx, hold)
	in.traffic.setHot("")
	coupons := 0
	if qerr := in.pool.QueryRow(ctx, sqlCoupons, hotCampaign.ID).Scan(&coupons); err == nil {
		err = qerr
	}
	ev.note = fmt.Sprintf("every client on %s (one stripe, %d coupons): %d issued", hotCampaign.ID, hotCampaign.BudgetYen/hotCampaign.DiscountYen, coupons)
	return err
}

// release is [Release]: DR-R made with its release halfway through hold, every client on it for
// hold, then the coupons counted against the instant.
func (in *injector) release(ctx context.Context, hold time.Duration, ev *event) error {
	if _, err := in.pool.Exec(ctx, `SELECT count(*) FROM campaign_create($1, 1000, $2, 4, NULL, NULL, NULL, NULL,
		'couponctl drill: a release under its herd', ARRAY[clock_timestamp() + $3::interval], ARRAY[$4::integer], false)`,
		releaseCampaign, 100*1000, (hold / 2).String(), releaseCoupons); err != nil {
		return err
	}
	var instant time.Time
	if err := in.pool.QueryRow(ctx, `SELECT at FROM campaign_releases WHERE campaign_id = $1`, releaseCampaign).Scan(&instant); err != nil {
		return err
	}
	in.traffic.setHot(releaseCampaign)
	defer in.traffic.setHot("")
	if err := sleep(ctx, hold); err != nil {
		return err
	}
	// A machine too slow to take the release within the slot keeps the herd on it a while
	// longer: a bound on a slow load, not a judgement.
	var early, coupons int
	for deadline := time.Now().Add(releaseGrace); ; {
		if err := in.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE issued_at < $2), count(*) FROM issued_coupons WHERE campaign_id = $1`,
			releaseCampaign, instant).Scan(&early, &coupons); err != nil {
			return err
		}
		if coupons >= releaseCoupons || time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	ev.note = fmt.Sprintf("every client on %s, %d coupons released at %s: %d issued", releaseCampaign, releaseCoupons, at(instant.Sub(ev.start)), coupons)
	switch {
	case early > 0:
		ev.violation = fmt.Sprintf("%d coupons of %s issued before its release", early, releaseCampaign)
	case coupons != releaseCoupons:
		ev.violation = fmt.Sprintf("%s issued %d coupons, not the %d released, with every client asking for them", releaseCampaign, coupons, releaseCoupons)
	}
	return nil
}

// sqlCoupons counts a campaign's coupons.
const sqlCoupons = `SELECT count(*) FROM issued_coupons WHERE campaign_id = $1`

func ptr[T any](v T) *T { return &v }

// breakHoldMax bounds how long [injector.awaitIssuedAfter] waits for a coupon answered ISSUED
// while the WAL writer is held: a service that answers none in that time has nothing to lose.
const breakHoldMax = 30 * time.Second

// awaitIssuedAfter waits until a request sent after at has been answered ISSUED, a coupon whose
// commit the held WAL writer never wrote, so that the crash loses one however slowly the
// machine serves; at most [breakHoldMax].
func (in *injector) awaitIssuedAfter(ctx context.Context, at time.Time) error {
	deadline := time.Now().Add(breakHoldMax)
	for !in.traffic.issuedSentAfter(at) && time.Now().Before(deadline) {
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// sleep waits d (nothing when d <= 0), or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
