package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/internal/lab/answerlog"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// TestLoadRefusesAURLThatIsNotIssueCoupon: a URL that answers 404 (the root of a serve that
// serves both functions) is refused after one probe, naming the path to use, before any load.
func TestLoadRefusesAURLThatIsNotIssueCoupon(t *testing.T) {
	var hits int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits++
		http.NotFound(w, nil)
	}))
	defer srv.Close()
	out, err := couponctl("load", "--url", srv.URL+"/", "--duration", "1s", "--clients", "4")
	if err == nil || !strings.Contains(err.Error(), "/IssueCoupon") || hits != 1 {
		t.Errorf("load on a 404 URL: %v (%d requests)\n%s\nwant refused after one probe, naming /IssueCoupon", err, hits, out)
	}
}

// TestLoadRecordThenAudit: "load --record" writes every answer, and "audit" of that log on the
// service's database passes; the same log with one ISSUED answer for a coupon the tables do not
// hold fails the audit, naming that coupon.
func TestLoadRecordThenAudit(t *testing.T) {
	url := pgtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	h, err := issue.New(issuance.Config{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	record := filepath.Join(t.TempDir(), "answers.jsonl")
	out, err := couponctl("load", "--url", srv.URL+"/", "--duration", "2s", "--clients", "4",
		"--campaigns", "2", "--members", "50", "--budget-yen", "20000", "--record", record)
	if err != nil {
		t.Fatalf("load --record: %v\n%s", err, out)
	}
	answers, err := answerlog.ReadFile(record)
	if err != nil || len(answers) < 100 || answers[0].MemberID == "" || answers[0].CampaignID == "" {
		t.Fatalf("answer log: %d answers (first %+v), %v; want hundreds, each with its member and campaign", len(answers), answers, err)
	}
	if out, err := couponctl("audit", record); err != nil || !strings.Contains(out, "OK:") {
		t.Fatalf("audit of the load's own log: %v\n%s", err, out)
	}

	const lost = "00000000-0000-4000-8000-00000000dead"
	f, err := os.OpenFile(record, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, `{"t":%q,"ms":4.2,"member_id":"m-lost","campaign_id":"LOAD-0001","status":201,"result":"ISSUED","coupon_id":%q,"error":""}`+"\n",
		time.Now().Format(time.RFC3339Nano), lost)
	f.Close()
	out, err = couponctl("audit", record)
	if !errors.Is(err, errViolations) || !strings.Contains(out, "coupon "+lost+" (LOAD-0001, m-lost): not in issued_coupons") {
		t.Errorf("audit of a log claiming a coupon that does not exist: %v\n%s\nwant exit 1 naming %s", err, out, lost)
	}
}

// serveIssueCoupon serves IssueCoupon on the database at databaseURL with cfg, behind wrap (nil:
// none), and returns its URL.
func serveIssueCoupon(t *testing.T, databaseURL string, cfg issuance.Config, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h, err := issue.New(cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	var handler http.Handler = h
	if wrap != nil {
		handler = wrap(h)
	}
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return srv.URL + "/"
}

// shortLoad is a load of 1 s from 4 clients over 2 campaigns and 20 members, with more args.
func shortLoad(url string, more ...string) (string, error) {
	return couponctl(append([]string{"load", "--url", url, "--duration", "1s", "--clients", "4",
		"--campaigns", "2", "--members", "20", "--budget-yen", "1000000"}, more...)...)
}

// TestLoadSendsHeaders: --header is sent with every request, the probe included, so that a
// service that takes only a bearer token (Cloud Run's IAM, as the gateway's account) can be
// loaded; without it the probe is refused naming --header; a malformed header is refused before
// anything is sent.
func TestLoadSendsHeaders(t *testing.T) {
	url := pgtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	var refused, hits atomic.Int64
	target := serveIssueCoupon(t, url, issuance.Config{}, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			if r.Header.Get("Authorization") != "Bearer t0k3n" || r.Header.Get("X-Drill") != "a: b" {
				refused.Add(1)
				http.Error(w, "Forbidden", http.StatusForbidden)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	out, err := shortLoad(target, "--header", "Authorization: Bearer t0k3n", "--header", "X-Drill:a: b")
	if err != nil || refused.Load() > 0 || !strings.Contains(out, "201 ISSUED") {
		t.Fatalf("load --header: %v, %d requests refused\n%s\nwant every request with the headers, ISSUED answers", err, refused.Load(), out)
	}
	if _, err := shortLoad(target); err == nil || !strings.Contains(err.Error(), "HTTP 403") || !strings.Contains(err.Error(), "--header") {
		t.Errorf("load without the token: %v; want the probe's 403 and a hint naming --header", err)
	}
	before := hits.Load()
	for _, bad := range []string{"Authorization Bearer t0k3n", ": no name", "Bad Name: x", "X-A: line\nbreak"} {
		if _, err := shortLoad(target, "--header", bad); err == nil || !strings.Contains(err.Error(), `want "Name: value"`) {
			t.Errorf("load --header %q: %v; want it refused as not \"Name: value\"", bad, err)
		}
	}
	if hits.Load() != before {
		t.Errorf("a malformed --header sent %d requests, want none", hits.Load()-before)
	}
}

// TestLoadRerunWithTheSameSeedAudits: a load run again with an earlier run's seed sends the same
// members, answered ALREADY_ISSUED: ISSUED only for a pair the first run did not issue (a
// loaded machine sends fewer requests in the first run's second), judged by the two answer
// logs. The second run's log audits OK (the coupons predate it). The
// audit reads only MONTHLY_CAP_YEN of the service's settings (an ISSUE_BUDGET it does not use,
// invalid, does not stop it), and refuses an empty log: nothing to audit.
func TestLoadRerunWithTheSameSeedAudits(t *testing.T) {
	url := pgtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	target := serveIssueCoupon(t, url, issuance.Config{}, nil)
	dir := t.TempDir()
	l1, l2 := filepath.Join(dir, "l1.jsonl"), filepath.Join(dir, "l2.jsonl")
	if out, err := shortLoad(target, "--seed", "42", "--record", l1); err != nil {
		t.Fatalf("first load: %v\n%s", err, out)
	}
	out, err := shortLoad(target, "--seed", "42", "--record", l2)
	if err != nil {
		t.Fatalf("second load with the same seed: %v\n%s", err, out)
	}
	first, err := answerlog.ReadFile(l1)
	if err != nil {
		t.Fatal(err)
	}
	second, err := answerlog.ReadFile(l2)
	if err != nil {
		t.Fatal(err)
	}
	asked := map[[2]string]bool{} // the pairs that hold a coupon after the first run, by its answers
	for _, a := range first {
		if a.Result == string(issuance.ResultIssued) || a.Result == string(issuance.ResultAlreadyIssued) {
			asked[[2]string{a.MemberID, a.CampaignID}] = true
		}
	}
	var again int
	for _, a := range second {
		switch pair := [2]string{a.MemberID, a.CampaignID}; {
		case a.Result == string(issuance.ResultIssued) && asked[pair]:
			t.Errorf("the second load with the same seed: %s %s ISSUED, which the first run issued\n%s", a.MemberID, a.CampaignID, out)
		case a.Result == string(issuance.ResultAlreadyIssued) && asked[pair]:
			again++
		}
	}
	if again == 0 {
		t.Fatalf("the second load with the same seed: no ALREADY_ISSUED for a pair of the first run's; want the same members\n%s", out)
	}
	t.Setenv("ISSUE_BUDGET", "10s")
	if out, err := couponctl("audit", l2); err != nil || !strings.Contains(out, "OK:") {
		t.Errorf("audit of the second run's log: %v\n%s\nwant OK", err, out)
	}
	empty := filepath.Join(dir, "empty.jsonl")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := couponctl("audit", empty); err == nil || !strings.Contains(err.Error(), "nothing to audit") {
		t.Errorf("audit of an empty log: %v\n%s\nwant a failure saying nothing to audit", err, out)
	}
}

// TestLoadChecksTheServicesDatabase: pointed at a database other than the service's, load fails:
// the coupons it was answered are not there.
func TestLoadChecksTheServicesDatabase(t *testing.T) {
	serviceDB, otherDB := pgtest.URL(t), pgtest.URL(t)
	pool, err := pgxpool.New(context.Background(), serviceDB)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, id := range []string{"LOAD-0001", "LOAD-0002"} {
		if err := campaign.Create(context.Background(), pool, campaign.Campaign{ID: id, DiscountYen: 1000, BudgetYen: 1_000_000}); err != nil {
			t.Fatal(err)
		}
	}
	target := serveIssueCoupon(t, serviceDB, issuance.Config{}, nil)
	t.Setenv("DATABASE_URL", otherDB)
	out, err := shortLoad(target)
	if !errors.Is(err, errViolations) || !strings.Contains(out, "is DATABASE_URL the service's database?") || strings.Contains(out, "OK:") {
		t.Errorf("load checking another database: %v\n%s\nwant a failure asking whether DATABASE_URL is the service's", err, out)
	}
}

// TestLoadRefusesAnUnmigratedDatabase: on an unmigrated DATABASE_URL load says to run couponctl
// migrate, and leaves no answer log behind.
func TestLoadRefusesAnUnmigratedDatabase(t *testing.T) {
	t.Setenv("DATABASE_URL", pgtest.EmptyURL(t))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"result":"INVALID_REQUEST"}`)
	}))
	defer srv.Close()
	record := filepath.Join(t.TempDir(), "answers.jsonl")
	out, err := shortLoad(srv.URL+"/", "--record", record)
	if err == nil || !strings.Contains(err.Error(), "couponctl migrate") {
		t.Errorf("load on an unmigrated database: %v\n%s\nwant a refusal saying to run couponctl migrate", err, out)
	}
	if _, err := os.Stat(record); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("answer log %s after the refusal: %v, want none", record, err)
	}
}
