package outbox

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/mops/coupon-api/shared/envconf"
)

const (
	// DefaultBaseURL is the LINE Messaging API's endpoint (LINE_API_BASE_URL overrides it).
	DefaultBaseURL = "https://api.line.me"

	// LINEPushRateLimit is the push endpoint's rate limit, in requests per second per channel
	// (LINE Messaging API reference, "Rate limits": 2,000 requests per second for sending
	// messages). [Config.Validate] refuses a RateLimit above it.
	LINEPushRateLimit = 2000

	// DefaultBatchSize is how many rows one claim takes, in rows (env RELAY_BATCH_SIZE).
	DefaultBatchSize = 50

	// DefaultMaxRows is how many rows one run handles at most when the request does not say,
	// in rows (10 s of pushing at the default rate limit); against the real LINE the run budget
	// usually ends a run first.
	DefaultMaxRows = 5000

	// DefaultParallelism is how many pushes of a batch are in flight at once (env
	// RELAY_PARALLELISM). At LINE's usual ~0.1 s per push, 8 workers send about 80 per second.
	DefaultParallelism = 8

	// DefaultRateLimit caps one relay's pushes, in pushes per second (env RELAY_RATE_LIMIT): a
	// quarter of [LINEPushRateLimit], so four overlapping runs stay below LINE's limit.
	DefaultRateLimit = LINEPushRateLimit / 4

	// DefaultMaxAttempts is the attempt limit per row (env RELAY_MAX_ATTEMPTS): a row whose
	// push was sent and failed that many times is parked (dead-lettered). A row given back
	// unpushed (see the package doc) is not charged.
	DefaultMaxAttempts = 10

	// DefaultBreakerFailures is how many pushes in a row may fail with a timeout, a connection
	// error or a 5xx before a run stops pushing (env RELAY_BREAKER_FAILURES): LINE is down or
	// hanging, and the rows not yet pushed are given back for a later run instead of each
	// waiting out its push timeout and using up an attempt.
	DefaultBreakerFailures = 10

	// DefaultPushTimeout bounds one push's HTTP round trip (env RELAY_PUSH_TIMEOUT). A push
	// that times out is retried later with the same retry key, so LINE answers 409 if the
	// first one got through.
	DefaultPushTimeout = 5 * time.Second

	// DefaultBatchTimeout bounds the pushes of one claimed batch (env RELAY_BATCH_TIMEOUT):
	// a push in flight when it ends is cancelled and retried later; a row not yet pushed is
	// given back.
	DefaultBatchTimeout = 15 * time.Second

	// DefaultMarkTimeout bounds the database work around the pushes (env RELAY_MARK_TIMEOUT):
	// the run's start, each claim, and the marks of one batch together (every mark
	// of a batch ends by its start + BatchTimeout + MarkTimeout). A mark runs even when the
	// run's caller has gone away: the push happened and should be recorded.
	DefaultMarkTimeout = 2 * time.Second

	// DefaultLease is how long a claimed row stays invisible to other runs (env RELAY_LEASE):
	// longer than a batch and its marks (BatchTimeout + MarkTimeout), so a live run never
	// loses a row it is pushing; a crashed run's rows come back after it, and are re-sent with
	// the same retry key.
	DefaultLease = 30 * time.Second

	// DefaultRunBudget bounds one run (env RELAY_RUN_BUDGET), inside Cloud Scheduler's
	// one-minute period so consecutive runs rarely overlap; the package doc says how a run keeps
	// to it. Deploy the function with a request timeout of at least 60 s.
	DefaultRunBudget = 50 * time.Second

	// DefaultRetryBase and DefaultRetryCap bound the full-jitter wait before attempt n+1, uniform
	// in [0, min(RetryCap, RetryBase*2^(n-1))) (env RELAY_RETRY_BASE, RELAY_RETRY_CAP;
	// M. Brooker, "Exponential Backoff And Jitter"). With 10 attempts the waits add up to at
	// most about 2 hours, inside the 24 hours for which LINE remembers a retry key. LINE's
	// Retry-After is honoured up to RetryCap.
	DefaultRetryBase = 30 * time.Second
	DefaultRetryCap  = 30 * time.Minute

	// RetryKeyWindow is how long after a row's first push the relay still re-sends it
	// automatically: LINE honours a retry key for 24 hours only (LINE Messaging API reference,
	// "Retry failed API requests"); after that a re-send with the same key may deliver the
	// message a second time. The hour of margin covers a run's length and clock skew between
	// the database and LINE. A row past it is parked; `couponctl outbox requeue --force` sends
	// it anyway. [Config.Validate] keeps RetryCap below it.
	RetryKeyWindow = 23 * time.Hour

	// DefaultRetention is how long sent and skipped outbox rows are kept before [Prune] deletes
	// them, so the table and its indexes stay small; env RELAY_RETENTION (e.g. 720h) overrides it
	// in outbox prune and reconcile (couponops, the daily jobs, and couponctl).
	DefaultRetention = 30 * 24 * time.Hour

	// PruneBatch bounds the rows one prune statement deletes, in rows: a short statement that
	// holds its row locks briefly, repeated until the backlog is gone.
	PruneBatch = 1000

	// MaxBatchSize bounds RELAY_BATCH_SIZE, in rows: as [PruneBatch], one claim statement's rows
	// and row locks kept few.
	MaxBatchSize = 1000

	// MaxParallelism bounds RELAY_PARALLELISM, in pushes in flight: at LINE's usual ~0.1 s per
	// push, 200 in flight already reach [LINEPushRateLimit].
	MaxParallelism = LINEPushRateLimit / 10

	// MaxMaxAttempts bounds RELAY_MAX_ATTEMPTS: with the full-jitter waits capped at
	// RELAY_RETRY_CAP, a row's retries end inside [RetryKeyWindow] long before it.
	MaxMaxAttempts = 100

	// MaxBreakerFailures bounds RELAY_BREAKER_FAILURES, in failed pushes in a row: one batch
	// at most ([MaxBatchSize]).
	MaxBreakerFailures = MaxBatchSize

	// MaxRunBudget bounds RELAY_RUN_BUDGET: Cloud Run's longest request timeout (60 minutes,
	// Cloud Run docs, "Configure request timeout"), beyond which the front end cuts the run.
	MaxRunBudget = time.Hour

	// minTimeout is the least of the relay's timeouts and lease: PostgreSQL keeps an interval
	// in microseconds, and a shorter one ends before any round trip.
	minTimeout = time.Millisecond
)

// Config tunes a [Relay]. Zero fields take the defaults above, except RetryBase and RetryCap,
// whose zero ("0s": retry on the next run) is kept by [ConfigFromEnv].
type Config struct {
	// ChannelAccessToken authenticates the pushes (env LINE_CHANNEL_ACCESS_TOKEN, mounted from
	// Secret Manager when deployed). Required.
	ChannelAccessToken string
	// BaseURL is the Messaging API endpoint (env LINE_API_BASE_URL). Default [DefaultBaseURL];
	// tests and the demo point it at the LINE stand-in (internal/testkit/linestub).
	BaseURL string
	// BatchSize is the rows per claim. Default [DefaultBatchSize].
	BatchSize int
	// MaxRows is the rows per run when the caller does not say. Default [DefaultMaxRows].
	MaxRows int
	// Parallelism is the pushes in flight at once. Default [DefaultParallelism].
	Parallelism int
	// RateLimit is the pushes per second of this relay, at most [LINEPushRateLimit].
	// Default [DefaultRateLimit].
	RateLimit float64
	// PushTimeout bounds one push. Default [DefaultPushTimeout]; at most BatchTimeout.
	PushTimeout time.Duration
	// BatchTimeout bounds one batch's pushes. Default [DefaultBatchTimeout].
	BatchTimeout time.Duration
	// MarkTimeout bounds one mark statement. Default [DefaultMarkTimeout].
	MarkTimeout time.Duration
	// Lease is how long a claim holds a row. Default [DefaultLease]; above BatchTimeout +
	// MarkTimeout.
	Lease time.Duration
	// RunBudget bounds one run. Default [DefaultRunBudget]; above BatchTimeout + MarkTimeout.
	RunBudget time.Duration
	// MaxAttempts is the attempt limit per row. Default [DefaultMaxAttempts].
	MaxAttempts int
	// BreakerFailures is the streak of outage failures that ends a run early. Default
	// [DefaultBreakerFailures].
	BreakerFailures int
	// RetryBase and RetryCap bound the full-jitter backoff; 0 retries on the next run.
	// [Config.WithDefaults] leaves them as they are; [ConfigFromEnv] defaults them to
	// [DefaultRetryBase] and [DefaultRetryCap].
	RetryBase, RetryCap time.Duration
	// HTTPClient sends the pushes. Default: a client of its own (never http.DefaultClient),
	// whose connection pool keeps Parallelism idle connections to LINE.
	HTTPClient *http.Client
	// Logger receives one line per failed push or mark. Default: slog.Default() (JSON in Cloud
	// Logging's shape once shared/telemetry is set up).
	Logger *slog.Logger
}

// WithDefaults returns c with every zero field but RetryBase and RetryCap set to its default.
func (c Config) WithDefaults() Config {
	if c.BaseURL == "" {
		c.BaseURL = DefaultBaseURL
	}
	setDefault(&c.BatchSize, DefaultBatchSize)
	setDefault(&c.MaxRows, DefaultMaxRows)
	setDefault(&c.Parallelism, DefaultParallelism)
	setDefault(&c.RateLimit, DefaultRateLimit)
	setDefault(&c.PushTimeout, DefaultPushTimeout)
	setDefault(&c.BatchTimeout, DefaultBatchTimeout)
	setDefault(&c.MarkTimeout, DefaultMarkTimeout)
	setDefault(&c.Lease, DefaultLease)
	setDefault(&c.RunBudget, DefaultRunBudget)
	setDefault(&c.MaxAttempts, DefaultMaxAttempts)
	setDefault(&c.BreakerFailures, DefaultBreakerFailures)
	if c.HTTPClient == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = c.Parallelism
		c.HTTPClient = &http.Client{Transport: t}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func setDefault[T int | float64 | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// Validate refuses a configuration the relay cannot keep its promises with: no token, sizes
// outside their ranges (see [ConfigFromEnv]), a run budget beyond [MaxRunBudget], a rate above LINE's, a RetryCap that reaches [RetryKeyWindow], or
// timeouts out of the order PushTimeout <= BatchTimeout, BatchTimeout + MarkTimeout < Lease,
// BatchTimeout + 2*MarkTimeout < RunBudget.
func (c Config) Validate() error {
	var errs []error
	add := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	add(c.ChannelAccessToken == "", "channel access token: required (LINE_CHANNEL_ACCESS_TOKEN)")
	add(c.BatchSize <= 0 || c.BatchSize > MaxBatchSize, "batch size %d rows: must be in 1..%d", c.BatchSize, MaxBatchSize)
	add(c.MaxRows <= 0, "max rows %d: must be positive", c.MaxRows)
	add(c.Parallelism <= 0 || c.Parallelism > MaxParallelism, "parallelism %d: must be in 1..%d", c.Parallelism, MaxParallelism)
	add(c.RateLimit <= 0 || c.RateLimit > LINEPushRateLimit,
		"rate limit %g pushes/s: must be in (0, %d], LINE's push rate limit", c.RateLimit, LINEPushRateLimit)
	add(c.MaxAttempts <= 0 || c.MaxAttempts > MaxMaxAttempts, "max attempts %d: must be in 1..%d", c.MaxAttempts, MaxMaxAttempts)
	add(c.RetryBase < 0 || c.RetryCap < c.RetryBase,
		"retry base %s, cap %s: want 0 <= base <= cap", c.RetryBase, c.RetryCap)
	add(c.RetryCap >= RetryKeyWindow,
		"retry cap %s: must be below %s, the part of LINE's 24-hour retry-key window the relay uses", c.RetryCap, RetryKeyWindow)
	add(c.BreakerFailures <= 0 || c.BreakerFailures > MaxBreakerFailures,
		"breaker failures %d: must be in 1..%d", c.BreakerFailures, MaxBreakerFailures)
	add(c.RunBudget > MaxRunBudget, "run budget %s: must be at most %s, Cloud Run's longest request timeout", c.RunBudget, MaxRunBudget)
	add(c.PushTimeout <= 0 || c.PushTimeout > c.BatchTimeout,
		"push timeout %s: must be positive and at most the batch timeout %s", c.PushTimeout, c.BatchTimeout)
	add(c.MarkTimeout <= 0, "mark timeout %s: must be positive", c.MarkTimeout)
	add(c.Lease <= c.BatchTimeout+c.MarkTimeout,
		"lease %s: must exceed batch timeout + mark timeout (%s), or a live run could lose its rows",
		c.Lease, c.BatchTimeout+c.MarkTimeout)
	add(c.RunBudget <= c.BatchTimeout+2*c.MarkTimeout,
		"run budget %s: must exceed batch timeout + 2 x mark timeout (%s: a claim and a batch), or no batch fits",
		c.RunBudget, c.BatchTimeout+2*c.MarkTimeout)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("outbox: invalid config: %w", err)
	}
	return nil
}

// ConfigFromEnv reads LINE_CHANNEL_ACCESS_TOKEN, LINE_API_BASE_URL, RELAY_RETRY_BASE and
// RELAY_RETRY_CAP (docs/api.md, "Configuration") and the tuning variables named on the
// Default constants, defaults the unset ones, refuses a value outside its range, naming it, and
// refuses what [Config.Validate] refuses. The ranges: RELAY_BATCH_SIZE 1..[MaxBatchSize],
// RELAY_PARALLELISM 1..[MaxParallelism], RELAY_RATE_LIMIT 1..[LINEPushRateLimit],
// RELAY_MAX_ATTEMPTS 1..[MaxMaxAttempts], RELAY_BREAKER_FAILURES 1..[MaxBreakerFailures];
// RELAY_PUSH_TIMEOUT, RELAY_BATCH_TIMEOUT, RELAY_MARK_TIMEOUT and RELAY_RUN_BUDGET 1ms..
// [MaxRunBudget], RELAY_LEASE 1ms..[RetryKeyWindow], RELAY_RETRY_BASE and RELAY_RETRY_CAP
// 0s..[RetryKeyWindow].
func ConfigFromEnv() (Config, error) {
	c := Config{
		ChannelAccessToken: os.Getenv("LINE_CHANNEL_ACCESS_TOKEN"),
		BaseURL:            os.Getenv("LINE_API_BASE_URL"),
	}
	var errs []error
	// An explicit 0 is judged as given, never taken for "unset": it is refused, except for
	// RELAY_RETRY_BASE and RELAY_RETRY_CAP, where 0s means "retry on the next run" (docs/api.md).
	intVar := func(p *int, name string, def, hi int) {
		var err error
		*p, err = envconf.IntIn(name, def, 1, hi)
		errs = append(errs, err)
	}
	durationVar := func(p *time.Duration, name string, def, lo, hi time.Duration) {
		var err error
		*p, err = envconf.DurationIn(name, def, lo, hi)
		errs = append(errs, err)
	}
	var rate int
	intVar(&c.BatchSize, "RELAY_BATCH_SIZE", DefaultBatchSize, MaxBatchSize)
	intVar(&c.Parallelism, "RELAY_PARALLELISM", DefaultParallelism, MaxParallelism)
	intVar(&rate, "RELAY_RATE_LIMIT", DefaultRateLimit, LINEPushRateLimit)
	c.RateLimit = float64(rate)
	intVar(&c.MaxAttempts, "RELAY_MAX_ATTEMPTS", DefaultMaxAttempts, MaxMaxAttempts)
	intVar(&c.BreakerFailures, "RELAY_BREAKER_FAILURES", DefaultBreakerFailures, MaxBreakerFailures)
	durationVar(&c.PushTimeout, "RELAY_PUSH_TIMEOUT", DefaultPushTimeout, minTimeout, MaxRunBudget)
	durationVar(&c.BatchTimeout, "RELAY_BATCH_TIMEOUT", DefaultBatchTimeout, minTimeout, MaxRunBudget)
	durationVar(&c.MarkTimeout, "RELAY_MARK_TIMEOUT", DefaultMarkTimeout, minTimeout, MaxRunBudget)
	durationVar(&c.Lease, "RELAY_LEASE", DefaultLease, minTimeout, RetryKeyWindow)
	durationVar(&c.RunBudget, "RELAY_RUN_BUDGET", DefaultRunBudget, minTimeout, MaxRunBudget)
	durationVar(&c.RetryBase, "RELAY_RETRY_BASE", DefaultRetryBase, 0, RetryKeyWindow)
	durationVar(&c.RetryCap, "RELAY_RETRY_CAP", DefaultRetryCap, 0, RetryKeyWindow)
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("outbox: %w", err)
	}
	c = c.WithDefaults()
	return c, c.Validate()
}

// String lists the effective settings, for the start-up log line: the LINE endpoint (never the
// token) and every tuning value.
func (c Config) String() string {
	return fmt.Sprintf("base_url=%s batch_size=%d max_rows=%d parallelism=%d rate_limit=%g push_timeout=%s "+
		"batch_timeout=%s mark_timeout=%s lease=%s run_budget=%s max_attempts=%d breaker_failures=%d "+
		"retry_base=%s retry_cap=%s",
		c.BaseURL, c.BatchSize, c.MaxRows, c.Parallelism, c.RateLimit, c.PushTimeout, c.BatchTimeout, c.MarkTimeout,
		c.Lease, c.RunBudget, c.MaxAttempts, c.BreakerFailures, c.RetryBase, c.RetryCap)
}
