package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/shared/backoff"
)

// Retries of one audience chunk that failed without a refusal (a lost connection, a lock held
// past the lock_timeout): a chunk is idempotent, so it is sent again, after a full-jitter wait,
// up to audienceAttempts times in all; then the verb stops rather than grind on through an outage.
const (
	audienceAttempts    = 3
	audienceBackoffBase = 200 * time.Millisecond
	audienceBackoffCap  = 2 * time.Second
)

func campaignAudienceCmd() *cobra.Command {
	return groupCmd("audience", "Add members to a campaign's audience, or remove them",
		audienceVerbCmd(true), audienceVerbCmd(false))
}

// audienceJob is one audience add or remove as the command line gives it.
type audienceJob struct {
	campaignID, file, reason string
	column                   string   // --csv-column: the CSV column of the member ids
	members                  []string // in the file's order, each once
	add                      bool
}

// verb is "add" or "remove".
func (j audienceJob) verb() string {
	if j.add {
		return "add"
	}
	return "remove"
}

func audienceVerbCmd(add bool) *cobra.Command {
	job := audienceJob{add: add}
	short := "Add the members of FILE to a campaign's audience"
	if !add {
		short = "Remove the members of FILE from a campaign's audience"
	}
	c := &cobra.Command{
		Use:   job.verb() + " ID --members FILE [--csv-column NAME] --reason TEXT",
		Short: short,
		Long: `Add the members of FILE to campaign ID's audience (add), or remove them (remove). An
audience-only campaign (campaign create --audience-only) gives its coupon only to its audience's
members: any other member is answered 403 NOT_ELIGIBLE. Removing a member does not void a coupon
it holds (couponctl coupon void does).

FILE is read as grant reads it: one member id a line; blank lines, comments (a line starting with
"#" and a space: an id starting with # is an id) and a UTF-8 BOM before line 1 are skipped; a
BOM further down, UTF-16 text, and a spreadsheet's row or heading (as grant refuses them: a
comma, a semicolon, a tab, a double quote or a |, a leading ', a heading such as member_id) are
refused, naming the line; a member listed twice is sent once. --csv-column NAME reads FILE as a CSV instead, its
first line the headings, the member ids in column NAME. A FILE that is missing, empty or holds a
line that is not a member id changes nothing (exit 2).

The members go to the database in chunks of ` + fmt.Sprint(campaign.MaxAudienceChange) + `, each one transaction that writes one row of the
campaign's history (couponctl campaign history ID) with --reason and the database login. A chunk
is idempotent: a member already in the audience (or, removing, not in it) is left as it is and
counted apart. So the verb is resumable: after Ctrl-C (exit 130), or a stop, run the same command
again; the members already done are counted as in it (or not in it) already.

Progress goes to stderr; the summary (members sent, changed, left as they were, the audience's
size) to stdout. A chunk that fails without a refusal (a lost connection, a lock held past 1 s)
is sent again, up to ` + fmt.Sprint(audienceAttempts) + ` times; then the verb stops rather than grind on through an outage, saying
how many members were done and not sent, and exits 1. A refusal by the database (a campaign
that does not exist, or is open to every member: only an --audience-only campaign has an
audience) stops it at once, exit 1. Run it as a user in coupon_admin (docs/roles.md).`,
		Example: `  couponctl campaign audience add GOLD --members gold-members.txt --reason "gold tier, December (CRM export 2026-12-01)"
  couponctl campaign audience remove GOLD --members downgraded.txt --reason "downgraded to silver"`,
		Args: oneCampaign,
		RunE: func(cmd *cobra.Command, args []string) error {
			job.campaignID = args[0]
			if job.file == "" {
				return flagError("%s needs --members FILE: one member id a line", cmd.CommandPath())
			}
			list, err := readMembers(job.file, job.column, cmd.ErrOrStderr())
			if err != nil {
				return fileError{fmt.Errorf("campaign audience %s: --members: %w; nothing was changed", job.verb(), err)}
			}
			job.members = dedupe(cmd.ErrOrStderr(), "campaign audience "+job.verb(), list)
			return runAudience(cmd, job)
		},
	}
	c.Flags().StringVar(&job.file, "members", "", "a file of member ids, one a line (required)")
	c.Flags().StringVar(&job.column, "csv-column", "", "read --members as a CSV with a header line, its member ids in the column NAME")
	reasonFlag(c, &job.reason)
	return c
}

// audienceRun is what an audience verb has done: members sent in chunks that committed, and of
// them those it changed.
type audienceRun struct {
	sent, changed int
}

// runAudience checks that job's campaign exists, sends job's members in chunks and writes the
// summary.
func runAudience(cmd *cobra.Command, job audienceJob) error {
	ctx := cmd.Context()
	pool, closePool, err := openMigrated(ctx)
	if err != nil {
		return err
	}
	defer closePool()
	s, err := campaign.Show(ctx, pool, job.campaignID)
	if errors.Is(err, campaign.ErrNotFound) {
		return fmt.Errorf("campaign audience %s: campaign %s does not exist (couponctl campaign list shows every campaign); nothing was changed",
			job.verb(), job.campaignID)
	}
	if err != nil {
		return err
	}
	if !s.AudienceOnly {
		return fmt.Errorf("campaign audience %s: campaign %s is open to every member: only a campaign created with --audience-only "+
			"has an audience; nothing was changed", job.verb(), job.campaignID)
	}
	errOut := cmd.ErrOrStderr()
	fmt.Fprintf(errOut, "campaign audience %s %s: %d members in chunks of %d\n", job.verb(), job.campaignID, len(job.members), campaign.MaxAudienceChange)
	done, err := audienceSend(ctx, errOut, pool, job)
	writeAudienceSummary(cmd.OutOrStdout(), job, done)
	if after, showErr := campaign.Show(context.WithoutCancel(ctx), pool, job.campaignID); showErr == nil {
		fmt.Fprintf(cmd.OutOrStdout(), "audience of %s: %d members now\n", job.campaignID, after.AudienceSize)
	}
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(errOut, "campaign audience %s: interrupted after %d of %d members; run the same command again for the rest\n",
			job.verb(), done.sent, len(job.members))
		return ctx.Err()
	case err != nil:
		fmt.Fprintf(errOut, "couponctl: campaign audience %s %s: stopped: %v; %d of %d members done, %d not sent: run the same command again "+
			"(the members done are left as they are)\n", job.verb(), job.campaignID, err, done.sent, len(job.members), len(job.members)-done.sent)
		return errViolations
	}
	return nil
}

// audienceSend is [sendAudience] as the audience verbs call it: a variable, so that a test can
// swap in its broken variant (campaign_audience_test.go).
var audienceSend = sendAudience

// sendAudience sends job's members in chunks of [campaign.MaxAudienceChange], in the file's
// order, until every chunk committed, ctx ends, or a chunk fails: a refusal at once, any other
// failure after [audienceAttempts] tries. A chunk sent is waited for even once ctx ends, so that
// what is reported done is done. It reports progress on w and returns what committed.
func sendAudience(ctx context.Context, w io.Writer, db campaign.Querier, job audienceJob) (audienceRun, error) {
	var done audienceRun
	size := campaign.MaxAudienceChange
	every := max(1, (len(job.members)/10+size-1)/size) * size // a line per tenth of the list, in whole chunks
	for done.sent < len(job.members) && ctx.Err() == nil {
		chunk := job.members[done.sent:min(done.sent+size, len(job.members))]
		n, err := sendChunk(ctx, db, job, chunk)
		if err != nil {
			return done, err
		}
		done.sent, done.changed = done.sent+len(chunk), done.changed+n
		if done.sent%every == 0 || done.sent == len(job.members) {
			fmt.Fprintf(w, "campaign audience %s %s: %d/%d members (%d%%), %d %s\n", job.verb(), job.campaignID,
				done.sent, len(job.members), done.sent*100/len(job.members), done.changed, job.changedWord())
		}
	}
	return done, nil
}

// sendChunk sends one chunk, again after a failure that is not a refusal, at most
// [audienceAttempts] times in all, and returns how many members it changed.
func sendChunk(ctx context.Context, db campaign.Querier, job audienceJob, chunk []string) (int, error) {
	calls := context.WithoutCancel(ctx)
	for attempt := 1; ; attempt++ {
		n, err := campaign.AudienceChange(calls, db, job.campaignID, chunk, job.add, job.reason)
		switch {
		case err == nil || errors.Is(err, campaign.ErrNotFound) || errors.Is(err, campaign.ErrRefused):
			return n, err
		case attempt == audienceAttempts:
			return 0, fmt.Errorf("a chunk of %d members, from %s, failed %d times, the last: %w", len(chunk), chunk[0], attempt, err)
		}
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(backoff.FullJitter(audienceBackoffBase, audienceBackoffCap, attempt)):
		}
	}
}

// changedWord is what a change does to a member: added or removed.
func (j audienceJob) changedWord() string {
	if j.add {
		return "added"
	}
	return "removed"
}

// writeAudienceSummary writes what the verb did: members sent, changed, left as they were, and
// not sent.
func writeAudienceSummary(w io.Writer, job audienceJob, done audienceRun) {
	kept := "were in it already"
	if !job.add {
		kept = "were not in it"
	}
	fmt.Fprintf(w, "campaign audience %s %s: %d of %d members sent: %d %s, %d %s",
		job.verb(), job.campaignID, done.sent, len(job.members), done.changed, job.changedWord(), done.sent-done.changed, kept)
	if rest := len(job.members) - done.sent; rest > 0 {
		fmt.Fprintf(w, ", %d not sent", rest)
	}
	fmt.Fprintln(w)
}
