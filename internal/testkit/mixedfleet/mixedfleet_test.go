package mixedfleet_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
	"github.com/mops/coupon-api/internal/ops/reconcile"
	"github.com/mops/coupon-api/internal/testkit/linestub"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/internal/testkit/syncbuf"
	"github.com/mops/coupon-api/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m, proctest.RemoveBuilds) }

// root is the repository's root, from this package's directory (go test's working directory).
const root = "../../.."

// The load: members m0000..m2999 (all but every tenth linked to a LINE account, so that the
// relay also skips), three campaigns of which FLEET-A sells out, 1,500 + 500 + 700 yen against
// the 2,000 yen monthly cap so that MONTHLY_CAP is answered too.
const (
	members        = 3000
	clients        = 8
	beforeMigrate  = 300  // IssueCoupon answers from the previous release alone before migrating
	besideRequests = 1500 // answers once both releases serve, while the operators act
	voids          = 24   // coupons the operators void, half with reissue allowed
	relayEvery     = 50   // IssueCoupon answers between two RelayOutbox runs
)

// loadSize is the load's two counts of answers: with -short a third of them, every check the same.
func loadSize() (before, beside int64) {
	if testing.Short() {
		return beforeMigrate / 3, besideRequests / 3
	}
	return beforeMigrate, besideRequests
}

var campaigns = []struct {
	id                     string
	discountYen, budgetYen int
}{{"FLEET-A", 500, 40_000}, {"FLEET-B", 1000, 1_000_000}, {"FLEET-C", 700, 1_000_000}}

// TestPreviousReleaseBesideThisOne is the deploy as it happens: the previous release serves
// under load, this tree's migrations run in the middle of it, then both releases serve the same
// load while operators act. See the package doc for what it checks.
func TestPreviousReleaseBesideThisOne(t *testing.T) {
	run := runFleet(t, schema.Migrations())
	for _, p := range run.problems() {
		t.Error(p)
	}
	t.Log(run.summary())
}

// TestMixedFleetCatchesARenamedIssuance is the check's negative control: a migration that gives
// the issuance functions new names without keeping the previous release's entry points as thin
// wrappers (docs/deploy.md, "Versioned names, thin wrappers"). Every call after it fails with
// 42883 (undefined_function), which both releases answer 500. The check must say so.
func TestMixedFleetCatchesARenamedIssuance(t *testing.T) {
	run := runFleet(t, withMigrationAfter(t, "rename_issuance", renameIssuance))
	problems := run.problems()
	t.Log(run.summary())
	for _, p := range problems {
		if strings.Contains(p, "answered 500") {
			t.Logf("caught, as it should be: %s", p)
			return
		}
	}
	t.Errorf("a migration renaming the issuance functions under load passed the check; problems: %q", problems)
}

// withMigrationAfter is this tree's migrations and, after the newest, migration up (its text),
// named name: a negative control's broken migration.
func withMigrationAfter(t *testing.T, name, up string) fs.FS {
	t.Helper()
	newest, err := schema.Newest()
	if err != nil {
		t.Fatal(err)
	}
	fsys := copyMigrations(t)
	fsys[fmt.Sprintf("%05d_%s.sql", newest+1, name)] = &fstest.MapFile{Data: []byte(up)}
	return fsys
}

// copyMigrations is this tree's migrations, in a file system a test may change.
func copyMigrations(t *testing.T) fstest.MapFS {
	t.Helper()
	fsys := fstest.MapFS{}
	names, err := fs.Glob(schema.Migrations(), "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		b, err := fs.ReadFile(schema.Migrations(), n)
		if err != nil {
			t.Fatal(err)
		}
		fsys[n] = &fstest.MapFile{Data: b}
	}
	return fsys
}

// renameIssuance is the broken migration of TestMixedFleetCatchesARenamedIssuance.
const renameIssuance = `-- +goose Up
SET LOCAL lock_timeout = '3s';
ALTER FUNCTION issue_coupons_batch(text, uuid[], text[], timestamptz[], integer, text[]) RENAME TO issue_coupons_batch_renamed;
ALTER FUNCTION issue_coupon(uuid, text, text, timestamptz, integer, text) RENAME TO issue_coupon_renamed;
`

// fleetRun is what one run saw: every answer, the migration's report, the operators' errors,
// and what the tables and the LINE stand-in say at the end.
type fleetRun struct {
	migrateReport string
	migrateErr    error
	answers       *answers
	operatorErrs  []string
	voided        map[string]string // coupon id -> what its void said of its push
	tables        []string          // problems found in the tables and at the LINE stand-in
	pushes        int
}

// answers counts HTTP answers by fleet, function and status, and keeps the first bodies of each
// 5xx.
type answers struct {
	mu     sync.Mutex
	counts map[string]int // "fleet function status"
	bodies map[string][]string
	total  atomic.Int64
}

// add counts one answer and returns the IssueCoupon answers counted so far.
func (a *answers) add(fleet, function string, status int, body string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := fmt.Sprintf("%s %s %d", fleet, function, status)
	a.counts[k]++
	if status >= 500 && len(a.bodies[k]) < 3 {
		a.bodies[k] = append(a.bodies[k], body)
	}
	if function == "IssueCoupon" {
		return a.total.Add(1)
	}
	return a.total.Load()
}

func (r *fleetRun) problems() []string {
	var ps []string
	if r.migrateErr != nil {
		ps = append(ps, fmt.Sprintf("this tree's migrate failed: %v", r.migrateErr))
	}
	if strings.Contains(r.migrateReport, "retrying") {
		ps = append(ps, "the migration did not apply on its first try:\n"+r.migrateReport)
	}
	r.answers.mu.Lock()
	for k, n := range r.answers.counts {
		if strings.HasSuffix(k, " 500") {
			ps = append(ps, fmt.Sprintf("%s answered 500 %d times, e.g. %q", strings.TrimSuffix(k, " 500"), n, r.answers.bodies[k]))
		}
	}
	r.answers.mu.Unlock()
	ps = append(ps, r.operatorErrs...)
	return append(ps, r.tables...)
}

func (r *fleetRun) summary() string {
	r.answers.mu.Lock()
	defer r.answers.mu.Unlock()
	keys := make([]string, 0, len(r.answers.counts))
	for k := range r.answers.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "answers (fleet, function, status: count):\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s: %d\n", k, r.answers.counts[k])
	}
	fmt.Fprintf(&b, "voided %d coupons; %d pushes at the LINE stand-in; migrate's report: %q", len(r.voided), r.pushes, r.migrateReport)
	return b.String()
}

// runFleet runs the deploy with migrations as this tree's schema (see the package doc).
func runFleet(t *testing.T, migrations fs.FS) *fleetRun {
	ctx := context.Background()
	prev := buildPrevious(t)
	t.Log("built the previous release")
	cur := proctest.Build(t, root+"/cmd/couponctl")
	t.Log("built this tree's couponctl")
	dbURL := pgtest.EmptyURL(t)

	stub := linestub.New()
	line := httptest.NewServer(stub)
	t.Cleanup(line.Close)

	// The previous release's schema, campaigns and LINE links, as production has them.
	runCLI(t, prev, dbURL, "migrate")
	for _, c := range campaigns {
		runCLI(t, prev, dbURL, "campaign", "create", "--id", c.id, "--discount-yen", fmt.Sprint(c.discountYen),
			"--budget-yen", fmt.Sprint(c.budgetYen))
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `INSERT INTO member_line_accounts (member_id, line_user_id)
		SELECT format('m%s', lpad(i::text, 4, '0')), 'U' || md5(i::text)
		  FROM generate_series(0, $1 - 1) i WHERE i % 10 <> 0`, members); err != nil {
		t.Fatal(err)
	}

	run := &fleetRun{answers: &answers{counts: map[string]int{}, bodies: map[string][]string{}}}
	var fleets atomic.Pointer[[]fleet]
	fleets.Store(&[]fleet{serve(t, "previous", prev, dbURL, line.URL)})

	loadCtx, stopLoad := context.WithCancel(ctx)
	var load sync.WaitGroup
	for i := range clients {
		load.Add(1)
		go func() {
			defer load.Done()
			issueLoop(loadCtx, i, &fleets, run.answers)
		}()
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			stopLoad()
			load.Wait()
		}
	}
	t.Cleanup(stop)

	before, beside := loadSize()
	waitAnswers(t, run.answers, before)
	t.Logf("%d answers from the previous release; migrating", run.answers.total.Load())
	var report syncbuf.Buffer
	run.migrateErr = migrate(ctx, dbURL, migrations, &report)
	run.migrateReport = report.String()

	// A new instance of the previous revision starts on the migrated schema (Cloud Run scales
	// it while traffic moves), and this tree's functions start beside both.
	both := []fleet{(*fleets.Load())[0], serve(t, "previous-restarted", prev, dbURL, line.URL), serve(t, "this", cur, dbURL, line.URL)}
	fleets.Store(&both)
	start := run.answers.total.Load()

	t.Log("both releases serve")
	run.operatorErrs, run.voided = operate(ctx, pool)
	t.Log("the operators are done")
	waitAnswers(t, run.answers, start+beside)
	stop()

	t.Logf("%d answers; draining the outbox", run.answers.total.Load())
	drainRelay(t, both[2], pool, run.answers)
	run.tables, run.pushes = checkTables(ctx, t, pool, stub, run.voided)
	return run
}

// buildPrevious builds the couponctl of the commit deploy/previous-release names, from the
// repository's own history, with this machine's module and build caches. Without .git (Cloud
// Build's uploaded source) or git, the test is skipped; a build that fails fails it under CI=true
// and skips it elsewhere (a shallow clone may lack the commit).
func buildPrevious(t *testing.T) string {
	t.Helper()
	commit := previousRelease(t)
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: the previous release cannot be built from the history")
	}
	if out, err := exec.Command("git", "-C", root, "rev-parse", "--git-dir").CombinedOutput(); err != nil {
		t.Skipf("no .git (as in Cloud Build's uploaded source): the previous release %s cannot be built from the history: %s", commit, out)
	}
	bin, err := buildCommit(commit)
	if err != nil {
		msg := fmt.Sprintf("build the previous release %s (deploy/previous-release) from the history: %v", commit, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return bin
}

// buildCommit extracts commit's tree (git archive) into a directory of the user's cache named
// after it, once, and builds its couponctl there. The directory stays the same from run to run,
// so go's build cache, which keys a package on its directory, compiles it again only when the
// commit changes.
func buildCommit(commit string) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(base, "coupon-api", "previous-release", commit)
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return "", err
		}
		tmp, err := os.MkdirTemp(filepath.Dir(dir), commit+".tmp-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(tmp)
		extract := fmt.Sprintf("git -C %q archive --format=tar %q | tar -x -C %q", root, commit, tmp)
		if out, err := exec.Command("bash", "-o", "pipefail", "-c", extract).CombinedOutput(); err != nil {
			return "", fmt.Errorf("%v\n%s", err, out)
		}
		// Another test run may have put it there first: then its copy is used.
		if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) {
			return "", err
		}
	}
	bin := filepath.Join(dir, "couponctl")
	build := exec.Command("go", "build", "-o", bin, "./cmd/couponctl")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
}

// previousRelease is the commit deploy/previous-release names: its one line that is not a comment.
func previousRelease(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(root + "/deploy/previous-release")
	if err != nil {
		t.Fatal(err)
	}
	var commits []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			commits = append(commits, l)
		}
	}
	if len(commits) != 1 {
		t.Fatalf("deploy/previous-release: %q, want one commit", commits)
	}
	return commits[0]
}

// runCLI runs couponctl bin with args on dbURL and fails the test if it fails.
func runCLI(t *testing.T, bin, dbURL string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = proctest.Env("DATABASE_URL=" + dbURL)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
}

// migrate is this tree's `couponctl migrate` (opsverbs.Migrate: the same Migrator, its retry
// report in report), with migrations as the schema.
func migrate(ctx context.Context, dbURL string, migrations fs.FS, report *syncbuf.Buffer) error {
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = schema.Migrator{FS: migrations, Report: report}.Up(ctx, db)
	return err
}

// fleet is one serving process: couponctl serve with FUNCTION_TARGET unset, both functions.
type fleet struct {
	name, url string
}

func serve(t *testing.T, name, bin, dbURL, lineURL string) fleet {
	t.Helper()
	port := proctest.FreePort(t)
	cmd := exec.Command(bin, "serve")
	cmd.Env = proctest.Env("DATABASE_URL="+dbURL, "PORT="+port, "FUNCTION_TARGET=",
		"LINE_CHANNEL_ACCESS_TOKEN=mixed-fleet", "LINE_API_BASE_URL="+lineURL, "RELAY_RETRY_BASE=0s")
	var out syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Pdeathsig kills it if this test binary dies first (go test's -timeout), where no Cleanup runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if o := out.String(); t.Failed() {
			t.Logf("%s fleet's output, its last 4 KB:\n%s", name, o[max(0, len(o)-4096):])
		}
	})
	proctest.WaitServing(t, port, &out)
	return fleet{name: name, url: "http://127.0.0.1:" + port}
}

var client = &http.Client{Timeout: 10 * time.Second}

func post(ctx context.Context, url, body string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String(), nil
}

// issueLoop sends IssueCoupon requests of random members and campaigns to the fleets in turn
// until ctx ends; a request cut by the end of ctx is not an answer.
func issueLoop(ctx context.Context, client int, fleets *atomic.Pointer[[]fleet], a *answers) {
	for n := client; ctx.Err() == nil; n++ {
		fs := *fleets.Load()
		f := fs[n%len(fs)]
		body := fmt.Sprintf(`{"member_id": "m%04d", "campaign_id": %q}`, rand.N(members), campaigns[rand.N(len(campaigns))].id)
		status, resp, err := post(ctx, f.url+"/IssueCoupon", body)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			status, resp = -1, err.Error()
		}
		if a.add(f.name, "IssueCoupon", status, resp)%relayEvery == 0 {
			relayOnce(fs[(n+1)%len(fs)], a)
		}
	}
}

// relayOnce calls RelayOutbox on f, as Cloud Scheduler does each minute: with the load, after
// every relayEvery IssueCoupon answers, so that the outbox holds rows not yet pushed between runs.
// A run is never cut short when the load stops: its leased rows would wait out the lease.
func relayOnce(f fleet, a *answers) {
	status, resp, err := post(context.Background(), f.url+"/RelayOutbox", `{"max_rows": 1000}`)
	if err != nil {
		status, resp = -1, err.Error()
	}
	a.add(f.name, "RelayOutbox", status, resp)
}

// waitAnswers waits until the IssueCoupon answers counted reach n.
func waitAnswers(t *testing.T, a *answers, n int64) {
	t.Helper()
	pgtest.Eventually(t, 3*pgtest.PollTimeout, func() error {
		if got := a.total.Load(); got < n {
			return fmt.Errorf("%d IssueCoupon answers, want %d", got, n)
		}
		return nil
	})
}

// operate is the operators during the roll-out, through this tree's Go API: FLEET-C paused and
// resumed, FLEET-A raised by 20,000 yen, and coupons not yet pushed voided, half with reissue
// allowed ([voidUnpushed]). It returns what failed and, for each coupon it voided, what the void said of its push
// ("not sent": no relay held its outbox row, so none may push it; "in flight": a relay holds it).
func operate(ctx context.Context, pool *pgxpool.Pool) ([]string, map[string]string) {
	var errs []string
	fail := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Sprintf("operator: %s: %v", what, err))
		}
	}
	_, err := campaign.Pause(ctx, pool, "FLEET-C", "mixed fleet: pause")
	fail("pause FLEET-C", err)
	add := int64(20_000)
	_, err = campaign.Update(ctx, pool, "FLEET-A", campaign.Changes{AddBudgetYen: &add, Reason: "mixed fleet: raise"})
	fail("raise FLEET-A", err)
	voided := map[string]string{}
	// Waiting for new rows ends after 2,000 tries or 20 s: once the load has run dry its clients
	// get their answers at once, and each try's query, slowed by them, took 40 ms (2,000 tries,
	// 80 s, for rows that never came).
	giveUp := time.Now().Add(20 * time.Second)
voiding:
	for tries := 0; len(voided) < voids && len(errs) == 0; tries++ {
		id, push, err := voidUnpushed(ctx, pool, len(voided)%2 == 0, len(voided)%3 != 0)
		switch {
		case errors.Is(err, pgx.ErrNoRows) && tries < 2_000 && time.Now().Before(giveUp): // the relays took every row: wait for new ones
			time.Sleep(time.Millisecond)
		case errors.Is(err, pgx.ErrNoRows):
			// The load ran dry (every member holds what the rules let it hold) and the relays
			// pushed the rest: fewer voids. checkTables still fails a run that voided none
			// before its push.
			break voiding
		case err != nil:
			fail("void a coupon not yet pushed", err)
		default:
			voided[id] = push
		}
	}
	_, err = campaign.Resume(ctx, pool, "FLEET-C", "mixed fleet: resume")
	fail("resume FLEET-C", err)
	return errs, voided
}

// voidUnpushed voids the newest coupon whose outbox row is due and unclaimed, with reissue
// allowed or not, and returns its id and what the void said of its push. With race, the void
// races the relays' claims as an operator's does: a void locks the row while it is open and
// closes it (00018_void_closes_outbox.sql), so a coupon it says "not sent" is never pushed by a
// relay of either release. Without, the row is locked first (FOR UPDATE SKIP LOCKED, as a claim
// takes it) and voided in the same transaction, so that the void finds it unclaimed and says
// "not sent" however fast the relays are: the check of such coupons always has some to check.
func voidUnpushed(ctx context.Context, pool *pgxpool.Pool, allowReissue, race bool) (string, string, error) {
	const newestUnpushed = `SELECT c.coupon_id::text FROM issued_coupons c
		JOIN notification_outbox o ON o.coupon_id = c.coupon_id
		WHERE c.voided_at IS NULL AND o.sent_at IS NULL AND o.skipped_at IS NULL AND o.next_attempt_at <= now()
		ORDER BY c.issued_at DESC LIMIT 1`
	var id string
	if race {
		if err := pool.QueryRow(ctx, newestUnpushed).Scan(&id); err != nil {
			return "", "", err
		}
		v, err := coupon.Void(ctx, pool, id, "mixed fleet: void", allowReissue)
		return id, v.Push, err
	}
	var v coupon.Voided
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, newestUnpushed+` FOR UPDATE OF o SKIP LOCKED`).Scan(&id); err != nil {
			return err
		}
		var err error
		v, err = coupon.Void(ctx, tx, id, "mixed fleet: void", allowReissue)
		return err
	})
	return id, v.Push, err
}

// drainRelay calls RelayOutbox on f until a run finds nothing more to do and no outbox row is
// open (not sent, skipped or parked): a row leased by a run of an instance that was stopped
// comes due again when its lease (RELAY_LEASE, 30 s) ends, and is pushed then.
func drainRelay(t *testing.T, f fleet, pool *pgxpool.Pool, a *answers) {
	t.Helper()
	pgtest.Eventually(t, 3*pgtest.PollTimeout, func() error {
		status, body, err := post(context.Background(), f.url+"/RelayOutbox", `{"max_rows": 1000}`)
		if err != nil {
			return err
		}
		a.add(f.name, "RelayOutbox", status, body)
		var got struct{ Sent, RetryLater, Parked, Skipped int }
		if err := json.Unmarshal([]byte(body), &got); err != nil || status != http.StatusOK {
			return fmt.Errorf("RelayOutbox: %d %s", status, body)
		}
		if got.Sent+got.RetryLater+got.Parked+got.Skipped > 0 {
			return fmt.Errorf("RelayOutbox still working: %s", body)
		}
		var open int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM notification_outbox
			WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL`).Scan(&open); err != nil {
			return err
		}
		if open > 0 {
			return fmt.Errorf("%d outbox rows still open (leased by a stopped run, or waiting to be retried)", open)
		}
		return nil
	})
}

// checkTables counts, after the load, pushes at the LINE stand-in by retry key (the coupon id):
// none of a coupon whose void said it was not sent (voided before any relay claimed it), at most
// one of any coupon, exactly one of a live coupon of a linked member; and the rules by reconcile.
func checkTables(ctx context.Context, t *testing.T, pool *pgxpool.Pool, stub *linestub.Stub, voided map[string]string) ([]string, int) {
	t.Helper()
	var ps []string
	rows, err := pool.Query(ctx, `SELECT c.coupon_id::text, c.voided_at IS NOT NULL, l.member_id IS NOT NULL
		  FROM issued_coupons c LEFT JOIN member_line_accounts l ON l.member_id = c.member_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var notSent, pushedOnce int
	for rows.Next() {
		var id string
		var isVoided, linked bool
		if err := rows.Scan(&id, &isVoided, &linked); err != nil {
			t.Fatal(err)
		}
		switch calls, accepted := stub.Calls(id), stub.AcceptedTimes(id); {
		case strings.HasPrefix(voided[id], "not sent") && calls > 0:
			ps = append(ps, fmt.Sprintf("coupon %s was voided before its push (its void said %q), and pushed %d times", id, voided[id], calls))
		case strings.HasPrefix(voided[id], "not sent"):
			notSent++
		case accepted > 1:
			ps = append(ps, fmt.Sprintf("coupon %s was pushed %d times", id, accepted))
		case linked && !isVoided && accepted != 1:
			ps = append(ps, fmt.Sprintf("live coupon %s of a linked member was pushed %d times, want once", id, accepted))
		case accepted == 1:
			pushedOnce++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if notSent == 0 {
		ps = append(ps, "no coupon was voided before its push: the check of voided pushes checked nothing")
	}
	rep, err := reconcile.Check(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations() {
		ps = append(ps, "reconcile: "+v)
	}
	t.Logf("%d coupons voided before their push and not pushed; %d pushed once", notSent, pushedOnce)
	return ps, stub.Stats().Requests
}
