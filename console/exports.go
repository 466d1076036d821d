package console

import (
	"encoding/csv"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// The CSV exports for the weekly report (shared CONTRACT "The console"): UTF-8 with a byte order
// mark and Japanese headings, so that Excel opens them as they are; streamed, each row written
// as PostgreSQL answers it and flushed every [exportFlushRows] rows, so that an export's memory
// does not grow with its rows; plain reads, which take no lock on a budget stripe.

// exportFlushRows is how many rows an export writes between two flushes to the browser. A
// variable so that a test can keep the broken variant, an export that holds every row until
// the end (exports_test.go).
var exportFlushRows = 256

// maxExportDays bounds an export's date range: a year and a day.
const maxExportDays = 366

// campaignsCSV is the campaign list over a range of Asia/Tokyo days, one row per campaign, the
// figures of the coupons issued in the range (配布数 and 発行額 of the live ones, as the list
// counts them; 無効化数 beside them); the budget and what is left, now.
const campaignsCSV = `
WITH c AS (
  SELECT c.campaign_id, count(*) FILTER (WHERE c.voided_at IS NULL) AS issued,
         coalesce(sum(c.amount_yen) FILTER (WHERE c.voided_at IS NULL), 0) AS yen,
         count(*) FILTER (WHERE c.voided_at IS NOT NULL) AS voided,
         count(*) FILTER (WHERE c.voided_at IS NULL AND c.redeemed_at IS NOT NULL) AS redeemed,
         count(*) FILTER (WHERE c.voided_at IS NULL) AS live,
         count(*) FILTER (WHERE ` + sqlPushed + `) AS pushed,
         count(*) FILTER (WHERE o.skipped_at IS NOT NULL OR coalesce(p.outcome, c.outbox_outcome) LIKE 'skipped%') AS skipped
    FROM issued_coupons c LEFT JOIN notification_outbox o USING (coupon_id)` + sqlPrunedJoin + `
   WHERE c.issued_at >= $1 AND c.issued_at < $2
   GROUP BY c.campaign_id)
SELECT b.campaign_id, coalesce((SELECT n.name FROM campaign_names n WHERE n.campaign_id = b.campaign_id), ''), s.state, coalesce(c.issued, 0), coalesce(c.yen, 0), coalesce(c.voided, 0), s.remaining_coupons,
       b.budget_yen, b.issued_yen, coalesce(c.redeemed, 0), coalesce(c.live, 0), coalesce(c.pushed, 0), coalesce(c.skipped, 0)
  FROM (SELECT campaign_id, sum(budget_yen)::bigint AS budget_yen, sum(issued_yen)::bigint AS issued_yen
          FROM campaign_budgets GROUP BY campaign_id) b
  LEFT JOIN c USING (campaign_id)
  CROSS JOIN LATERAL campaign_state(b.campaign_id, issue_now()) s
 ORDER BY b.campaign_id`

var campaignsHeadings = []string{"キャンペーン", "名前", "状態", "配布数", "発行額（円）", "無効化数", "残り枚数",
	"予算（円）", "予算消化率（%）", "利用数", "利用率（%）", "送信数", "送信対象外数"}

// seriesCSV is campaign $1's coupons per hour or day ($2, date_trunc's unit) at Asia/Tokyo: the
// live ones issued then, their yen, those voided, those redeemed.
const seriesCSV = `
SELECT date_trunc($2, c.issued_at AT TIME ZONE 'Asia/Tokyo') AS t, count(*) FILTER (WHERE c.voided_at IS NULL),
       coalesce(sum(c.amount_yen) FILTER (WHERE c.voided_at IS NULL), 0), count(*) FILTER (WHERE c.voided_at IS NOT NULL),
       count(*) FILTER (WHERE c.voided_at IS NULL AND c.redeemed_at IS NOT NULL)
  FROM issued_coupons c WHERE c.campaign_id = $1 GROUP BY t ORDER BY t`

var seriesHeadings = []string{"日時（日本時間）", "配布数", "発行額（円）", "無効化数", "利用数"}

// exportCampaigns answers /exports/campaigns.csv?from=YYYY-MM-DD&to=YYYY-MM-DD (Asia/Tokyo days,
// both included; the last 7 days when neither is given).
func (s *server) exportCampaigns(w http.ResponseWriter, r *http.Request) {
	from, to, err := exportRange(r.URL.Query())
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, "", err, "/")
		return
	}
	name := fmt.Sprintf("campaigns_%s_%s.csv", from.Format("20060102"), to.AddDate(0, 0, -1).Format("20060102"))
	s.streamCSV(w, r, name, campaignsHeadings, campaignsCSV, []any{from, to}, func(row pgx.CollectableRow) ([]string, error) {
		var id, name, state string
		var issued, yen, voided, left, budget, spent, redeemed, live, pushed, skipped int64
		if err := row.Scan(&id, &name, &state, &issued, &yen, &voided, &left, &budget, &spent, &redeemed, &live, &pushed, &skipped); err != nil {
			return nil, err
		}
		used := "" // no budget: no rate
		if budget > 0 {
			used = tenthsText(spentTenths(spent, budget))
		}
		return []string{cell(id), cell(name), stateJa(state), num(issued), num(yen), num(voided), num(left), num(budget),
			used, num(redeemed), ratio(redeemed, live), num(pushed), num(skipped)}, nil
	})
}

// exportSeries answers /campaigns/{id}/series.csv?step=hour|day.
func (s *server) exportSeries(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	// A campaign that exists has a well-formed id: the only ids that reach the file's name.
	if _, err := campaign.Show(r.Context(), s.reads.pool, id); errors.Is(err, campaign.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, id, fmt.Errorf("キャンペーン %s はありません", id), "/")
		return
	} else if err != nil {
		s.fail(w, r, 0, id, err, "/")
		return
	}
	step := r.URL.Query().Get("step")
	layout := map[string]string{"hour": "2006/01/02 15:00", "day": "2006/01/02"}[step]
	if layout == "" {
		s.fail(w, r, http.StatusBadRequest, id, errors.New("step は hour（時間別）か day（日別）を指定してください"), "/campaigns/"+url.PathEscape(id))
		return
	}
	s.streamCSV(w, r, fmt.Sprintf("%s_%s.csv", id, step), seriesHeadings, seriesCSV, []any{id, step}, func(row pgx.CollectableRow) ([]string, error) {
		var t time.Time
		var issued, yen, voided, redeemed int64
		if err := row.Scan(&t, &issued, &yen, &voided, &redeemed); err != nil {
			return nil, err
		}
		return []string{t.Format(layout), num(issued), num(yen), num(voided), num(redeemed)}, nil
	})
}

// streamCSV writes the rows of query as a CSV file named name: the byte order mark, the
// headings, then each row as toRecord writes it, flushed every [exportFlushRows] rows. An error
// in sending the query is the error page; one while the rows come (the headings are sent by
// then) ends the file with a last line saying it is incomplete, and is logged.
func (s *server) streamCSV(w http.ResponseWriter, r *http.Request, name string, headings []string, query string, args []any,
	toRecord func(pgx.CollectableRow) ([]string, error)) {
	rows, err := s.reads.pool.Query(r.Context(), query, args...)
	if err != nil {
		s.fail(w, r, 0, name, err, "/")
		return
	}
	defer rows.Close()
	w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s"`, name))
	out := csv.NewWriter(w)
	_, _ = w.Write([]byte(utf8BOM))
	_ = out.Write(headings)
	flusher, _ := w.(http.Flusher)
	n := 0
	for rows.Next() {
		rec, err := toRecord(rows)
		if err != nil {
			s.exportBroken(out, name, err)
			return
		}
		_ = out.Write(rec)
		if n++; n%exportFlushRows == 0 {
			out.Flush()
			if flusher != nil {
				flusher.Flush()
			}
		}
	}
	if err := rows.Err(); err != nil {
		s.exportBroken(out, name, err)
		return
	}
	out.Flush()
}

// exportBroken ends an export that failed after its first row with a line saying so.
func (s *server) exportBroken(out *csv.Writer, name string, err error) {
	s.log.Error("console: export "+name, "err", err.Error())
	_ = out.Write([]string{"（書き出しが途中で失敗しました。このファイルは不完全です。もう一度書き出してください）"})
	out.Flush()
}

// utf8BOM makes Excel read a CSV as UTF-8.
const utf8BOM = "\ufeff"

// exportRange reads from and to, Asia/Tokyo days (YYYY-MM-DD, both included), as the instants
// [from 00:00, the day after to 00:00); the last 7 days up to today when both are empty.
func exportRange(q url.Values) (from, to time.Time, err error) {
	if q.Get("from") == "" && q.Get("to") == "" {
		today := time.Now().In(tokyo)
		to = time.Date(today.Year(), today.Month(), today.Day()+1, 0, 0, 0, 0, tokyo)
		return to.AddDate(0, 0, -7), to, nil
	}
	day := func(k string) (time.Time, error) {
		t, err := time.ParseInLocation("2006-01-02", q.Get(k), tokyo)
		if err != nil {
			return t, fmt.Errorf("%s: 日付（2026-12-01）を入力してください: %q", map[string]string{"from": "開始日", "to": "終了日"}[k], q.Get(k))
		}
		return t, nil
	}
	if from, err = day("from"); err != nil {
		return
	}
	if to, err = day("to"); err != nil {
		return
	}
	to = to.AddDate(0, 0, 1)
	switch {
	case !from.Before(to):
		err = errors.New("開始日は終了日より前か同じ日にしてください")
	case to.Sub(from) > maxExportDays*24*time.Hour:
		err = fmt.Errorf("書き出せるのは %d 日までです", maxExportDays)
	}
	return
}

// cell guards a text cell against a spreadsheet reading it as a formula: one starting with =, +,
// - or @ is written behind a single quote, as grant's CSV writes member ids (OWASP, "CSV
// Injection").
func cell(v string) string {
	if v != "" && strings.ContainsRune("=+-@", rune(v[0])) {
		return "'" + v
	}
	return v
}

// num writes n as a plain integer: a spreadsheet sums it (no separators).
func num(n int64) string { return strconv.FormatInt(n, 10) }

// ratio writes part over whole as a percentage to one decimal, rounded half up as PostgreSQL's
// round(numeric, 1) rounds, "" when whole is 0 (an empty cell, which a spreadsheet's average
// skips).
func ratio(part, whole int64) string {
	if whole <= 0 {
		return ""
	}
	tenths := (2000*part + whole) / (2 * whole)
	return fmt.Sprintf("%d.%d", tenths/10, tenths%10)
}
