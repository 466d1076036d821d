// Package drill is `couponctl drill`: IssueCoupon and RelayOutbox, served by a child process as
// Cloud Run serves them, under Silver Week-style double-tapped load while faults are injected on
// a schedule (a database crash, a killed and a terminated serving process, a stalled database, a
// LINE outage), then the outbox drained and everything the service answered audited against
// what it wrote (internal/lab/audit), and every coupon's LINE push checked.
//
// The drill owns what it breaks: with no database URL it starts a throwaway PostgreSQL
// (internal/testkit/localpg) that it crashes and stalls; with one, those two faults are skipped. It always
// owns the serving process (it starts it from [Options.Serve]) and the LINE stand-in
// (internal/testkit/linestub, in this process).
package drill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/lab/answerlog"
	"github.com/mops/coupon-api/internal/lab/audit"
	"github.com/mops/coupon-api/internal/lab/silverweek"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/localpg"
	"github.com/mops/coupon-api/schema"
	"github.com/mops/coupon-api/shared/issuance"
)

// BreakSyncCommitOff is the deliberate break [Options.Break] knows: the drill's own server
// acknowledges commits before their WAL is flushed, so that the database crash loses coupons
// that were answered ISSUED, and the drill must fail naming them.
const BreakSyncCommitOff = "synchronous-commit-off"

// breakSettings are the server settings of [BreakSyncCommitOff]: commits are answered before
// their WAL is flushed (PostgreSQL 15 docs, 30.4 "Asynchronous Commit"), and neither the
// background writer nor autovacuum writes a data page, which would flush the WAL before it.
var breakSettings = map[string]string{
	"synchronous_commit":    "off",
	"bgwriter_lru_maxpages": "0",
	"autovacuum":            "off",
}

// breakHold is how long, under [BreakSyncCommitOff], the crash holds the WAL writer stopped
// before it at least, then on until a coupon was answered ISSUED meanwhile
// ([injector.awaitIssuedAfter]): synchronous_commit=off alone loses only the commits of the
// last, partly filled WAL page (the WAL writer writes every full page to the operating system
// as soon as it fills, and an immediate stop keeps what the operating system has), which is
// sometimes none. Held, it writes nothing, and every coupon answered meanwhile (dozens in
// 200 ms under the drill's load) is lost; with synchronous_commit on, holding it loses nothing
// (internal/testkit/localpg's TestHeldWALWriterLosesOnlyAsyncCommits).
const breakHold = 200 * time.Millisecond

// servePoolMax caps the serving process's pool, in connections: as couponctl demo does, sized
// for the database rather than the clients (docs/performance.md).
const servePoolMax = 16

// progressEvery is how often a progress line is printed while the load runs.
const progressEvery = 2 * time.Second

// Options configure [Run].
type Options struct {
	// Duration is how long the load and the fault schedule run. The schedule cuts it into
	// 2 x faults + 1 equal slots: calm, fault, calm, fault, ..., calm; each fault is held for its
	// slot ([Stall] at most 3 s).
	Duration time.Duration
	// Clients is how many clients send requests, each one at a time.
	Clients int
	// Faults are the faults to inject, in order.
	Faults []Fault
	// Record is the answer log's path; "" makes a temporary file. It is created before anything
	// else is done (a path that cannot be written stops the drill before it touches a database);
	// an interrupted drill removes its temporary files and keeps Record.
	Record string
	// DatabaseURL is an empty database to use instead of a throwaway server: the faults that
	// need the server's processes are skipped.
	DatabaseURL string
	// Break is "" or [BreakSyncCommitOff] (own server and a db-crash only).
	Break string
	// Serve is the command that serves both functions as `couponctl serve` does, such as
	// [os.Executable(), "serve"].
	Serve []string
	// Seed makes the traffic's shuffle and tap delays.
	Seed uint64
	// Out gets the closing report; Progress the progress lines.
	Out, Progress io.Writer
}

// Validate refuses options [Run] cannot run with, every problem at once, naming the flag of
// couponctl drill that sets each.
func (o Options) Validate() error {
	var errs []error
	if o.Duration <= 0 {
		errs = append(errs, fmt.Errorf("--duration %s: must be positive", o.Duration))
	}
	if o.Clients < 1 {
		errs = append(errs, fmt.Errorf("--clients %d: must be at least 1", o.Clients))
	}
	if len(o.Serve) == 0 {
		errs = append(errs, errors.New("drill: no command to serve the functions"))
	}
	switch {
	case o.Break == "":
	case o.Break != BreakSyncCommitOff:
		errs = append(errs, fmt.Errorf("--break %q: the only break is %s", o.Break, BreakSyncCommitOff))
	case o.DatabaseURL != "":
		errs = append(errs, errors.New("--break changes the server's settings: only on the drill's own throwaway server, without DATABASE_URL"))
	case !slices.Contains(o.Faults, DBCrash):
		errs = append(errs, fmt.Errorf("--break %s loses coupons only in a crash: add %s to --faults", o.Break, DBCrash))
	}
	return errors.Join(errs...)
}

// Outcome is what the drill found.
type Outcome struct {
	// Violations lists every broken promise; empty means the drill passed.
	Violations []string
	// Record is the answer log's path, ServeLog the serving processes' output. After an
	// interruption (ctx ended) the temporary ones are removed: Record is then [Options.Record]
	// ("" when none was given) and ServeLog "".
	Record, ServeLog string
}

// drill is one run's state.
type drill struct {
	o        Options
	db       *localpg.Server // nil with DatabaseURL
	dbURL    string
	pool     *pgxpool.Pool
	stub     *linestub.Stub
	stubSrv  *http.Server // serves stub on loopback
	svc      *service
	log      *answerlog.Writer
	tempLog  bool     // log is a temporary file, removed if the drill is interrupted
	serveLog *os.File // the serving processes' output, a temporary file
	members  int      // linked to LINE
	began    time.Time
	fault    atomic.Value // the fault being injected, for the progress lines
	progress sync.Mutex   // one progress line at a time
}

// Run runs the drill: it sets up the database, the LINE stand-in and the serving process, runs
// the load and the fault schedule, drains the outbox, audits, and writes the report to o.Out.
// Its error means the drill could not run (a process that did not start or come back, a
// database error); what it found wrong is in the [Outcome].
func Run(ctx context.Context, o Options) (Outcome, error) {
	if err := o.Validate(); err != nil {
		return Outcome{}, err
	}
	d := &drill{o: o, stub: linestub.New()}
	defer d.close()
	// The files first: a drill that cannot record its answers must not set anything up.
	if err := d.openLogs(); err != nil {
		return d.outcome(nil), err
	}
	outcome, err := d.run(ctx)
	if ctx.Err() != nil {
		// Interrupted: nobody audits a cut drill. Its temporary files go, as the demo's log
		// does (the serving process may still write to its log until close stops it: it
		// writes to the unlinked file); an answer log the caller named is kept.
		d.removeTemporary()
		return d.outcome(outcome.Violations), err
	}
	return outcome, err
}

// run sets up, runs the load and the faults, and finishes.
func (d *drill) run(ctx context.Context) (Outcome, error) {
	if err := d.setUp(ctx); err != nil {
		return d.outcome(nil), err
	}
	events, skipped, err := d.runLoad(ctx)
	if err != nil {
		return d.outcome(nil), err
	}
	return d.finish(ctx, events, skipped)
}

// openLogs creates the answer log (Options.Record, or a temporary file) and the serving
// processes' log.
func (d *drill) openLogs() error {
	record := d.o.Record
	if record == "" {
		f, err := os.CreateTemp("", "couponctl-drill-*.jsonl")
		if err != nil {
			return fmt.Errorf("drill: the answer log: %w", err)
		}
		record, d.tempLog = f.Name(), true
		f.Close()
	}
	var err error
	if d.log, err = answerlog.Create(record); err != nil {
		if d.tempLog {
			_ = os.Remove(record)
		}
		return fmt.Errorf("drill: --record: %w", err)
	}
	if d.serveLog, err = os.CreateTemp("", "couponctl-drill-serve-*.log"); err != nil {
		return fmt.Errorf("drill: the serving process's log: %w", err)
	}
	return nil
}

// removeTemporary removes the temporary answer log and the serving log, and forgets them.
func (d *drill) removeTemporary() {
	if d.log != nil && d.tempLog {
		_ = d.log.Close()
		_ = os.Remove(d.log.Name())
		d.log = nil
	}
	if d.serveLog != nil {
		_ = os.Remove(d.serveLog.Name())
		d.serveLog.Close()
		d.serveLog = nil
	}
}

// setUp starts or opens the database, migrates it, creates the campaigns, links the members to
// LINE, and starts the stand-in, the answer log and the serving process.
func (d *drill) setUp(ctx context.Context) error {
	d.dbURL = d.o.DatabaseURL
	if d.dbURL == "" {
		settings := map[string]string{}
		if d.o.Break != "" {
			settings = breakSettings
		}
		d.say("starting a throwaway PostgreSQL (initdb, then the server)...")
		srv, err := localpg.Start(ctx, localpg.Options{Durable: true, Settings: settings})
		if err != nil {
			return err
		}
		d.db, d.dbURL = srv, srv.URL()
		d.say("throwaway PostgreSQL on 127.0.0.1:%d (%s), durable settings%s", srv.Port(), srv.Version(), breakNote(d.o.Break))
	}
	if _, err := schema.MigrateURL(ctx, d.dbURL); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, d.dbURL)
	if err != nil {
		return err
	}
	d.pool = pool
	if err := silverweek.CreateCampaigns(ctx, pool, append(campaigns, hotCampaign)); err != nil {
		return fmt.Errorf("%w (the drill needs a database without its campaigns)", err)
	}
	d.members = max(1000, int(d.o.Duration.Seconds()*membersPerSecond))
	if err := linkMembers(ctx, pool, d.members); err != nil {
		return err
	}
	d.say("migrated; campaigns DR-A (100,000 yen: sells out), DR-B, DR-C, and DR-H for the hot-campaign step (1,000 yen coupons); %d members linked to LINE", d.members)
	return d.startProcesses(ctx)
}

func breakNote(b string) string {
	if b == "" {
		return ""
	}
	return " BROKEN ON PURPOSE (--break " + b + ")"
}

// sqlLinkMembers links members to a LINE user id made from the member id ("U" + md5 in hex: the
// format LINE uses, unique per member), as couponctl demo does.
const sqlLinkMembers = `
INSERT INTO member_line_accounts (member_id, line_user_id)
SELECT m, 'U' || md5(m) FROM unnest($1::text[]) AS m
ON CONFLICT (member_id) DO NOTHING`

// linkMembers links the drill's first n members to LINE, so that each of their coupons is pushed.
func linkMembers(ctx context.Context, pool *pgxpool.Pool, n int) error {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = memberID(i + 1)
	}
	if _, err := pool.Exec(ctx, sqlLinkMembers, ids); err != nil {
		return fmt.Errorf("drill: linking members to LINE: %w", err)
	}
	return nil
}

// startProcesses starts the LINE stand-in and the serving process.
func (d *drill) startProcesses(ctx context.Context) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	d.stubSrv = &http.Server{Handler: d.stub, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.stubSrv.Serve(l) }() // ends with close
	env := append([]string{
		"DATABASE_URL=" + d.dbURL,
		"DB_POOL_MAX_CONNS=" + strconv.Itoa(min(d.o.Clients, servePoolMax)),
		"LINE_API_BASE_URL=http://" + l.Addr().String(),
		"LINE_CHANNEL_ACCESS_TOKEN=drill",
	}, relayEnv...)
	if d.svc, err = newService(d.o.Serve, env, d.serveLog); err != nil {
		return err
	}
	if err := d.svc.start(ctx); err != nil {
		return err
	}
	d.say("serving IssueCoupon and RelayOutbox from a child process (%s serve) on %s; LINE stand-in on %s",
		d.o.Serve[0], d.svc.addr, l.Addr())
	return nil
}

// runLoad runs the clients, the scheduled RelayOutbox calls, the progress lines and the fault
// schedule for the drill's duration, then stops the clients (each finishing its request) and the
// calls. It returns the faults as they happened and those skipped.
func (d *drill) runLoad(ctx context.Context) ([]event, []Fault, error) {
	var faults, skipped []Fault
	for _, f := range d.o.Faults {
		if f.needsServer() && d.db == nil {
			skipped = append(skipped, f)
			continue
		}
		faults = append(faults, f)
	}
	t := newTraffic(d.svc.url()+"/IssueCoupon", d.o.Clients, d.members, d.log, d.o.Seed)
	r := newRelayer(d.svc.url() + "/RelayOutbox")
	stop, done := make(chan struct{}), make(chan struct{})
	d.began = time.Now()
	d.say("load: %d clients for %s, faults %s%s", d.o.Clients, d.o.Duration, joinFaults(faults), skippedNote(skipped))
	go func() { t.run(d.o.Clients, stop); close(done) }()
	go r.every(stop)
	d.fault.Store("none")
	go d.progressLines(t, r, done)

	events, err := d.schedule(ctx, faults, t)
	close(stop)
	<-done
	if t.wrapped {
		d.say("note: the load used all %d linked members and started over with the first (their requests are re-sends)", d.members)
	}
	if werr := errors.Join(err, t.err, d.log.Close()); werr != nil {
		return events, skipped, werr
	}
	_, total := t.snapshot()
	d.say("load done: %d answers in %.1f s", total, time.Since(d.began).Seconds())
	return events, skipped, nil
}

func skippedNote(skipped []Fault) string {
	if len(skipped) == 0 {
		return ""
	}
	return " (skipped, the drill does not own DATABASE_URL's server: " + joinFaults(skipped) + ")"
}

// schedule injects faults in their slots of the drill's duration and returns when it is over.
func (d *drill) schedule(ctx context.Context, faults []Fault, t *traffic) ([]event, error) {
	slot := d.o.Duration / time.Duration(2*len(faults)+1)
	in := &injector{db: d.db, pool: d.pool, traffic: t, svc: d.svc, stub: d.stub}
	if d.o.Break != "" {
		in.holdWALWriter = breakHold
	}
	var events []event
	for i, f := range faults {
		if err := sleep(ctx, time.Until(d.began.Add(time.Duration(2*i+1)*slot))); err != nil {
			return events, err
		}
		hold := slot
		if f == Stall {
			hold = min(slot, stallHold)
		}
		d.fault.Store(string(f))
		d.say("fault %s: injected, held %.1f s", f, hold.Seconds())
		ev, err := in.inject(ctx, f, hold)
		d.fault.Store("none")
		if err != nil {
			return events, fmt.Errorf("fault %s: %w", f, err)
		}
		d.say("fault %s: recovered after %.1f s (%s)", f, ev.end.Sub(ev.start).Seconds(), ev.note)
		events = append(events, ev)
	}
	return events, sleep(ctx, time.Until(d.began.Add(d.o.Duration)))
}

// progressLines prints a line every progressEvery until done is closed: the time, the answers so
// far by class, the RelayOutbox calls, and the fault being injected.
func (d *drill) progressLines(t *traffic, r *relayer, done <-chan struct{}) {
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		c, total := t.snapshot()
		runs, failed, sent := r.counts()
		d.say("answers %d: ISSUED %d, ALREADY_ISSUED %d, refused %d, RETRY_EXHAUSTED %d, indeterminate %d; relay runs %d (%d failed, %d pushes sent); fault: %s",
			total, c["ISSUED"], c["ALREADY_ISSUED"], c["MONTHLY_CAP"]+c["BUDGET_EXCEEDED"]+c["CAMPAIGN_NOT_ACTIVE"]+c["UNKNOWN_CAMPAIGN"],
			c["RETRY_EXHAUSTED"], c["indeterminate"], runs, failed, sent, d.fault.Load())
	}
}

// say prints a progress line, stamped with the seconds since the load began.
func (d *drill) say(format string, args ...any) {
	d.progress.Lock()
	defer d.progress.Unlock()
	stamp := "setup"
	if !d.began.IsZero() {
		stamp = fmt.Sprintf("%5.1fs", time.Since(d.began).Seconds())
	}
	fmt.Fprintf(d.o.Progress, "drill %s  %s\n", stamp, fmt.Sprintf(format, args...))
}

// finish drains the outbox, audits the answers, checks the pushes and writes the report.
func (d *drill) finish(ctx context.Context, events []event, skipped []Fault) (Outcome, error) {
	r := newRelayer(d.svc.url() + "/RelayOutbox")
	dr, err := drain(ctx, r, d.pool)
	if err != nil {
		return d.outcome(nil), err
	}
	d.say("outbox drained in %d RelayOutbox runs, %.1f s", dr.runs, dr.took.Seconds())
	answers, err := answerlog.ReadFile(d.log.Name())
	if err != nil {
		return d.outcome(nil), err
	}
	rep, err := audit.Run(ctx, d.pool, answers, audit.Config{})
	if err != nil {
		return d.outcome(nil), err
	}
	p, err := checkPushes(ctx, d.pool, d.stub)
	if err != nil {
		return d.outcome(nil), err
	}
	violations := d.violations(events, rep, dr, p)
	d.writeReport(answers, events, skipped, rep, dr, p, violations)
	return d.outcome(violations), nil
}

// violations lists everything the drill found wrong.
func (d *drill) violations(events []event, rep audit.Report, dr drained, p pushed) []string {
	v := rep.Violations()
	for _, ev := range events {
		if ev.violation != "" {
			v = append(v, fmt.Sprintf("fault %s: %s", ev.fault, ev.violation))
		}
	}
	if dr.unsent > 0 {
		v = append(v, fmt.Sprintf("outbox: %d rows still unsent after %s of draining", dr.unsent, drainTimeout))
	}
	if dr.parked > 0 {
		v = append(v, fmt.Sprintf("outbox: %d rows parked (couponctl outbox status lists why)", dr.parked))
	}
	if p.notLinked > 0 {
		v = append(v, fmt.Sprintf("LINE: %d coupons of members the drill did not link", p.notLinked))
	}
	v = append(v, capped("LINE: coupons never pushed", p.neverSent)...)
	return append(v, capped("LINE: pushes that are not their retry key's coupon", p.wrongPush)...)
}

// capped is a heading with the count and at most 100 of lines, as the audit lists its failures.
func capped(heading string, lines []string) []string {
	if len(lines) == 0 {
		return nil
	}
	slices.Sort(lines)
	out := []string{fmt.Sprintf("%s: %d", heading, len(lines))}
	for i, l := range lines {
		if i == 100 {
			return append(out, fmt.Sprintf("  ... and %d more", len(lines)-i))
		}
		out = append(out, "  "+l)
	}
	return out
}

// outcome is the run's outcome with violations, naming its files.
func (d *drill) outcome(violations []string) Outcome {
	o := Outcome{Violations: violations}
	if d.log != nil {
		o.Record = d.log.Name()
	}
	if d.serveLog != nil {
		o.ServeLog = d.serveLog.Name()
	}
	return o
}

// close stops the serving process (SIGTERM, as at the end of a deploy), the LINE stand-in and
// the throwaway server.
func (d *drill) close() {
	if d.svc != nil && d.svc.running() {
		if _, err := d.svc.terminate(); err != nil {
			d.say("stopping: %v", err)
		}
	}
	if d.stubSrv != nil {
		_ = d.stubSrv.Close()
	}
	if d.log != nil {
		_ = d.log.Close() // already closed when the load ran to its end
	}
	if d.serveLog != nil {
		d.serveLog.Close()
	}
	if d.pool != nil {
		d.pool.Close()
	}
	if d.db != nil {
		_ = d.db.Stop()
	}
}

// writeReport prints the closing tables: the faults, the audit, the relay and the pushes, the
// files, and the verdict.
func (d *drill) writeReport(answers []answerlog.Answer, events []event, skipped []Fault, rep audit.Report, dr drained, p pushed, violations []string) {
	w := d.o.Out
	fmt.Fprintf(w, "\nDrill: %s of load from %d clients; faults in 2 x %d + 1 slots of %.1f s\n",
		d.o.Duration, d.o.Clients, len(events), (d.o.Duration / time.Duration(2*len(events)+1)).Seconds())
	writeFaults(w, answers, events, d.began)
	if len(skipped) > 0 {
		fmt.Fprintf(w, "  skipped: %s (they act on the database server's processes; DATABASE_URL's server is not the drill's)\n", joinFaults(skipped))
	}
	rep.Write(w)
	fmt.Fprintf(w, "Relay and LINE:\n")
	fmt.Fprintf(w, "  drain after the load: %d RelayOutbox runs in %.1f s; rows unsent %d, parked %d, skipped %d\n",
		dr.runs, dr.took.Seconds(), dr.unsent, dr.parked, dr.skipped)
	fmt.Fprintf(w, "  LINE stand-in: %d push requests, %d accepted, %d answered 409 (a re-send under its accepted retry key), %d failed (the outage)\n",
		p.stats.Requests, p.stats.Accepted, p.stats.Conflicts, p.stats.Failed)
	fmt.Fprintf(w, "  coupons pushed: %d of %d accepted by LINE exactly once; never pushed %d; pushes under a wrong key %d\n",
		p.acceptedOK, p.coupons, len(p.neverSent), len(p.wrongPush))
	fmt.Fprintf(w, "Answer log: %s (%d answers; `couponctl audit` reads it)\nServing process log: %s\n", d.log.Name(), len(answers), d.serveLog.Name())
	if len(violations) > 0 {
		fmt.Fprintln(w, "\nFAILED:")
		for _, v := range violations {
			fmt.Fprintln(w, "  "+v)
		}
		return
	}
	fmt.Fprintln(w, "\nOK: every answer agrees with the tables, every rule held, every coupon was pushed to LINE under its own retry key.")
}

// writeFaults prints a row per fault: when it was injected and for how long, and what the answers
// sent meanwhile were.
func writeFaults(w io.Writer, answers []answerlog.Answer, events []event, began time.Time) {
	fmt.Fprintf(w, "  %-15s %7s %7s %8s %10s %14s %6s  %s\n", "fault", "at s", "held s", "answers", "RETRY_EXH.", "indeterminate", "late", "what happened")
	for _, ev := range events {
		var n, retry, unclear, late int
		for _, a := range answers {
			if a.T.Before(ev.start) || a.T.After(ev.end) {
				continue
			}
			n++
			if a.Result == string(issuance.ResultRetryExhausted) {
				retry++
			}
			if audit.Classify(a.Status, a.Result) == audit.Indeterminate {
				unclear++
			}
			if a.Latency() > issuance.AppTimeout {
				late++
			}
		}
		fmt.Fprintf(w, "  %-15s %7.1f %7.1f %8d %10d %14d %6d  %s\n", ev.fault, ev.start.Sub(began).Seconds(),
			ev.end.Sub(ev.start).Seconds(), n, retry, unclear, late, ev.note)
	}
}
