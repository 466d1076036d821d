package console

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/text/width"

	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/ops/coupon"
)

// The console's changes go through the console_* functions of migration 00026 (schema/current),
// which check the person's role in the database, record the email beside the database login and
// call the same change functions as couponctl: the console decides nothing itself.
const (
	sqlPause  = `SELECT count(*) FROM console_pause($1, $2, $3, $4)`
	sqlEnd    = `SELECT count(*) FROM console_end($1, $2, $3)`
	sqlBudget = `SELECT applied, request_id FROM console_budget($1, $2, $3, $4, $5, $6)`
	sqlDecide = `SELECT count(*) FROM console_decide($1, $2, $3, $4)`
	sqlPeriod = `SELECT applied, request_id FROM console_period($1, $2, $3, $4, $5)`
	sqlVoid   = `SELECT result FROM console_void($1, $2, $3, $4)`
)

// outcome is what a change did, for the message after the redirect.
type outcome struct {
	done      string // a key of doneMessages
	requestID int64  // the pending request a budget change became
}

// actions runs the changes as the person who asked.
type actions struct {
	pool *pgxpool.Pool
}

// call runs sql with args and scans its one row. The console_* functions set their own
// lock_timeout (1 s, as couponctl's changes): a change gives up on a held budget stripe rather
// than stall the campaign behind it.
func (a *actions) call(ctx context.Context, sql string, args []any, scan ...any) error {
	return a.pool.QueryRow(ctx, sql, args...).Scan(scan...)
}

// state pauses, resumes or ends campaign id as person; a change that finds the campaign already
// so is "unchanged". What may be done to an ended campaign the change functions decide, under
// its lock (campaign_refuse_ended): a pause or a resume of one is refused (CI422).
func (a *actions) state(ctx context.Context, id, action, person, reason string) (outcome, error) {
	var n int
	var err error
	if action == "end" {
		err = a.call(ctx, sqlEnd, []any{id, person, reason}, &n)
	} else {
		err = a.call(ctx, sqlPause, []any{id, action == "pause", person, reason}, &n)
	}
	if err != nil {
		return outcome{}, err
	}
	if n == 0 {
		return outcome{done: "unchanged"}, nil
	}
	return outcome{done: action}, nil
}

// budget changes campaign id's budget (set or add) and stripes as person: a raise above the rule
// setting approval_above_yen becomes a pending request instead (console_budget decides).
func (a *actions) budget(ctx context.Context, id string, setYen, addYen *int64, stripes *int, person, reason string) (outcome, error) {
	if setYen == nil && stripes == nil && addYen != nil && *addYen == 0 {
		return outcome{done: "unchanged"}, nil // adding 0 yen changes nothing
	}
	var applied bool
	var request *int64
	if err := a.call(ctx, sqlBudget, []any{id, setYen, addYen, stripes, person, reason}, &applied, &request); err != nil {
		return outcome{}, err
	}
	if !applied && request != nil {
		return outcome{done: "requested", requestID: *request}, nil
	}
	return outcome{done: "budget"}, nil
}

// period asks to move campaign id's start and end (nil: as it is) as person: always a pending
// request, which a different approver decides (console_period).
func (a *actions) period(ctx context.Context, id string, starts, ends *time.Time, person, reason string) (outcome, error) {
	var applied bool
	var request *int64
	if err := a.call(ctx, sqlPeriod, []any{id, starts, ends, person, reason}, &applied, &request); err != nil {
		return outcome{}, err
	}
	if request == nil {
		return outcome{}, fmt.Errorf("console: console_period answered no request for %s", id)
	}
	return outcome{done: "requested_period", requestID: *request}, nil
}

// refusalOf turns a change's error into the status and message the page shows: the database's
// refusal in Japanese (sayJa), or, for anything unexpected, a generic message (the detail goes
// to the log, as does a refusal the table does not know).
func refusalOf(err error) (status int, msg string, unexpected bool) {
	var own errRefusedGo
	if errors.As(err, &own) {
		return http.StatusConflict, "できませんでした: " + string(own), false
	}
	var missing errNotFound
	if errors.As(err, &missing) {
		return http.StatusNotFound, string(missing), false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		ja, known := sayRefusal(pgErr.Message) // an unknown refusal is logged, to join the table
		switch pgErr.Code {
		case pgerrcode.InsufficientPrivilege:
			if !roleRefusal(pgErr) {
				break // a grant the console's login lacks: the deployment's fault, not the person's
			}
			return http.StatusForbidden, "権限がありません: " + ja, !known
		case "CI404":
			return http.StatusNotFound, ja, !known
		case "CI422", "CI409":
			return http.StatusConflict, "できませんでした: " + ja + "（何も変更していません）", !known
		case pgerrcode.LockNotAvailable:
			return http.StatusServiceUnavailable, "ほかの変更か配布が 1 秒以上続いたため、変更できませんでした。何も変更していません。もう一度実行してください。", false
		}
	}
	return http.StatusInternalServerError, "予期しないエラーです。何も変更されていない可能性があります。ログを確認してください。", true
}

// roleRefusal says err was raised by the console's own functions (a RAISE in PL/pgSQL, routine
// exec_stmt_raise: operator_require's role check, console_decide's "a different approver"), and
// not by PostgreSQL for a privilege the database login lacks.
func roleRefusal(err *pgconn.PgError) bool {
	return err.Routine == "exec_stmt_raise"
}

// form is a POSTed action's fields.
type form struct{ r *http.Request }

// maxReasonRunes is the longest reason a change takes, in characters: a sentence or a paragraph
// for the history, not a document.
const maxReasonRunes = 1000

// reason is the form's reason, trimmed: valid UTF-8, at most [maxReasonRunes] characters, with
// at least one visible character (a zero-width space alone is no reason).
func (f form) reason() (string, error) {
	r := strings.TrimSpace(f.r.PostFormValue("reason"))
	switch {
	case !utf8.ValidString(r):
		return "", errors.New("理由に UTF-8 として読めない文字が含まれています")
	case utf8.RuneCountInString(r) > maxReasonRunes:
		return "", fmt.Errorf("理由は %d 文字以内で入力してください（%d 文字）", maxReasonRunes, utf8.RuneCountInString(r))
	case !strings.ContainsFunc(r, visible):
		return "", errors.New("理由を入力してください")
	}
	return r, nil
}

// visible says c shows as a mark: a letter, digit, punctuation or symbol, not a space, a
// control or a format character such as U+200B ZERO WIDTH SPACE.
func visible(c rune) bool {
	return unicode.In(c, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S)
}

// The budget fields' ranges, as couponctl campaign update's --budget-yen and --add-budget-yen
// take them: campaign amounts are PostgreSQL integers.
const (
	minBudgetYen = 1
	maxBudgetYen = math.MaxInt32
	maxAddYen    = math.MaxInt32
)

// yenField is field as an integer in yen within [lo, hi], nil when empty.
func (f form) yenField(field string, lo, hi int64) (*int64, error) {
	n, err := f.int64Field(field)
	if err != nil || n == nil {
		return n, err
	}
	if *n < lo || *n > hi {
		return nil, fmt.Errorf("%s: %sから %sまでの整数を入力してください（入力: %s）", fieldJa[field], yen(lo), yen(hi), yen(*n))
	}
	return n, nil
}

// int64Field is field as an integer in yen ([number]), nil when empty.
func (f form) int64Field(field string) (*int64, error) {
	v := number(f.r.PostFormValue(field))
	if v == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%s: 整数（円）を入力してください: %q", fieldJa[field], f.r.PostFormValue(field))
	}
	return &n, nil
}

// number is a number field as the team types it, for strconv to read: full-width digits and
// signs folded (width.Narrow), one trailing 円 and the spaces around it dropped, a minus sign
// (U+2212) read as "-", and commas dropped when they group thousands (1,000; 1,00,0 stays as
// typed, for strconv to refuse).
func number(v string) string {
	v = strings.TrimSpace(width.Narrow.String(v))
	v = strings.Replace(strings.TrimSpace(strings.TrimSuffix(v, "円")), "\u2212", "-", 1)
	if groupedThousands.MatchString(v) {
		v = strings.ReplaceAll(v, ",", "")
	}
	return v
}

// groupedThousands is a whole number written with commas between its thousands.
var groupedThousands = regexp.MustCompile(`^[-+]?\d{1,3}(,\d{3})+$`)

// fieldJa are the forms' fields as their labels name them.
var fieldJa = map[string]string{"budget_yen": "新しい予算", "add_budget_yen": "増減額", "stripes": "予算ストライプ数",
	"starts": "開始", "ends": "終了"}

func (f form) stripes() (*int, error) {
	v := number(f.r.PostFormValue("stripes"))
	if v == "" {
		return nil, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > campaign.MaxStripes {
		return nil, fmt.Errorf("予算ストライプ数: 1 から %d の整数を入力してください: %q", campaign.MaxStripes, f.r.PostFormValue("stripes"))
	}
	return &n, nil
}

// budgetArgs reads the budget form: budget_yen (set) or add_budget_yen (add; negative cuts), at
// most one, and stripes.
func (f form) budgetArgs() (set, add *int64, stripes *int, err error) {
	if set, err = f.yenField("budget_yen", minBudgetYen, maxBudgetYen); err != nil {
		return
	}
	if add, err = f.yenField("add_budget_yen", -maxAddYen, maxAddYen); err != nil {
		return
	}
	if stripes, err = f.stripes(); err != nil {
		return
	}
	switch {
	case set != nil && add != nil:
		err = errors.New("新しい予算と増減額は、どちらか一方だけを入力してください")
	case set == nil && add == nil && stripes == nil:
		err = errors.New("増減額か新しい予算を入力してください")
	}
	return
}

// jstField is field, a datetime-local value (2026-12-01T10:00, seconds optional) read in
// Asia/Tokyo, nil when empty.
func (f form) jstField(field string) (*time.Time, error) {
	v := strings.TrimSpace(f.r.PostFormValue(field))
	if v == "" {
		return nil, nil
	}
	for _, layout := range []string{"2006-01-02T15:04", "2006-01-02T15:04:05"} {
		if t, err := time.ParseInLocation(layout, v, tokyo); err == nil {
			return &t, nil
		}
	}
	return nil, fmt.Errorf("%s: 日本時間の日時（2026-12-01T10:00）を入力してください: %q", fieldJa[field], v)
}

// periodArgs reads the period form: starts and ends (either may be empty, not both).
func (f form) periodArgs() (starts, ends *time.Time, err error) {
	if starts, err = f.jstField("starts"); err != nil {
		return
	}
	if ends, err = f.jstField("ends"); err != nil {
		return
	}
	if starts == nil && ends == nil {
		err = errors.New("開始か終了を入力してください")
	}
	return
}

// voidCoupon voids coupon id as person. A coupon voided already or redeemed is refused as
// couponctl coupon void refuses it.
func (a *actions) voidCoupon(ctx context.Context, id string, allowReissue bool, person, reason string) error {
	if err := coupon.CheckID(id); err != nil {
		return err
	}
	var result string
	if err := a.call(ctx, sqlVoid, []any{id, allowReissue, person, reason}, &result); err != nil {
		return err
	}
	switch result {
	case "VOIDED":
		return nil
	case "ALREADY_VOIDED":
		return errRefusedGo("このクーポンは既に無効化されています（何も変更していません）")
	case "REDEEMED":
		return errRefusedGo("このクーポンは利用済みです（注文に紐づく旧クーポン。何も変更していません）")
	}
	return fmt.Errorf("console: console_void answered %q", result)
}

// errRefusedGo is a refusal the console words from a function's answer (not an exception).
type errRefusedGo string

func (e errRefusedGo) Error() string { return string(e) }

// errNotFound is a campaign or coupon the console looked for and did not find.
type errNotFound string

func (e errNotFound) Error() string { return string(e) }
