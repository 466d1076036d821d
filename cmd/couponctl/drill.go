package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/lab/drill"
)

type drillOptions struct {
	duration time.Duration
	clients  int
	faults   string
	record   string
	yes      bool // use the database DATABASE_URL names
	brk      string
	seed     uint64
}

func drillCmd() *cobra.Command {
	var o drillOptions
	c := &cobra.Command{
		Use:   "drill [--duration D] [--clients N] [--faults LIST] [--record FILE] [--yes]",
		Short: "Inject faults under Silver Week load (database crash, killed and terminated service, stalled database, LINE outage, a campaign paused and raised), then audit every answer against the tables",
		Long: `A fault drill, end to end on this machine, before each release:

  1. with no DATABASE_URL, start a throwaway PostgreSQL (durable settings; removed at the end);
     migrate; create DR-A (100,000 yen: sells out in the first seconds), DR-B and DR-C, 1,000 yen
     coupons; link the drill's members to LINE user ids;
  2. serve IssueCoupon and RelayOutbox from a child process ("couponctl serve", this binary) with
     LINE_API_BASE_URL pointing at a LINE stand-in in the drill, RELAY_RETRY_BASE=0s and a 5 s
     RELAY_LEASE so that retries and a killed run's rows come back within the drill;
  3. for --duration, send Silver Week-style traffic from --clients clients over HTTP: member
     after member asks for each campaign twice (a double tap within 50 ms), shuffled; every
     answer is recorded (--record); RelayOutbox is called every 2 s, as Cloud Scheduler would;
  4. meanwhile inject the --faults, one after the other: --duration is cut into 2 x faults + 1
     equal slots (calm, fault, calm, ..., calm) and each fault is held for its slot:
       db-crash     the database stopped as pg_ctl stop -m immediate does, then started again
                    (crash recovery); IssueCoupon answers 503 RETRY_EXHAUSTED meanwhile
       kill         the serving process killed with SIGKILL, then a new one started
       sigterm      SIGTERM to the serving process, as Cloud Run sends it: it must drain its
                    requests and exit 0; then a new one is started
       stall        every database process stopped with SIGSTOP for at most 3 s, then SIGCONT
       line-outage  the LINE stand-in answers 503 to every push
       campaign-change
                    an operator's work, not a fault: DR-B paused for the slot, DR-A (sold out)
                    raised by 20 coupons halfway, DR-B resumed; DR-B's coupons must not change
                    from the pause's return to the resume
       voids        an operator's work too: 20 coupons of DR-B and DR-C voided through the
                    slot, every other one with reissue allowed; their yen must come back
                    (reconcile) and their earlier ISSUED answers stay right
       hot-campaign a first-come rush: every client on DR-H (one budget stripe, 500 coupons),
                    new members each, double taps included; IssueCoupon coalesces them into
                    batches (ISSUE_BATCH_MAX) and DR-H sells out to the coupon
       release      a release under its herd: DR-R made at the slot's start with 50 coupons
                    released halfway through it (the database's clock), every client on DR-R,
                    new members each: NOT_STARTED before the instant, BUDGET_EXCEEDED once taken;
                    no coupon of DR-R may be issued before the instant, and exactly 50 after
  5. drain the outbox (RelayOutbox until no row is left to send), then audit, as "couponctl
     audit" does: every ISSUED and ALREADY_ISSUED coupon exists, is live and is its pair's; no
     refusal contradicted by the final tables and the campaigns' history; no ISSUED while the
     campaign was paused; R1-R3 and one outbox row per coupon by SQL; every
     answer within 3 s; and every coupon pushed to LINE under its own X-Line-Retry-Key (a
     re-send of a coupon only ever under that key).

Progress lines go to stderr: the answers so far by code, the relay runs, the fault being
injected. At the end: a row per fault (when, how long, the answers sent meanwhile: RETRY_EXH.,
indeterminate, late), the answers by code with latency, the indeterminate answers (a transport
error, a 500: the caller cannot know whether a coupon was written) by whether their pair holds
a coupon now, each check, the invariant report, the relay and LINE figures, the answer log's
and the serving process's log's paths, and the verdict. Exits 1 on any violation, listing each
(every coupon answered ISSUED but missing, by id).

With DATABASE_URL (an empty staging database, for example) the drill asks for --yes, refuses a
database that holds coupons or outbox rows, and skips db-crash and stall: it does not own that
server's processes (the report names them). Against a deployed service use "couponctl load
--record FILE" then "couponctl audit FILE" instead.

--record is created before anything else: a path that cannot be written stops the drill before
it starts a server or writes into DATABASE_URL. Interrupted (Ctrl-C, SIGTERM: exit 130 or 143,
"couponctl: interrupted"), the drill stops its processes, removes its temporary files (the
answer log when --record was not given, and the serving process's log), and names the --record
file it keeps, unaudited.

With the defaults the drill takes about 45 s on a 2-core machine: 40 s of load and faults, plus
the setup, the drain and the audit.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDrill(cmd, o) },
	}
	f := c.Flags()
	f.DurationVar(&o.duration, "duration", 40*time.Second, "how long the load and the fault schedule run (2 x faults + 1 slots)")
	f.IntVar(&o.clients, "clients", 32, "concurrent HTTP clients, each sending one request at a time")
	f.StringVar(&o.faults, "faults", "db-crash,kill,sigterm,stall,line-outage,campaign-change,voids,hot-campaign,release", "the faults to inject, in order (comma list)")
	f.StringVar(&o.record, "record", "", "write the answer log here, created before anything is set up (default: a temporary file, named at the end, removed if the drill is interrupted)")
	f.BoolVar(&o.yes, "yes", false, "with DATABASE_URL set: migrate that database and write the drill's campaigns, coupons and outbox rows into it")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the traffic's shuffle and tap delays")
	f.StringVar(&o.brk, "break", "", "break durability on purpose, to see the drill fail: "+drill.BreakSyncCommitOff+" (own server, with db-crash)")
	_ = f.MarkHidden("break") // for the drill's own test and for showing it red; not an operator setting
	return c
}

func runDrill(cmd *cobra.Command, o drillOptions) error {
	faults, err := drill.ParseFaults(o.faults)
	if err != nil {
		return flagError("--faults: %w", err)
	}
	ctx := cmd.Context()
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL != "" {
		if !o.yes {
			return flagError("DATABASE_URL is set (%s): the drill would migrate that database, write its campaigns, coupons "+
				"and outbox rows into it and link its members to LINE. Run again with --yes to allow it, or unset DATABASE_URL "+
				"to use a throwaway server", redactURL(dbURL))
		}
		if err := refuseDataInUse(ctx, dbURL, "the drill would drain that outbox into its LINE stand-in and audit those coupons as its own"); err != nil {
			return err
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("drill: this binary's path, to serve the functions from it: %w", err)
	}
	opts := drill.Options{
		Duration: o.duration, Clients: o.clients, Faults: faults, Record: o.record, DatabaseURL: dbURL,
		Break: o.brk, Serve: []string{exe, "serve"}, Seed: o.seed, Out: cmd.OutOrStdout(), Progress: cmd.ErrOrStderr(),
	}
	if err := opts.Validate(); err != nil {
		return usageError{err}
	}
	outcome, err := drill.Run(ctx, opts)
	if err != nil && ctx.Err() != nil {
		// Interrupted: main says so; the drill removed its temporary files, and kept the
		// answer log it was told to write, which is named here.
		if outcome.Record != "" {
			fmt.Fprintf(cmd.ErrOrStderr(), "drill: interrupted; the answers recorded so far are in %s (not audited)\n", outcome.Record)
		}
		return err
	}
	if err != nil {
		return fmt.Errorf("%w%s", err, files(outcome))
	}
	if len(outcome.Violations) > 0 {
		return errViolations
	}
	return nil
}

// files names the drill's answer log and serving log, when it got as far as making them.
func files(o drill.Outcome) string {
	var names []string
	if o.Record != "" {
		names = append(names, "answer log "+o.Record)
	}
	if o.ServeLog != "" {
		names = append(names, "serving process log "+o.ServeLog)
	}
	if len(names) == 0 {
		return ""
	}
	return " (" + strings.Join(names, ", ") + ")"
}
