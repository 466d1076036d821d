package console

import (
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
)

// The audit page (/audit) and its export (/exports/audit.csv): every change across campaigns,
// voids, role grants and rule settings, newest first, filtered by person, campaign and Asia/Tokyo
// days. Each row names the person (the console user's email when the change came through the
// console, else the database login) and the login beside it.

// auditPageRows bounds the rows the page shows; the export has them all.
const auditPageRows = 500

// sqlAudit is the changes: $1 person ("" any: matches the person or the login), $2 campaign ("" any),
// [$3, $4) the instants. The voids are read through issued_coupons_voided (00036). A variable so
// that a test can keep a broken variant (audit_test.go).
var sqlAudit = `
SELECT a.at, a.person, a.login, a.kind, a.what, a.target, a.before, a.after, a.reason FROM (
  SELECT c.changed_at AS at, coalesce(c.operator_email, c.changed_by) AS person, c.changed_by AS login, 'campaign' AS kind,
         c.what, c.campaign_id AS target, c.campaign_id, c.before, c.after, c.reason
    FROM campaign_changes c WHERE c.changed_at >= $3 AND c.changed_at < $4
  UNION ALL
  SELECT i.voided_at, coalesce(i.voided_by_email, i.voided_by), i.voided_by, 'coupon', 'void', i.coupon_id::text, i.campaign_id,
         NULL, jsonb_build_object('reissue_allowed', i.reissue_allowed), coalesce(i.void_reason, '')
    FROM issued_coupons i WHERE i.voided_at IS NOT NULL AND i.voided_at >= $3 AND i.voided_at < $4
  UNION ALL
  SELECT x.changed_at, x.changed_by, x.changed_by, 'coupon', x.what, x.coupon_id::text, i.campaign_id, NULL, NULL, x.reason
    FROM coupon_changes x JOIN issued_coupons i USING (coupon_id) WHERE x.changed_at >= $3 AND x.changed_at < $4
  UNION ALL
  SELECT r.changed_at, r.changed_by, r.changed_by, 'role', 'role', r.email, NULL,
         jsonb_build_object('role', r.before), jsonb_build_object('role', r.after), r.reason
    FROM console_role_changes r WHERE r.changed_at >= $3 AND r.changed_at < $4
  UNION ALL
  SELECT u.changed_at, u.changed_by, u.changed_by, 'rules', 'rules', '', NULL, u.before, u.after, u.reason
    FROM coupon_rules_changes u WHERE u.changed_at >= $3 AND u.changed_at < $4
) a
WHERE ($1 = '' OR a.person = $1 OR a.login = $1) AND ($2 = '' OR a.campaign_id = $2)
ORDER BY a.at DESC`

// AuditRow is one change as the audit page shows it.
type AuditRow struct {
	At                        time.Time
	Person, Login, Kind, What string
	Target                    string
	Before, After             map[string]any
	Reason                    string
}

// auditFilter is the page's and the export's filters.
type auditFilter struct {
	Person, Campaign string
	From, To         time.Time // [From, To), Asia/Tokyo days
	FromDay, ToDay   string    // as typed, for the form
}

// readAuditFilter reads person, campaign, from and to (as the exports' range, the last 7 days
// when both dates are empty).
func readAuditFilter(q url.Values) (auditFilter, error) {
	f := auditFilter{Person: q.Get("person"), Campaign: q.Get("campaign"), FromDay: q.Get("from"), ToDay: q.Get("to")}
	var err error
	f.From, f.To, err = exportRange(q)
	return f, err
}

func (f auditFilter) args() []any { return []any{f.Person, f.Campaign, f.From, f.To} }

// scanAudit reads one row of sqlAudit.
func scanAudit(row pgx.CollectableRow) (a AuditRow, err error) {
	err = row.Scan(&a.At, &a.Person, &a.Login, &a.Kind, &a.What, &a.Target, &a.Before, &a.After, &a.Reason)
	return a, err
}

// auditView is the audit page's data.
type auditView struct {
	Filter auditFilter
	Rows   []AuditRow
	More   bool // more rows than the page shows: the export has them
	Query  string
}

func (s *server) auditPage(w http.ResponseWriter, r *http.Request) {
	p, err := s.newPage(r, "監査ログ")
	if err != nil {
		s.fail(w, r, 0, "audit", err, "/")
		return
	}
	f, err := readAuditFilter(r.URL.Query())
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, "audit", err, "/audit")
		return
	}
	rows, err := s.reads.pool.Query(r.Context(), sqlAudit+fmt.Sprintf(" LIMIT %d", auditPageRows+1), f.args()...)
	var list []AuditRow
	if err == nil {
		list, err = pgx.CollectRows(rows, scanAudit)
	}
	if err != nil {
		s.fail(w, r, 0, "audit", err, "/")
		return
	}
	v := auditView{Filter: f, Rows: list, Query: r.URL.RawQuery}
	if len(list) > auditPageRows {
		v.Rows, v.More = list[:auditPageRows], true
	}
	p.Data = v
	s.render(w, http.StatusOK, "audit.html", p)
}

var auditHeadings = []string{"日時（日本時間）", "担当者", "DB ログイン", "種類", "変更", "対象", "変更前", "変更後", "理由"}

// exportAudit answers /exports/audit.csv with the audit page's filters: every row, streamed.
func (s *server) exportAudit(w http.ResponseWriter, r *http.Request) {
	f, err := readAuditFilter(r.URL.Query())
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, "audit", err, "/audit")
		return
	}
	name := fmt.Sprintf("audit_%s_%s.csv", f.From.Format("20060102"), f.To.AddDate(0, 0, -1).Format("20060102"))
	s.streamCSV(w, r, name, auditHeadings, sqlAudit, f.args(), func(row pgx.CollectableRow) ([]string, error) {
		a, err := scanAudit(row)
		if err != nil {
			return nil, err
		}
		return []string{tokyoTime(a.At), cell(a.Person), cell(a.Login), auditKindJa(a.Kind), auditWhatJa(a), cell(a.Target),
			jsonText(a.Before), jsonText(a.After), cell(a.Reason)}, nil
	})
}

// auditKindJa is a change's kind in the team's words.
func auditKindJa(kind string) string {
	return map[string]string{"campaign": "キャンペーン", "coupon": "クーポン", "role": "役割", "rules": "ルール設定"}[kind]
}

// auditWhatJa is what a change did, in the team's words.
func auditWhatJa(a AuditRow) string {
	switch a.What {
	case "void":
		return "無効化"
	case "allow_reissue":
		return "再発行の許可"
	case "role":
		return "役割の変更"
	case "rules":
		return "ルールの変更"
	}
	return whatJa(a.What)
}
