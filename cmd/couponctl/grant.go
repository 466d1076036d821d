package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/ids"
	"github.com/mops/coupon-api/shared/issuance"
)

// Bounds of grant's --concurrency: each request holds one connection of the pool while it runs,
// and a grant must leave the database to IssueCoupon (docs/performance.md, "Granting a campaign
// to a list").
const (
	defaultGrantConcurrency = 8
	maxGrantConcurrency     = 64
)

// grantAttempts is how many times grant sends a member whose answer was RETRY_EXHAUSTED (the
// campaign's rows were busy for the whole 2.5 s budget) before it reports it.
const grantAttempts = 3

func grantCmd() *cobra.Command {
	var (
		campaignID, members, out string
		concurrency              int
	)
	c := &cobra.Command{
		Use:   "grant --campaign ID --members FILE [--concurrency N] [--out CSV]",
		Short: "Issue a campaign to every member of a list, through IssueCoupon's rules and answers",
		Long: `Issue campaign ID to each member of FILE (one member id a line; blank lines and lines starting
with # are skipped; a member listed twice is sent once), through the same issuance as
IssueCoupon: the same rules (R1 budget, R2 one per member, R3 monthly cap at MONTHLY_CAP_YEN),
timeouts and result codes. It runs as a user in coupon_admin (docs/roles.md), and every coupon
granted records that login.

It is idempotent: a second run of the same file issues nothing new and answers ALREADY_ISSUED
with the same coupon ids. So it is resumable: after Ctrl-C (or a crash), run the same command
again. --concurrency requests are in flight at once (default 8, at most 64; each holds one
database connection while it runs): a grant shares the database with IssueCoupon. A member whose
answer was RETRY_EXHAUSTED is sent again, up to 3 times.

It shows a progress bar with the rate and the time left (a line per 10% when stderr is not a
terminal), then a table of the answers, and writes --out (default FILE.ID.csv beside FILE): a
CSV of member,result,coupon_id for every member answered, in FILE's order, written whole even
when interrupted. Exits 1 if any answer was an error (RETRY_EXHAUSTED three times, a failure);
refusals (MONTHLY_CAP, BUDGET_EXCEEDED, COUPON_VOIDED, ...) are answers, not errors.`,
		Example: `  couponctl grant --campaign SORRY-1201 --members outage-members.txt
  couponctl grant --campaign SORRY-1201 --members outage-members.txt --concurrency 16 --out sorry.csv`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case campaignID == "" || members == "":
				return usageError{errors.New("grant needs --campaign ID and --members FILE")}
			case concurrency < 1 || concurrency > maxGrantConcurrency:
				return usageError{fmt.Errorf("--concurrency %d: want 1-%d", concurrency, maxGrantConcurrency)}
			}
			if err := ids.Campaign(campaignID); err != nil {
				return usageError{fmt.Errorf("--campaign: %w", err)}
			}
			list, err := readIDs(members, ids.Member)
			if err != nil {
				return err
			}
			if out == "" {
				out = members + "." + campaignID + ".csv"
			}
			return runGrant(cmd, campaignID, dedupe(cmd.ErrOrStderr(), list), out, concurrency)
		},
	}
	f := c.Flags()
	f.StringVar(&campaignID, "campaign", "", "the campaign to grant (required)")
	f.StringVar(&members, "members", "", "a file of member ids, one a line (required)")
	f.IntVar(&concurrency, "concurrency", defaultGrantConcurrency, fmt.Sprintf("requests in flight at once, 1-%d", maxGrantConcurrency))
	f.StringVar(&out, "out", "", "the CSV of member,result,coupon_id (default FILE.ID.csv)")
	return c
}

// dedupe drops the repeats of members, keeping the first of each, and says how many it dropped.
func dedupe(w io.Writer, members []string) []string {
	seen := make(map[string]bool, len(members))
	out := members[:0:0]
	for _, m := range members {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	if n := len(members) - len(out); n > 0 {
		fmt.Fprintf(w, "grant: %d members listed more than once are sent once\n", n)
	}
	return out
}

// granted is one member's answer: its result code, or the error that stood for one.
type granted struct {
	out issuance.Outcome
	err error
}

func (g granted) result() string {
	if g.err != nil {
		return "ERROR"
	}
	return string(g.out.Result)
}

// failed reports whether g is an error: no answer, or RETRY_EXHAUSTED after every attempt.
func (g granted) failed() bool {
	return g.err != nil || g.out.Result == issuance.ResultRetryExhausted
}

// runGrant grants campaignID to members, concurrency at a time, then writes the CSV to out and
// the summary.
func runGrant(cmd *cobra.Command, campaignID string, members []string, out string, concurrency int) error {
	ctx, errOut := cmd.Context(), cmd.ErrOrStderr()
	cfg, err := issuance.ConfigFromEnv()
	if err != nil {
		return err
	}
	dbCfg, err := db.ConfigFromEnv()
	if err != nil {
		return err
	}
	dbCfg.MaxConns = max(dbCfg.MaxConns, concurrency)
	pool, closePool, err := db.Open(ctx, dbCfg)
	if err != nil {
		return err
	}
	defer closePool()
	if err := schema.Check(ctx, pool); err != nil {
		return err
	}
	svc, err := issuance.New(pool, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(errOut, "grant: %s to %d members, %d at a time; answers to %s\n", campaignID, len(members), concurrency, out)
	results, took := grantAll(ctx, svc, campaignID, members, concurrency, newRateProgress(errOut, len(members), "grant "+campaignID))
	if err := writeGrantCSV(out, members, results); err != nil {
		return err
	}
	answered := writeGrantSummary(cmd.OutOrStdout(), members, results, took)
	fmt.Fprintf(cmd.OutOrStdout(), "answers written to %s\n", out)
	if ctx.Err() != nil {
		fmt.Fprintf(errOut, "grant: interrupted after %d of %d members; run the same command again to grant the rest "+
			"(the members reached answer ALREADY_ISSUED with the same coupons)\n", answered, len(members))
		return ctx.Err()
	}
	if slices.ContainsFunc(results, func(g *granted) bool { return g != nil && g.failed() }) {
		return errViolations
	}
	return nil
}

// grantAll sends each member, concurrency at a time, until done or ctx ends, and returns the
// answers by member index (nil for a member not sent) and the time taken.
func grantAll(ctx context.Context, svc *issuance.Service, campaignID string, members []string, concurrency int,
	step func()) ([]*granted, time.Duration) {
	results := make([]*granted, len(members))
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range concurrency {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(members) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				g := &granted{}
				for attempt := 0; attempt < grantAttempts; attempt++ {
					g.out, g.err = svc.Grant(ctx, members[i], campaignID)
					if g.err != nil || g.out.Result != issuance.ResultRetryExhausted {
						break
					}
				}
				if ctx.Err() != nil && g.err != nil {
					return // cut by the interruption: not answered
				}
				results[i] = g
				step()
			}
		})
	}
	wg.Wait()
	return results, time.Since(start)
}

// writeGrantCSV writes member,result,coupon_id for every answered member, in members' order, to
// a temporary file renamed to path: path is whole or untouched.
func writeGrantCSV(path string, members []string, results []*granted) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("grant: --out: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing is there to remove
	w := csv.NewWriter(tmp)
	_ = w.Write([]string{"member", "result", "coupon_id"})
	for i, g := range results {
		if g != nil {
			_ = w.Write([]string{members[i], g.result(), g.out.CouponID})
		}
	}
	w.Flush()
	if err := errors.Join(w.Error(), tmp.Close()); err != nil {
		return fmt.Errorf("grant: --out: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("grant: --out: %w", err)
	}
	return nil
}

// writeGrantSummary writes the answers by result, the rate and the first errors, and returns how
// many members were answered.
func writeGrantSummary(w io.Writer, members []string, results []*granted, took time.Duration) int {
	counts := map[string]int{}
	var answered int
	var firstErrs []string
	for i, g := range results {
		if g == nil {
			continue
		}
		answered++
		counts[g.result()]++
		if g.failed() && len(firstErrs) < 5 {
			why := string(g.out.Result)
			if g.err != nil {
				why = g.err.Error()
			}
			firstErrs = append(firstErrs, fmt.Sprintf("%s: %s", members[i], why))
		}
	}
	fmt.Fprintf(w, "\n%d of %d members answered in %.1f s (%.0f/s)\n", answered, len(members), took.Seconds(),
		float64(answered)/max(took.Seconds(), 1e-9))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "result\tmembers")
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%d\n", k, counts[k])
	}
	_ = tw.Flush()
	for _, e := range firstErrs {
		fmt.Fprintln(w, "error:", e)
	}
	return answered
}

// newRateProgress reports progress through total steps with the rate and the time left: a bar on
// a terminal, a plain line per 10% elsewhere. It returns the callback for each step done.
func newRateProgress(w io.Writer, total int, what string) func() {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar := progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(what),
			progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("members"),
			progressbar.OptionSetPredictTime(true), progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
		return func() { _ = bar.Add(1) }
	}
	var done atomic.Int64
	start := time.Now()
	every := int64(max(1, total/10))
	return func() {
		n := done.Add(1)
		if n%every != 0 && n != int64(total) {
			return
		}
		rate := float64(n) / max(time.Since(start).Seconds(), 1e-9)
		left := time.Duration(float64(int64(total)-n) / rate * float64(time.Second)).Round(time.Second)
		fmt.Fprintf(w, "%s: %d/%d members (%d%%), %.0f/s, %s left\n", what, n, total, n*100/int64(total), rate, left)
	}
}
