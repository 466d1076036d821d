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
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/internal/answerlog"
	"github.com/mops/coupon-api/internal/pgtest"
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
	h, err := issue.NewHandler(pool, issuance.Config{})
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
