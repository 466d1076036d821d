package isolationlab

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/shared/issuance"
)

// Outcome is what one call of a strategy answered.
type Outcome struct {
	// Result is the result code: docs/api.md's, or [ResultSystemError] for the Before code.
	Result string
	// Attempts is how many transactions the call started; those beyond the first are retries.
	Attempts int
}

// GaveUp reports whether result is a strategy giving up after its retries: RETRY_EXHAUSTED, or
// the Before code's SYSTEM_ERROR.
func GaveUp(result string) bool {
	return result == ResultRetryExhausted || result == ResultSystemError
}

// IssueFunc asks for one coupon of campaignID for memberID the way a strategy does. An error is
// a request that got no result code (the caller would see a 500).
type IssueFunc func(ctx context.Context, memberID, campaignID string) (Outcome, error)

// Env is what a strategy gets for one run: a fresh database, already set up with the campaigns
// and, for a strategy with BeforeSchema, broken by [BreakSchema].
type Env struct {
	Pool *pgxpool.Pool
	// CapYen is R3's monthly cap in yen, which the run also set in the database (coupon_rules,
	// the production path's and reconcile's).
	CapYen int
	// Now is the run's start: the strategies other than the production path take
	// issuance.Month(Now) as the month the caller passes in (the production path's is the
	// database's clock).
	Now time.Time
	// Push is the simulated LINE push for strategies that push inside the transaction; it
	// records the coupon id and waits [DefaultPushDelay].
	Push func(ctx context.Context, memberID, couponID string)
}

// Strategy is one way of issuing coupons that the lab runs the same load through. Later
// strategies (budget stripes, ...) plug in by being added to [Strategies].
type Strategy struct {
	// Name is what `couponctl sim --strategies` and the table call it.
	Name string
	// Summary says in one line what it is and where it comes from.
	Summary string
	// BeforeSchema runs it on the incident's schema: [BreakSchema] drops the unique index on
	// (campaign_id, member_id) and the CHECK on the budget counter.
	BeforeSchema bool
	// New returns the strategy's issue function for one run.
	New func(env Env) (IssueFunc, error)
}

// Strategies are the strategies the lab knows, in the order the table shows them: the incident's
// code, the two rejected proposals of docs/design.md, and the production path.
var Strategies = []Strategy{
	{
		Name:         "before",
		Summary:      "the incident's code at READ COMMITTED: read-judge-write in Go, push inside the transaction, blind retries",
		BeforeSchema: true,
		New: func(env Env) (IssueFunc, error) {
			b := &Before{Pool: env.Pool, CapYen: env.CapYen, Month: issuance.Month(env.Now), Push: env.Push}
			return b.IssueOutcome, nil
		},
	},
	{
		Name:         "repeatable-read",
		Summary:      "junior proposal A: the same code at REPEATABLE READ, retrying SQLSTATE 40001",
		BeforeSchema: true,
		New: func(env Env) (IssueFunc, error) {
			b := &Before{Pool: env.Pool, CapYen: env.CapYen, Month: issuance.Month(env.Now),
				Isolation: pgx.RepeatableRead, RetrySerializationOnly: true, Push: env.Push}
			return b.IssueOutcome, nil
		},
	},
	{
		Name:         "serializable",
		Summary:      "junior proposal B: the same logic at SERIALIZABLE, outbox instead of push, 40001 retried with full jitter",
		BeforeSchema: true,
		New: func(env Env) (IssueFunc, error) {
			s := &Serializable{Pool: env.Pool, CapYen: env.CapYen, Month: issuance.Month(env.Now)}
			return s.Issue, nil
		},
	},
	{
		Name:    "good",
		Summary: "the production path, issuance.Service: READ COMMITTED, one conditional write per rule, outbox",
		New: func(env Env) (IssueFunc, error) {
			svc, err := issuance.New(env.Pool, issuance.Config{})
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, memberID, campaignID string) (Outcome, error) {
				out, err := svc.Issue(ctx, memberID, campaignID)
				return Outcome{Result: string(out.Result), Attempts: out.Attempts}, err
			}, nil
		},
	},
}

// StrategyNamed returns the strategy called name, or an error that lists the known names.
func StrategyNamed(name string) (Strategy, error) {
	names := make([]string, 0, len(Strategies))
	for _, s := range Strategies {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return Strategy{}, fmt.Errorf("isolationlab: unknown strategy %q (known: %v)", name, names)
}
