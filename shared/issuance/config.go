package issuance

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/envconf"
)

const (
	// DefaultMonthlyCapYen is R3's cap per member and Asia/Tokyo calendar month, in yen, until
	// an operator changes it (the member cap regulation, which protects the gross margin per
	// member). The cap is a rule setting in the database (coupon_rules, migration 00021), which
	// every issuance reads; `couponctl rules set` changes it.
	DefaultMonthlyCapYen = 2000

	// MaxMonthlyCapYen bounds R3's cap, in yen (coupon_rules' CHECK): issue_coupons_batch_v3 adds a
	// coupon's yen to a member's used_yen, a PostgreSQL integer (int4), before comparing with
	// the cap. used_yen stays at most the cap, and a coupon above the cap is MONTHLY_CAP before
	// any sum, so the sum stays at most twice the cap: 2,000,000,000 below int4's 2,147,483,647.
	MaxMonthlyCapYen = 1_000_000_000

	// AppTimeout is how long the app gateway waits for IssueCoupon (3 s); the whole call,
	// retries included, must end inside it.
	AppTimeout = 3 * time.Second

	// DefaultBudget is the whole-call budget, inside the app's 3 s timeout with room for the
	// HTTP round trip (docs/api.md, ISSUE_BUDGET).
	DefaultBudget = 2500 * time.Millisecond

	// DefaultLockTimeout caps one attempt's lock_timeout: above the contended waits on one hot
	// campaign row (docs/hot-row.md), a wait past 1 s is a stuck lock holder, not contention, and
	// the attempt gives up with 55P03 so that a retry still fits.
	DefaultLockTimeout = 1 * time.Second

	// DefaultStatementTimeout caps one attempt's statement_timeout; it stays above the lock
	// timeout so that a lock wait ends as 55P03 (retryable), not 57014.
	DefaultStatementTimeout = 2 * time.Second

	// MaxAttempts bounds a member's attempts lost to contention (the retry policy:
	// [Service.run]).
	MaxAttempts = 5

	// BackoffBase and BackoffCap bound the full-jitter wait after a failed attempt (the retry
	// policy: [Service.run]).
	BackoffBase = 10 * time.Millisecond
	BackoffCap  = 200 * time.Millisecond

	// minAttemptTime is the least time left for which an attempt is still started: below it the
	// call cannot finish (its round trip and a budget row's queue on a busy campaign), and
	// starting one only adds load.
	minAttemptTime = 20 * time.Millisecond

	// ServerMargin is how much earlier than the call's deadline an attempt's statement_timeout
	// fires, so that a statement running late is cancelled by the server (57014, the pooled
	// connection stays usable) before the client's deadline cuts it: a round trip to Cloud SQL in
	// the same region is a few ms; the rest covers scheduling on a busy instance.
	ServerMargin = 100 * time.Millisecond

	// ResolveTimeout is the part of the budget kept for the look-up that settles a call whose
	// answer was lost (docs/api.md: the service resolves it before answering): a dial and two
	// short statements on a fresh connection, with room for a lost session's termination.
	ResolveTimeout = 300 * time.Millisecond

	// DefaultBatchMax is how many members one coalesced call of a campaign takes at most
	// (ISSUE_BATCH_MAX; docs/hot-campaigns.md, "Coalescing: when to change ISSUE_BATCH_MAX":
	// measured against 1, 8 and 128 behind a synchronous standby).
	DefaultBatchMax = 32

	// MaxBatchMax bounds ISSUE_BATCH_MAX: a call of more members holds its rows longer and
	// fails more members at once.
	MaxBatchMax = 128

	// DefaultDryRunMaxLag bounds how far behind the primary the read pool may be for a dry run
	// to be answered there ([Service.UseReadPool]): one second, about the time a member takes
	// to press the button after the page shows the dry run's answer.
	DefaultDryRunMaxLag = time.Second

	// MaxDryRunMaxLag bounds ISSUE_DRY_RUN_MAX_LAG: an answer an hour old is no dry run.
	MaxDryRunMaxLag = time.Hour

	// terminateStep is how long one pg_terminate_backend call of that look-up waits for the
	// lost transaction's backend before the look-up checks again, and how long it waits before
	// dialling again when the database cannot be reached.
	terminateStep = 20 * time.Millisecond
)

// attemptsEnd is the deadline of a call's attempts, given the call's deadline (start + Budget,
// from which every bound of the call is derived: docs/api.md, "The 3 s bound"): what remains is
// kept for a running call's cancellation (db.CancelGrace) and the settlement of a lost answer
// ([ResolveTimeout]).
func attemptsEnd(callEnd time.Time) time.Time {
	return callEnd.Add(-db.CancelGrace - ResolveTimeout)
}

// minBudget is the least budget that leaves two attempts their minimum time, 0.84 s: one
// attempt's minimum alone would leave none once the clock has moved on by the first check.
const minBudget = db.CancelGrace + ResolveTimeout + 2*(minAttemptTime+ServerMargin)

// Config tunes a [Service]. Zero fields take the defaults above.
type Config struct {
	// Budget bounds one whole call, all attempts and waits and the settlement of a lost answer
	// included (env ISSUE_BUDGET). Default [DefaultBudget]; at least minBudget (0.84 s), at most
	// [AppTimeout].
	Budget time.Duration
	// LockTimeout caps each attempt's lock_timeout (env ISSUE_LOCK_TIMEOUT).
	// Default [DefaultLockTimeout]; must be below StatementTimeout.
	LockTimeout time.Duration
	// StatementTimeout caps each attempt's statement_timeout (env ISSUE_STATEMENT_TIMEOUT).
	// Default [DefaultStatementTimeout]; at most Budget.
	StatementTimeout time.Duration
	// BatchMax is how many requests for one campaign one call may take (env ISSUE_BATCH_MAX):
	// the requests that arrive while a call for their campaign is in flight wait for it, then
	// go together as one call of at most BatchMax members (docs/design.md, "Coalescing a hot
	// campaign"). Dry runs ([Service.DryRun]) are coalesced apart from the issuances, by the same
	// bound. 1 turns coalescing off. Default [DefaultBatchMax]; at most [MaxBatchMax].
	BatchMax int
	// DryRunMaxLag is the largest lag of the read pool, as the read pool measures it, at which a
	// dry run is answered there; beyond it the dry run is asked of the primary (env
	// ISSUE_DRY_RUN_MAX_LAG, a Go duration such as 1s or 250ms). Used only with a read pool
	// ([Service.UseReadPool]). Default [DefaultDryRunMaxLag]; at most [MaxDryRunMaxLag].
	DryRunMaxLag time.Duration
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Budget == 0 {
		c.Budget = DefaultBudget
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = DefaultStatementTimeout
	}
	if c.BatchMax == 0 {
		c.BatchMax = DefaultBatchMax
	}
	if c.DryRunMaxLag == 0 {
		c.DryRunMaxLag = DefaultDryRunMaxLag
	}
	return c
}

// Validate refuses a configuration that cannot keep the timeout order
// 0 < LockTimeout < StatementTimeout <= Budget <= AppTimeout, a Budget below minBudget (0.84 s),
// a BatchMax outside 1..[MaxBatchMax], or a DryRunMaxLag not positive or above [MaxDryRunMaxLag].
func (c Config) Validate() error {
	var errs []error
	if c.Budget < minBudget || c.Budget > AppTimeout {
		errs = append(errs, fmt.Errorf("budget %s: must be in [%s, %s]: inside the app's timeout, with room for an attempt, "+
			"a running call's cancellation and a lost answer's settlement", c.Budget, minBudget, AppTimeout))
	}
	if c.LockTimeout <= 0 || c.LockTimeout >= c.StatementTimeout {
		errs = append(errs, fmt.Errorf("lock timeout %s: must be positive and below the statement timeout %s",
			c.LockTimeout, c.StatementTimeout))
	}
	if c.StatementTimeout <= 0 {
		errs = append(errs, fmt.Errorf("statement timeout %s: must be positive", c.StatementTimeout))
	}
	if c.BatchMax < 1 || c.BatchMax > MaxBatchMax {
		errs = append(errs, fmt.Errorf("batch max %d: must be 1 (no coalescing) to %d", c.BatchMax, MaxBatchMax))
	}
	if c.DryRunMaxLag <= 0 || c.DryRunMaxLag > MaxDryRunMaxLag {
		errs = append(errs, fmt.Errorf("dry run max lag %s: must be positive and at most %s", c.DryRunMaxLag, MaxDryRunMaxLag))
	}
	if c.StatementTimeout > c.Budget {
		errs = append(errs, fmt.Errorf("statement timeout %s: must not exceed the budget %s", c.StatementTimeout, c.Budget))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("issuance: invalid config: %w", err)
	}
	return nil
}

// attemptTimeouts derives one attempt's lock_timeout and statement_timeout from the time left
// in the budget: the statement timeout ends [ServerMargin] before the budget does, and the lock
// timeout stays strictly below it (three quarters at most), so a lock wait ends as 55P03
// before the statement is cancelled, and both end on the server before the client gives up.
func (c Config) attemptTimeouts(left time.Duration) (lock, statement time.Duration) {
	statement = min(c.StatementTimeout, left-ServerMargin)
	lock = min(c.LockTimeout, statement*3/4)
	return lock, statement
}

// QueueTimeouts queues on b the statement that arms one attempt's lock_timeout and
// statement_timeout, derived from left, the time left in the budget ([Config.attemptTimeouts]),
// for the attempt's implicit transaction only (sqlTimeoutsSet); queue the attempt's call after it
// in the same pipeline. It returns the statement timeout. The redemption arms its calls with it
// too (shared/redemption).
func (c Config) QueueTimeouts(b *pgx.Batch, left time.Duration) (statement time.Duration) {
	lock, statement := c.attemptTimeouts(left)
	b.Queue(sqlTimeoutsSet, pgInterval(lock), pgInterval(statement))
	return statement
}

// minTimeout is the least lock or statement timeout: PostgreSQL takes them in whole
// milliseconds, and 0 is its "wait forever".
const minTimeout = time.Millisecond

// ConfigFromEnv reads ISSUE_BUDGET (0.84s..3s), ISSUE_LOCK_TIMEOUT and ISSUE_STATEMENT_TIMEOUT
// (1ms..3s each), ISSUE_BATCH_MAX (1..[MaxBatchMax]) and ISSUE_DRY_RUN_MAX_LAG
// (1ms..[MaxDryRunMaxLag]) (docs/api.md, "Configuration"),
// defaults for the unset ones, and refuses a value outside its range, naming it, what
// [Config.Validate] refuses, and a MONTHLY_CAP_YEN still set ([RefuseMonthlyCapEnv]). An
// explicit zero is refused, never taken for "unset": ISSUE_LOCK_TIMEOUT=0s would be
// PostgreSQL's "wait forever".
func ConfigFromEnv() (Config, error) {
	var c Config
	var errs [6]error
	errs[0] = RefuseMonthlyCapEnv()
	c.Budget, errs[1] = envconf.DurationIn("ISSUE_BUDGET", DefaultBudget, minBudget, AppTimeout)
	c.LockTimeout, errs[2] = envconf.DurationIn("ISSUE_LOCK_TIMEOUT", DefaultLockTimeout, minTimeout, AppTimeout)
	c.StatementTimeout, errs[3] = envconf.DurationIn("ISSUE_STATEMENT_TIMEOUT", DefaultStatementTimeout, minTimeout, AppTimeout)
	c.BatchMax, errs[4] = envconf.IntIn("ISSUE_BATCH_MAX", DefaultBatchMax, 1, MaxBatchMax)
	c.DryRunMaxLag, errs[5] = envconf.DurationIn("ISSUE_DRY_RUN_MAX_LAG", DefaultDryRunMaxLag, minTimeout, MaxDryRunMaxLag)
	if err := errors.Join(errs[:]...); err != nil {
		return c, fmt.Errorf("issuance: %w", err)
	}
	return c, c.Validate()
}

// ErrMonthlyCapEnv is what [RefuseMonthlyCapEnv] returns: MONTHLY_CAP_YEN is set.
var ErrMonthlyCapEnv = errors.New("MONTHLY_CAP_YEN is set, but R3's monthly cap is a rule setting in the database " +
	"(migration 00021): change it with `couponctl rules set --monthly-cap-yen N --reason TEXT`, see it with " +
	"`couponctl rules show`, and unset MONTHLY_CAP_YEN")

// RefuseMonthlyCapEnv returns [ErrMonthlyCapEnv] when MONTHLY_CAP_YEN is set, even empty: a
// process that still sets it expects a cap of its own, which no process has since every issuance
// reads the database's (two instances once enforced two caps). IssueCoupon and every couponctl
// and couponops verb call it at start-up.
func RefuseMonthlyCapEnv() error {
	if v, ok := os.LookupEnv("MONTHLY_CAP_YEN"); ok {
		return fmt.Errorf("%w (it is %q)", ErrMonthlyCapEnv, v)
	}
	return nil
}

// String lists the effective settings, for the start-up log line.
func (c Config) String() string {
	return fmt.Sprintf("budget=%s lock_timeout=%s statement_timeout=%s batch_max=%d dry_run_max_lag=%s",
		c.Budget, c.LockTimeout, c.StatementTimeout, c.BatchMax, c.DryRunMaxLag)
}
