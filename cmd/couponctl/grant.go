package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/rules"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/ids"
	"github.com/mops/coupon-api/shared/issuance"
	"github.com/mops/coupon-api/shared/outbox"
)

// Bounds of grant's --concurrency: each request holds one connection of the pool while it runs,
// and a grant must leave the database to IssueCoupon (docs/performance.md, "Granting a campaign
// to a list").
const (
	defaultGrantConcurrency = 8
	maxGrantConcurrency     = 64
)

// grantAttempts is how many times grant sends a member whose answer was RETRY_EXHAUSTED (the
// campaign's rows were busy for the whole ISSUE_BUDGET) before it reports it.
const grantAttempts = 3

// grantJob is one grant as the command line gives it.
type grantJob struct {
	campaignID  string
	members     []string // in the file's order, each once
	out         string   // the CSV's path
	concurrency int
	dryRun      bool // check and say what would be sent, send nothing
}

func grantCmd() *cobra.Command {
	var (
		campaignID, members, column, out string
		concurrency                      int
		dryRun                           bool
	)
	c := &cobra.Command{
		Use:   "grant --campaign ID --members FILE [--csv-column NAME] [--concurrency N] [--out CSV] [--dry-run]",
		Short: "Issue a campaign to every member of a list, through IssueCoupon's rules and answers",
		Long: `Issue campaign ID to each member of FILE (one member id a line; blank lines, comments (a line
starting with "#" and a space: an id starting with # is an id) and a UTF-8 BOM before line 1 are
skipped; a BOM further down or UTF-16 text is refused, naming its line; so is a spreadsheet's
row or heading: a line holding a comma, a semicolon, a tab, a double quote or a | (c006,gold),
a leading ' (Excel's text marker), a known heading such as member_id or email on any line, or a
first id without a digit above ids with digits; a member listed twice is sent once). --csv-column NAME reads FILE
as a CSV instead, its first line the headings, the member ids in column NAME. Through the same issuance as
IssueCoupon: the same rules (R1 budget, R2 one per member, R3 monthly cap as the database holds it: couponctl rules show),
timeouts and result codes. It runs as a user in coupon_admin (docs/roles.md), and every coupon
granted records that login.

Before it sends anything it checks, and refuses with what to do, nothing issued: a FILE that is
missing, empty or holds a line that is not a member id (named by its number; exit 2), a login
outside coupon_admin, a campaign that does not exist, is paused, has ended or has not started, a
coupon above the monthly cap, a budget without room for one more coupon, an --out that cannot be
written or is not a regular file (a symbolic link, directory, device or FIFO is refused, naming
it) (exit 1). --dry-run makes these checks, says what the grant would send, and sends
and writes nothing.

It is idempotent: a second run of the same file issues nothing new and answers ALREADY_ISSUED
with the same coupon ids. So it is resumable: after Ctrl-C (or a crash), run the same command
again. A member whose answer was RETRY_EXHAUSTED is sent again, up to 3 times.

Concurrency: --concurrency N members are granted at once (default 8, at most 64). Each is one
call to PostgreSQL holding one connection of a pool of N, so N is both the requests in flight
and the connections the grant opens (plus one, briefly, to settle an answer lost on the
network). That is the load it adds beside IssueCoupon's on the same database: the default keeps
IssueCoupon's p99 within what docs/performance.md ("Granting a campaign to a list") measured.

It shows a progress bar with the rate and the time left (a line per 10% when stderr is not a
terminal), then a table of the answers with what to do about each refusal, and writes --out
(default BASE.ID.csv in the working directory, BASE being FILE's name without its directory): a CSV of member,result,coupon_id for every member answered,
in FILE's order; a member id starting with =, +, - or @ is written behind a single quote ('=1+1)
so that a spreadsheet shows it rather than running it as a formula. Ctrl-C (SIGINT) or SIGTERM stops sending, waits for the requests in flight
(each ends within ISSUE_BUDGET), writes the CSV whole and exits 130 (143). It stops by itself,
saying why, how many members were done and not sent, and exits 1, when continuing is pointless:
once a member answers CAMPAIGN_NOT_ACTIVE (the campaign was paused or ended meanwhile), or after
10 members in a row failed (the database is unreachable). Exits 1 if any
answer was an error (RETRY_EXHAUSTED three times, a failure: ERROR in the CSV) or unknown (the
answer lost and the coupon not found by looking it up: UNKNOWN in the CSV, counted apart; a
re-run settles it); refusals (MONTHLY_CAP, BUDGET_EXCEEDED, COUPON_VOIDED, ...) are answers,
not errors.`,
		Example: `  couponctl grant --campaign SORRY-1201 --members outage-members.txt
  couponctl grant --campaign SORRY-1201 --members crm-export.csv --csv-column member_id
  couponctl grant --campaign SORRY-1201 --members outage-members.txt --concurrency 16 --out sorry.csv`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case campaignID == "" || members == "":
				return usageError{errors.New("grant needs --campaign ID and --members FILE")}
			case concurrency < 1 || concurrency > maxGrantConcurrency:
				return usageError{fmt.Errorf("--concurrency %d: want 1-%d (members granted at once)", concurrency, maxGrantConcurrency)}
			}
			if err := ids.Campaign(campaignID); err != nil {
				return usageError{fmt.Errorf("--campaign: %w", err)}
			}
			list, err := readMembers(members, column, cmd.ErrOrStderr())
			if err != nil {
				return fileError{fmt.Errorf("grant: --members: %w; nothing was issued", err)}
			}
			if out == "" {
				out = outDefault(members, "."+campaignID+".csv")
			}
			if err := outCheck(out); err != nil {
				return fmt.Errorf("grant: --out %w; nothing was issued", err)
			}
			return runGrant(cmd, grantJob{campaignID: campaignID, members: dedupe(cmd.ErrOrStderr(), "grant", list), out: out,
				concurrency: concurrency, dryRun: dryRun})
		},
	}
	f := c.Flags()
	f.StringVar(&campaignID, "campaign", "", "the campaign to grant (required)")
	f.StringVar(&members, "members", "", "a file of member ids, one a line (required)")
	f.StringVar(&column, "csv-column", "", "read --members as a CSV with a header line, its member ids in the column NAME")
	f.IntVar(&concurrency, "concurrency", defaultGrantConcurrency,
		fmt.Sprintf("members granted at once, 1-%d: the requests in flight and the database connections", maxGrantConcurrency))
	f.StringVar(&out, "out", "", "the CSV of member,result,coupon_id, a regular file or a new name (default BASE.ID.csv in the working directory)")
	f.BoolVar(&dryRun, "dry-run", false, "check everything and say what would be sent; send and write nothing")
	return c
}

// dedupe drops the repeats of members, keeping the first of each, and says on w, as verb, how
// many it dropped.
func dedupe(w io.Writer, verb string, members []string) []string {
	seen := make(map[string]bool, len(members))
	out := members[:0:0]
	for _, m := range members {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	if n := len(members) - len(out); n > 0 {
		fmt.Fprintf(w, "%s: members listed more than once, sent once each: %d\n", verb, n)
	}
	return out
}

// granted is one member's answer: its result code, or the error that stood for one.
type granted struct {
	out issuance.Outcome
	err error
}

// why is g's error, or its result when it has none.
func (g granted) why() string {
	if g.err != nil {
		return g.err.Error()
	}
	return string(g.out.Result)
}

func (g granted) result() string {
	if errors.Is(g.err, issuance.ErrOutcomeUnknown) {
		return resultUnknown
	}
	if g.err != nil {
		return resultError
	}
	return string(g.out.Result)
}

// grantedResult is [granted.result] as the CSV and the summary call it: a variable, so that a
// test can swap in its broken variant (grant_unknown_test.go).
var grantedResult = granted.result

// failed reports whether g is an error: no answer, or RETRY_EXHAUSTED after every attempt.
func (g granted) failed() bool {
	return g.err != nil || g.out.Result == issuance.ResultRetryExhausted
}

// resultError is the CSV's and the summary's result for a member whose call failed.
const resultError = "ERROR"

// resultUnknown is the result for a member whose answer was lost and whose coupon could not be
// looked up either (issuance.ErrOutcomeUnknown): it may hold one; a re-run says which.
const resultUnknown = "UNKNOWN"

// runGrant checks job against the tables, grants it, then writes the CSV and the summary.
func runGrant(cmd *cobra.Command, job grantJob) error {
	ctx := cmd.Context()
	errOut := &lockedWriter{w: cmd.ErrOrStderr()} // the workers' progress and the interruption's note
	cfg, err := issuance.ConfigFromEnv()
	if err != nil {
		return err
	}
	dbCfg, err := db.ConfigFromEnv()
	if err != nil {
		return err
	}
	dbCfg.MaxConns = job.concurrency // one connection per member in flight
	pool, closePool, err := db.Open(ctx, dbCfg)
	if err != nil {
		return err
	}
	defer closePool()
	if err := schema.Check(ctx, pool); err != nil {
		return err
	}
	plan, err := checkGrant(ctx, pool, job)
	if err != nil {
		return err
	}
	if job.dryRun {
		plan.write(errOut, job)
		fmt.Fprintf(cmd.OutOrStdout(), "grant %s: dry run: %d members would be sent (%d of them answer ALREADY_ISSUED, %d COUPON_VOIDED); "+
			"nothing was sent and %s was not written\n", job.campaignID, len(job.members), plan.held, plan.voided, job.out)
		return nil
	}
	// The CSV's directory is checked before anything is issued: answers that cannot be written
	// are found out at the start, not after the grant.
	tmp, err := os.CreateTemp(filepath.Dir(job.out), filepath.Base(job.out)+".*")
	if err != nil {
		return fmt.Errorf("grant: --out: %w; nothing was issued", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing is there to remove
	defer tmp.Close()
	svc, err := issuance.New(pool, cfg)
	if err != nil {
		return err
	}
	plan.write(errOut, job)

	inFlight := func() {
		fmt.Fprintf(errOut, "\ngrant: interrupted: sending no more members; waiting for the requests in flight "+
			"(each ends within %s), then writing the answers\n", cfg.Budget)
	}
	stopNote := context.AfterFunc(ctx, inFlight)
	stop := &grantStop{}
	step, quiet := newRateProgress(errOut, len(job.members), "grant "+job.campaignID)
	results, took := grantAll(ctx, svc, job, step, stop)
	quiet()
	stopNote()
	if err := writeGrantCSV(tmp, job.out, job.members, results); err != nil {
		return fmt.Errorf("grant: --out: %w; the answers are in the tables: run the same command again with another --out", err)
	}
	sum := summarize(job.members, results)
	sum.write(cmd.OutOrStdout(), job, took)
	return grantEnd(ctx, errOut, job, sum, stop)
}

// grantEnd says on errOut why a grant that wrote its answers (sum) stopped before the end of the
// list, or that members failed, and returns the error that sets the exit code: the context's when
// interrupted, [errViolations] when stopped or failed; nil otherwise.
func grantEnd(ctx context.Context, errOut io.Writer, job grantJob, sum grantSummary, stop *grantStop) error {
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(errOut, "grant: interrupted after %d of %d members, whose answers are in %s; run the same command "+
			"again to grant the rest (the members already granted answer ALREADY_ISSUED with the same coupons)\n",
			sum.answered, len(job.members), job.out)
		return ctx.Err()
	case stop.reason() != "":
		fmt.Fprintf(errOut, "couponctl: grant: stopped: %s, run the same command again: %d done, %d not sent "+
			"(the members already granted answer ALREADY_ISSUED with the same coupons); answers in %s\n",
			stop.reason(), sum.answered, len(job.members)-sum.answered, job.out)
		return errViolations
	case sum.failed > 0:
		fmt.Fprintf(errOut, "grant: %d members were not granted because of errors (RETRY_EXHAUSTED or ERROR in %s): "+
			"run the same command again once the cause is fixed; the members already granted answer ALREADY_ISSUED\n",
			sum.failed, job.out)
		return errViolations
	}
	return nil
}

// grantPlan is what the judge says of the list before a grant sends anything.
type grantPlan struct {
	login    string
	campaign campaign.Status
	held     int  // members of the list holding a live coupon of the campaign
	voided   int  // members whose coupon of the campaign was voided, without reissue
	room     *int // the coupons the campaign can still issue now, when the judge gives it
}

// sqlGrantAllowed is the login and whether it may call grant_coupons_batch_v3 (a member of
// coupon_admin, or a superuser).
const sqlGrantAllowed = `
SELECT current_user, has_function_privilege('grant_coupons_batch_v3(text, uuid[], text[], text[])', 'EXECUTE')`

// sqlGrantCheck is the one judge's answer to each member of $2 for campaign $1 now, counted by
// result and reason (grant_check, schema/current/grant_check.sql), most first.
const sqlGrantCheck = `SELECT result, coalesce(reason, ''), members, remaining_coupons, next_release_at, opens_at FROM grant_check($1, $2)`

// grantCount is one row of [sqlGrantCheck].
type grantCount struct {
	result, reason string
	members        int
	remaining      *int
	next, opens    *time.Time
}

// checkGrant refuses, before anything is issued, a grant that cannot issue a coupon: a login
// outside coupon_admin, a campaign that does not exist, or a list of which the judge would issue
// no member a coupon now because of the campaign (not active, no coupon left, every member at
// R3's cap). Otherwise it returns the plan.
func checkGrant(ctx context.Context, pool *pgxpool.Pool, job grantJob) (grantPlan, error) {
	var p grantPlan
	var allowed bool
	if err := pool.QueryRow(ctx, sqlGrantAllowed).Scan(&p.login, &allowed); err != nil {
		return p, fmt.Errorf("grant: %w", err)
	}
	if !allowed {
		return p, fmt.Errorf("grant: database user %q may not grant coupons: a grant runs as a user in coupon_admin "+
			"(docs/roles.md); log in as one, or have the database's owner run GRANT coupon_admin TO %s; nothing was issued",
			p.login, pgx.Identifier{p.login}.Sanitize())
	}
	id := job.campaignID
	rows, err := pool.Query(ctx, sqlGrantCheck, id, job.members)
	if err != nil {
		return p, fmt.Errorf("grant: %w", err)
	}
	var c grantCount
	counts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (grantCount, error) {
		err := row.Scan(&c.result, &c.reason, &c.members, &c.remaining, &c.next, &c.opens)
		return c, err
	})
	if err != nil {
		return p, fmt.Errorf("grant: %w", err)
	}
	by := map[issuance.Result]grantCount{}
	for _, c := range counts {
		by[issuance.Result(c.result)] = c
		if c.remaining != nil {
			p.room = c.remaining
		}
	}
	if _, ok := by[issuance.ResultUnknownCampaign]; ok {
		return p, fmt.Errorf("grant: campaign %s does not exist (couponctl campaign list shows every campaign); nothing was issued", id)
	}
	p.held, p.voided = by[issuance.ResultAlreadyIssued].members, by[issuance.ResultCouponVoided].members
	if p.campaign, err = campaign.Show(ctx, pool, id); err != nil {
		return p, err
	}
	if _, ok := by[issuance.ResultAvailable]; ok {
		return p, nil
	}
	return p, nothingToGrant(ctx, pool, p.campaign, by)
}

// nothingToGrant is the refusal of a grant on campaign s to whose members the judge (by) would
// issue nothing now, saying what to do; nil when they all hold its coupon already.
func nothingToGrant(ctx context.Context, pool *pgxpool.Pool, s campaign.Status, by map[issuance.Result]grantCount) error {
	if c, ok := by[issuance.ResultCampaignNotActive]; ok {
		return grantNotActive(s, c)
	}
	if c, ok := by[issuance.ResultBudgetExceeded]; ok {
		return noRoom(s, c.members, c.next)
	}
	if c, ok := by[issuance.ResultMonthlyCap]; ok {
		set, _, err := rules.Show(ctx, pool)
		if err != nil {
			return fmt.Errorf("grant: %w", err)
		}
		why := fmt.Sprintf("their months are at the %d yen monthly cap", set.MonthlyCapYen)
		if s.DiscountYen > set.MonthlyCapYen {
			why = fmt.Sprintf("campaign %s gives %d yen coupons, above the %d yen monthly cap", s.ID, s.DiscountYen, set.MonthlyCapYen)
		}
		return fmt.Errorf("grant: %s (couponctl rules show): the %d members without its coupon would answer MONTHLY_CAP; "+
			"nothing was issued", why, c.members)
	}
	if c, ok := by[issuance.ResultNotEligible]; ok {
		return fmt.Errorf("grant: the %d members without its coupon are outside campaign %s's audience and would answer "+
			"NOT_ELIGIBLE: add them first (couponctl campaign audience add %s --members FILE --reason TEXT); nothing was issued",
			c.members, s.ID, s.ID)
	}
	return nil
}

// grantNotActive is the refusal of a grant on campaign s, whose c.members members the judge says
// would answer CAMPAIGN_NOT_ACTIVE now for c.reason (ENDED, PAUSED, NOT_STARTED), saying what to
// do.
func grantNotActive(s campaign.Status, c grantCount) error {
	id := s.ID
	who := fmt.Sprintf("the %d members without its coupon would answer CAMPAIGN_NOT_ACTIVE", c.members)
	switch {
	case c.reason == issuance.ReasonEnded && s.State == campaign.StateExpired:
		return fmt.Errorf("grant: campaign %s ended when its coupons expired at %s: %s; "+
			"give it a later expiry first (couponctl campaign update %s --coupons-expire T --reason TEXT); nothing was issued",
			id, tokyoTime(s.CouponsExpireAt), who, id)
	case c.reason == issuance.ReasonEnded:
		return fmt.Errorf("grant: campaign %s ended at %s: %s; "+
			"move its end first (couponctl campaign update %s --ends T --reason TEXT); nothing was issued", id, tokyoTime(s.EndsAt), who, id)
	case c.reason == issuance.ReasonPaused:
		return fmt.Errorf("grant: campaign %s is paused since %s: %s; "+
			"resume it first (couponctl campaign resume %s --reason TEXT); nothing was issued", id, tokyoTime(s.PausedAt), who, id)
	case c.opens == nil:
		return fmt.Errorf("grant: campaign %s has not started and no release of it opens before its end or its coupons' expiry: %s; "+
			"add one first (couponctl campaign update %s --release AT=N --reason TEXT); nothing was issued", id, who, id)
	case s.StartsAt == nil || !c.opens.Equal(*s.StartsAt):
		return fmt.Errorf("grant: campaign %s opens with a release at %s: %s; "+
			"run the grant then, or add an earlier release (couponctl campaign update %s --release AT=N --reason TEXT); nothing was issued",
			id, tokyoTime(c.opens), who, id)
	}
	return fmt.Errorf("grant: campaign %s starts at %s: %s; "+
		"run the grant then, or move its start (couponctl campaign update %s --starts T --reason TEXT); nothing was issued",
		id, tokyoTime(c.opens), who, id)
}

// noRoom is the refusal of a grant to rest members on campaign s, which can issue no coupon
// now: its budget is spent, or the coupons its releases have given so far are taken (next: the
// next release, if one is to come).
func noRoom(s campaign.Status, rest int, next *time.Time) error {
	id := s.ID
	if s.RemainingYen() >= s.DiscountYen {
		then := "no release is to come: add one (couponctl campaign update " + id + " --release AT=N --reason TEXT)"
		if next != nil {
			then = "run the grant after its next release, at " + tokyoTime(next)
		}
		return fmt.Errorf("grant: campaign %s's released coupons are taken: the %d members without its coupon would answer "+
			"BUDGET_EXCEEDED; %s; nothing was issued", id, rest, then)
	}
	return fmt.Errorf("grant: campaign %s has %d yen of budget left, less than one %d yen coupon: the %d members "+
		"without its coupon would answer BUDGET_EXCEEDED; raise its budget first "+
		"(couponctl campaign update %s --add-budget-yen D --reason TEXT); nothing was issued",
		id, s.RemainingYen(), s.DiscountYen, rest, id)
}

// write says what the grant is about to do: to whom, how many at once, as whom, and what the
// tables already settle.
func (p grantPlan) write(w io.Writer, job grantJob) {
	s := p.campaign
	fmt.Fprintf(w, "grant %s (%d yen coupons) to %d members, %d at a time, as %s; answers to %s\n",
		job.campaignID, s.DiscountYen, len(job.members), job.concurrency, p.login, job.out)
	if p.held > 0 {
		fmt.Fprintf(w, "grant: %d of them already hold its coupon: they answer ALREADY_ISSUED with it\n", p.held)
	}
	if p.voided > 0 {
		fmt.Fprintf(w, "grant: %d of them had its coupon voided: they answer COUPON_VOIDED\n", p.voided)
	}
	rest := len(job.members) - p.held - p.voided
	if p.room == nil {
		return
	}
	if room := *p.room; room < rest && len(s.Schedule) > 0 {
		fmt.Fprintf(w, "grant: its releases so far leave room for %d more coupons and %d members are to be granted: "+
			"at least %d will answer BUDGET_EXCEEDED\n", room, rest, rest-room)
	} else if room < rest {
		fmt.Fprintf(w, "grant: its budget has room for %d more coupons (%d yen) and %d members are to be granted: "+
			"at least %d will answer BUDGET_EXCEEDED\n", room, s.RemainingYen(), rest, rest-room)
	}
}

// grantOutageStreak is how many members in a row may fail (an error, or RETRY_EXHAUSTED after
// every attempt) before a grant stops: the relay's breaker threshold (outbox.DefaultBreakerFailures),
// for the same reason, that a streak that long is an outage, not a busy row. A variable, as
// grantStopResult, so that a test can take the stop away (its broken variant).
var grantOutageStreak = outbox.DefaultBreakerFailures

// grantStopResult is the answer that stops a grant: the campaign is no longer active (paused,
// ended, expired), so every member after would answer it too.
var grantStopResult = issuance.ResultCampaignNotActive

// grantStop is why a grant stopped sending before its list's end: set once, by the first worker
// that sees the reason, and read after every worker is done.
type grantStop struct {
	mu     sync.Mutex
	streak int    // failed members in a row
	why    string // "" while the grant goes on
}

// record counts g and says whether the grant must stop: the campaign stopped being active (a
// member answered CAMPAIGN_NOT_ACTIVE, so every one after would), or grantOutageStreak members
// in a row failed.
func (s *grantStop) record(g *granted, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.why != "":
	case g.err == nil && g.out.Result == grantStopResult:
		s.why = fmt.Sprintf("campaign %s is no longer active (%s): couponctl campaign show %s says why; once it is active",
			id, g.out.Reason, id)
	case g.failed():
		if s.streak++; s.streak >= grantOutageStreak {
			s.why = fmt.Sprintf("database unreachable: %d members in a row failed (the last: %s); once it answers", s.streak, g.why())
		}
	default:
		s.streak = 0
	}
	return s.why != ""
}

func (s *grantStop) reason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.why
}

// grantAll grants job's members, job.concurrency at a time, until every one is answered, ctx
// ends or stop says the rest would fail, and returns the answers by member index (nil for a
// member not sent) and the time taken. A request sent is answered: ctx's end stops the sending,
// and the requests in flight run on to their answer (each within ISSUE_BUDGET), so that every
// member the grant reached is in the answers.
func grantAll(ctx context.Context, svc *issuance.Service, job grantJob, step func(), stop *grantStop) ([]*granted, time.Duration) {
	results := make([]*granted, len(job.members))
	calls := context.WithoutCancel(ctx)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range job.concurrency {
		wg.Go(func() {
			for ctx.Err() == nil && stop.reason() == "" {
				i := int(next.Add(1) - 1)
				if i >= len(job.members) {
					return
				}
				g := &granted{}
				for attempt := 1; ; attempt++ {
					g.out, g.err = svc.Grant(calls, job.members[i], job.campaignID)
					if !g.failed() || g.err != nil || attempt == grantAttempts || ctx.Err() != nil {
						break
					}
				}
				results[i] = g
				step()
				stop.record(g, job.campaignID)
			}
		})
	}
	wg.Wait()
	return results, time.Since(start)
}

// writeGrantCSV writes member,result,coupon_id for every answered member, in members' order, to
// tmp, then renames it to path: path is whole or untouched.
func writeGrantCSV(tmp *os.File, path string, members []string, results []*granted) error {
	w := csv.NewWriter(tmp)
	_ = w.Write([]string{"member", "result", "coupon_id"})
	for i, g := range results {
		if g != nil {
			_ = w.Write([]string{grantCSVCell(members[i]), grantedResult(*g), g.out.CouponID})
		}
	}
	w.Flush()
	if err := errors.Join(w.Error(), tmp.Close()); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// csvCell is s as a cell of grant's CSV that no spreadsheet runs as a formula (CSV injection):
// a cell starting with =, +, -, @, tab or carriage return gets a single quote before it, as
// OWASP's "CSV Injection" advises. Member ids are visible ASCII (shared/ids), so they may start
// with the first four.
func csvCell(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

// grantCSVCell is [csvCell] as writeGrantCSV calls it: a variable, so that a test can swap in
// its broken variant (newuser_test.go).
var grantCSVCell = csvCell

// grantSummary is the answers counted by result.
type grantSummary struct {
	counts           map[string]int
	answered, failed int
	firstErrors      []string // "member: error", the first few
}

func summarize(members []string, results []*granted) grantSummary {
	s := grantSummary{counts: map[string]int{}}
	for i, g := range results {
		if g == nil {
			continue
		}
		s.answered++
		s.counts[grantedResult(*g)]++
		if !g.failed() {
			continue
		}
		s.failed++
		if len(s.firstErrors) < 5 {
			s.firstErrors = append(s.firstErrors, members[i]+": "+g.why())
		}
	}
	return s
}

// grantResults are the results in the order the summary lists them: what was granted, the
// refusals, the errors.
var grantResults = []string{
	string(issuance.ResultIssued), string(issuance.ResultAlreadyIssued), string(issuance.ResultMonthlyCap),
	string(issuance.ResultBudgetExceeded), string(issuance.ResultCampaignNotActive), string(issuance.ResultCouponVoided),
	string(issuance.ResultNotEligible), string(issuance.ResultUnknownCampaign), string(issuance.ResultRetryExhausted), resultUnknown, resultError,
}

// grantAdvice says what to do about the members of each refusal or error, for campaign id.
func grantAdvice(result, id string) string {
	switch result {
	case string(issuance.ResultMonthlyCap):
		return "these members have used their monthly cap (couponctl rules show) in this Asia/Tokyo month; the same command next month may grant them"
	case string(issuance.ResultBudgetExceeded):
		return fmt.Sprintf("the budget ran out; raise it (couponctl campaign update %s --add-budget-yen D --reason TEXT) "+
			"and run the same command again: only these members are sent a new coupon", id)
	case string(issuance.ResultCampaignNotActive):
		return fmt.Sprintf("the campaign was paused or ended while the grant ran (couponctl campaign show %s); once it is active, run the same command again", id)
	case string(issuance.ResultCouponVoided):
		return "these members' coupons of the campaign were voided without --allow-reissue (couponctl coupon show COUPON_ID, the id in the CSV); a grant does not issue them another"
	case string(issuance.ResultNotEligible):
		return fmt.Sprintf("these members are not in the campaign's audience (audience-only); add them (couponctl campaign audience add %s --members FILE --reason TEXT) and run the same command again", id)
	case string(issuance.ResultRetryExhausted), resultError:
		return "not granted: errors (below); run the same command again once the cause is fixed"
	case resultUnknown:
		return "the answer was lost and the coupon could not be looked up: each may or may not hold one; the same command again answers ALREADY_ISSUED with it or grants it"
	}
	return ""
}

// write prints the summary: how many members were answered and how fast, the table of results,
// what to do about each refusal, the first errors and where the CSV is.
func (s grantSummary) write(w io.Writer, job grantJob, took time.Duration) {
	fmt.Fprintf(w, "\ngrant %s: %d of %d members answered in %.1f s (%.0f members/s, %d at a time)\n",
		job.campaignID, s.answered, len(job.members), took.Seconds(), float64(s.answered)/max(took.Seconds(), 1e-9), job.concurrency)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "result\tmembers")
	for _, r := range grantResults {
		if n := s.counts[r]; n > 0 {
			fmt.Fprintf(tw, "%s\t%d\n", r, n)
		}
	}
	if n := len(job.members) - s.answered; n > 0 {
		fmt.Fprintf(tw, "(not sent)\t%d\n", n)
	}
	_ = tw.Flush()
	for _, r := range grantResults {
		if advice := grantAdvice(r, job.campaignID); s.counts[r] > 0 && advice != "" {
			fmt.Fprintf(w, "%s: %s\n", r, advice)
		}
	}
	for _, e := range s.firstErrors {
		fmt.Fprintln(w, "  error:", e)
	}
	fmt.Fprintf(w, "answers written to %s (member,result,coupon_id)\n", job.out)
}

// lockedWriter serializes the writes of several goroutines to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// newRateProgress reports progress through total steps with the rate and the time left: a bar on
// a terminal, elsewhere a plain line per 10% and at least every progressEvery (also while no step
// is done). It returns the callback for each step done, safe for concurrent use, and the function
// that ends the reporting.
func newRateProgress(w *lockedWriter, total int, what string) (step func(), quiet func()) {
	if f, ok := w.w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar := progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(what),
			progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("members"),
			progressbar.OptionSetPredictTime(true), progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
		return func() { _ = bar.Add(1) }, func() {}
	}
	var done, said atomic.Int64 // members answered; when the last line was printed, in ns since start
	start := time.Now()
	every := int64(max(1, total/10))
	line := func(n int64) {
		said.Store(int64(time.Since(start)))
		rate := float64(n) / max(time.Since(start).Seconds(), 1e-9)
		left := "?"
		if n > 0 {
			left = time.Duration(float64(int64(total)-n) / rate * float64(time.Second)).Round(time.Second).String()
		}
		fmt.Fprintf(w, "%s: %d/%d members (%d%%), %.0f/s, %s left\n", what, n, total, n*100/int64(total), rate, left)
	}
	// A line at least every progressEvery, even while no member is answered (a stalled database).
	end, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		ticks, stopTicks := progressTicks()
		defer stopTicks()
		for {
			select {
			case <-end:
				return
			case now := <-ticks:
				if now.Sub(start)-time.Duration(said.Load()) >= progressEvery {
					line(done.Load())
				}
			}
		}
	}()
	step = func() {
		n := done.Add(1)
		if n%every != 0 && n != int64(total) {
			return
		}
		line(n)
	}
	return step, func() { close(end); <-ended }
}

// progressEvery is the longest a long verb stays silent on a log (stderr not a terminal). A
// variable, as progressTicks, so that a test can deliver the ticks itself and swap in a broken
// variant (progress_test.go).
var progressEvery = 5 * time.Second

// progressTicks returns the ticks at which a long verb looks whether a progress line is due, every
// progressEvery, and the function that stops them.
var progressTicks = func() (<-chan time.Time, func()) {
	t := time.NewTicker(progressEvery)
	return t.C, t.Stop
}
