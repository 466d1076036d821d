package console

import (
	"context"
	"encoding/csv"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/shared/issuance"
)

// flushCounter is a ResponseWriter that counts the flushes that reach it.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() { f.flushes++; f.ResponseRecorder.Flush() }

// readCSV reads an export's body: it must start with the UTF-8 byte order mark.
func readCSV(t *testing.T, v *verdict, name, body string) [][]string {
	rest, ok := strings.CutPrefix(body, utf8BOM)
	if !ok {
		v.Errorf("%s does not start with the UTF-8 byte order mark: %.40q", name, body)
	}
	recs, err := csv.NewReader(strings.NewReader(rest)).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, body)
	}
	return recs
}

// exportsCheck is the check of the CSV exports: coupons of EXP issued on two Tokyo days (the
// database's clock moved), one voided, one redeemed, one pushed; the campaign list over the first
// day and EXP's daily series carry the team's headings and the figures SQL counts on the tables;
// bad parameters are a Japanese 400; and an hourly series of 600 hours is streamed, flushed to the
// browser as it goes rather than held to the end.
func exportsCheck(t *testing.T, v *verdict) {
	ctx := context.Background()
	e := setup(t, verifiedIAP)
	e.createCampaign(t, campaign.Campaign{ID: "EXP", Name: "年末の感謝", DiscountYen: 1000, BudgetYen: 100_000})
	e.createCampaign(t, campaign.Campaign{ID: "IDLE", DiscountYen: 500, BudgetYen: 5_000})
	e.createCampaign(t, campaign.Campaign{ID: "-A1", DiscountYen: 500, BudgetYen: 5_000}) // a formula to a spreadsheet
	day1 := time.Date(2026, 12, 1, 10, 0, 0, 0, issuance.Tokyo)
	ids := map[string]string{}
	for i, m := range []string{"a", "b", "c", "d", "e"} {
		at := day1
		if i >= 3 {
			at = day1.AddDate(0, 0, 1)
		}
		pgtest.SetClock(t, e.owner, at)
		r, id := e.issueCoupon(t, m, "EXP")
		if r != "ISSUED" {
			t.Fatalf("IssueCoupon %s: %s", m, r)
		}
		ids[m] = id
	}
	for _, sql := range []string{
		`SELECT coupon_void('` + ids["a"] + `', '誤配布', false)`,
		`SELECT coupon_redeem('` + ids["b"] + `', 'b', 'order-1')`,
		`UPDATE notification_outbox SET sent_at = now() WHERE coupon_id = '` + ids["c"] + `'`,
	} {
		if _, err := e.owner.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	c := client(t)
	viewer := e.idp.assertion(t, viewerEmail)
	get := func(path string) (int, string, http.Header) {
		req, _ := http.NewRequest(http.MethodGet, e.console.URL+path, nil)
		req.Header.Set(AssertionHeader, viewer)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b), resp.Header
	}

	status, body, h := get("/exports/campaigns.csv?from=2026-12-01&to=2026-12-01")
	if status != http.StatusOK || h.Get("Content-Type") != "text/csv; charset=utf-8" || !strings.Contains(h.Get("Content-Disposition"), "campaigns_20261201_20261201.csv") {
		v.Errorf("campaigns.csv: %d %q %q", status, h.Get("Content-Type"), h.Get("Content-Disposition"))
	}
	recs := readCSV(t, v, "campaigns.csv", body)
	if len(recs) != 4 || !slices.Equal(recs[0], campaignsHeadings) {
		t.Fatalf("campaigns.csv: %d records, headings %q; want 4 and %q", len(recs), recs[0], campaignsHeadings)
	}
	if recs[1][0] != "'-A1" {
		v.Errorf("campaign -A1 is written %q, want '-A1 (a formula to a spreadsheet, behind a quote)", recs[1][0])
	}
	recs = recs[1:] // EXP and IDLE follow
	var want []string
	if err := e.owner.QueryRow(ctx, `
SELECT ARRAY['EXP', '年末の感謝', '発行中', count(*) FILTER (WHERE voided_at IS NULL)::text,
             (sum(amount_yen) FILTER (WHERE voided_at IS NULL))::text, count(*) FILTER (WHERE voided_at IS NOT NULL)::text,
             ((100000 - (SELECT sum(issued_yen) FROM campaign_budgets WHERE campaign_id = 'EXP')) / 1000)::text, '100000',
             to_char(floor(1000.0 * (SELECT sum(issued_yen) FROM campaign_budgets WHERE campaign_id = 'EXP') / 100000) / 10, 'FM990.0'),
             count(*) FILTER (WHERE voided_at IS NULL AND redeemed_at IS NOT NULL)::text,
             round(100.0 * count(*) FILTER (WHERE voided_at IS NULL AND redeemed_at IS NOT NULL) / count(*) FILTER (WHERE voided_at IS NULL), 1)::text,
             (SELECT count(*) FROM notification_outbox o JOIN issued_coupons i USING (coupon_id)
               WHERE i.campaign_id = 'EXP' AND i.issued_at < $1 AND o.sent_at IS NOT NULL)::text,
             (SELECT count(*) FROM notification_outbox o JOIN issued_coupons i USING (coupon_id)
               WHERE i.campaign_id = 'EXP' AND i.issued_at < $1 AND o.skipped_at IS NOT NULL)::text]
  FROM issued_coupons WHERE campaign_id = 'EXP' AND issued_at < $1`, time.Date(2026, 12, 2, 0, 0, 0, 0, issuance.Tokyo)).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(recs[1], want) {
		v.Errorf("campaigns.csv's EXP row %q, SQL counts %q", recs[1], want)
	}
	if idle := []string{"IDLE", "", "発行中", "0", "0", "0", "10", "5000", "0.0", "0", "", "0", "0"}; !slices.Equal(recs[2], idle) {
		v.Errorf("campaigns.csv's IDLE row %q, want %q", recs[2], idle)
	}

	_, body, _ = get("/campaigns/EXP/series.csv?step=day")
	if recs := readCSV(t, v, "series.csv", body); !slices.EqualFunc(recs, [][]string{seriesHeadings,
		{"2026/12/01", "2", "2000", "1", "1"}, {"2026/12/02", "2", "2000", "0", "0"}}, slices.Equal) {
		v.Errorf("EXP's daily series %q", recs)
	}
	for path, want := range map[string]string{
		"/exports/campaigns.csv?from=2026-13-01&to=2026-12-01": "開始日: 日付（2026-12-01）を入力してください",
		"/exports/campaigns.csv?from=2026-12-02&to=2026-12-01": "開始日は終了日より前か同じ日にしてください",
		"/exports/campaigns.csv?from=2020-01-01&to=2026-12-01": "書き出せるのは 366 日までです",
		"/campaigns/EXP/series.csv?step=week":                  "step は hour（時間別）か day（日別）を指定してください",
	} {
		if status, body, _ := get(path); status != http.StatusBadRequest || !strings.Contains(body, want) {
			v.Errorf("GET %s: %d, want 400 saying %q", path, status, want)
		}
	}
	for _, path := range []string{"/campaigns/NOPE/series.csv?step=day", "/campaigns/W%22E,L/series.csv?step=day"} {
		if status, body, _ := get(path); status != http.StatusNotFound || !strings.Contains(body, "はありません") {
			v.Errorf("GET %s: %d, want 404 saying the campaign does not exist", path, status)
		}
	}

	// 600 hours of a campaign: streamed, a flush every exportFlushRows rows.
	e.createCampaign(t, campaign.Campaign{ID: "LONG", DiscountYen: 100, BudgetYen: 1_000_000})
	if _, err := e.owner.Exec(ctx, `INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at)
SELECT gen_random_uuid(), 'LONG', 'long' || g, to_char(t AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM'), 100, t
  FROM generate_series(1, 600) g, LATERAL (SELECT timestamptz '2026-11-01 00:30+09' + make_interval(hours => g)) x(t)`); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "/campaigns/LONG/series.csv?step=hour", nil)
	req.Header.Set(AssertionHeader, viewer)
	w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	e.console.Config.Handler.ServeHTTP(w, req)
	if rows := len(readCSV(t, v, "LONG's hourly series", w.Body.String())) - 1; rows != 600 || w.flushes < 2 {
		v.Errorf("LONG's hourly series: %d rows, flushed %d times, want 600 rows flushed as they go (at least twice: a flush every 256 rows)", rows, w.flushes)
	}
}

// TestExportsAreTheTeamsCSV: the exports (exportsCheck). Also run with an export that holds
// every row until the end (a flush every billion rows, a fixture here): found.
func TestExportsAreTheTeamsCSV(t *testing.T) {
	checkAndBreak(t, exportsCheck, brokenVariant{"an export that buffers every row", func(t *testing.T, v *verdict) {
		saved := exportFlushRows
		exportFlushRows = 1 << 30
		t.Cleanup(func() { exportFlushRows = saved })
		exportsCheck(t, v)
	}})
}
