package console

import (
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The database's refusals in the team's words. The change functions raise them in English (the
// words couponctl prints); this table is the one place the console says each in Japanese. A
// refusal it does not know is shown as a general sentence ([refusalUnknown]) and logged.

// refusalJa is one refusal the console may meet: the message's pattern, its named groups, and
// the Japanese, each ${name} replaced by the group said as [sayJa] says it.
type refusalJa struct {
	pattern *regexp.Regexp
	ja      string
}

var refusalsJa = []refusalJa{
	// campaign_refuse_ended
	{regexp.MustCompile(`^campaign (?P<id>\S+) has ended, at (?P<at>.+?): a (?P<what>.+?) does not reopen it`),
		"キャンペーン ${id} は ${at} に終了しているため、${what}はできません。再び配布するには、期間の変更を申請してください。"},
	// campaign_change_state
	{regexp.MustCompile(`^campaign (?P<id>\S+) has not started \(it starts (?P<at>.+?)\)`),
		"キャンペーン ${id} はまだ始まっていません（開始 ${at}）。今すぐ終了はできません。一時停止するか、期間の変更を申請してください。"},
	// campaign_change_state, console_period
	{regexp.MustCompile(`^campaign (?P<id>\S+): starts (?P<starts>.+?) is not before ends (?P<ends>.+?); nothing changed`),
		"開始（${starts}）が終了（${ends}）より前ではありません。"},
	// campaign_change_budget
	{regexp.MustCompile(`^campaign (?P<id>\S+): a budget of (?P<budget_yen>\d+) yen is below the (?P<issued_yen>\d+) yen already issued`),
		"予算 ${budget_yen}は、発行済みの ${issued_yen}を下回ります。"},
	{regexp.MustCompile(`^campaign (?P<id>\S+): a budget of (?P<budget_yen>-?\d+) yen is not between one (?P<discount_yen>\d+) yen coupon and (?P<max_yen>\d+) yen`),
		"予算 ${budget_yen}は、1 枚分（${discount_yen}）以上 ${max_yen}以下にしてください。"},
	{regexp.MustCompile(`^campaign (?P<id>\S+): (?P<stripes>-?\d+) stripes for a budget of (?P<coupons>\d+) coupons`),
		"予算ストライプ数 ${stripes} は 1〜64 で、予算の枚数（${coupons} 枚）以下にしてください。"},
	// console_budget, console_period
	{regexp.MustCompile(`^campaign (?P<id>\S+): nothing to change`), "変更する内容を入力してください。"},
	{regexp.MustCompile(`^give a budget or an amount to add, not both`), "新しい予算と増減額は、どちらか一方だけを入力してください。"},
	{regexp.MustCompile(`^every (change|decision|void) needs a reason`), "理由を入力してください。"},
	// campaign_lock, console_period, coupon_void, console_decide
	{regexp.MustCompile(`^campaign (?P<id>\S+) does not exist`), "キャンペーン ${id} はありません。"},
	{regexp.MustCompile(`^coupon (?P<id>\S+) does not exist`), "クーポン ${id} はありません。"},
	{regexp.MustCompile(`^request (?P<id>\d+) does not exist`), "申請 #${id} はありません。"},
	{regexp.MustCompile(`^request (?P<id>\d+) was (?P<decision>\w+) by (?P<who>\S+) at (?P<at>.+?); nothing changed`),
		"申請 #${id} は ${at} に ${who} が${decision}しています。"},
	{regexp.MustCompile(`^request (?P<id>\d+) lapsed at (?P<at>.+?), (?P<hours>\d+) h after`),
		"申請 #${id} は ${at} に失効しました（申請から ${hours} 時間）。もう一度申請してください。"},
	{regexp.MustCompile(`^request (?P<id>\d+) was made by (?P<who>\S+): a different approver decides it`),
		"申請 #${id} は ${who} の申請です。申請者とは別の承認者が決定します。"},
	// operator_require
	{regexp.MustCompile(`^(?P<who>\S+) is an? (?P<role>\w+) in the console: (?P<act>.+?) needs the (?P<need>\w+) role`),
		"${who} の役割は${role}です。この操作には${need}の役割が必要です。役割の付与は管理者に依頼してください。"},
}

// wordsJa are the English words a refusal's groups hold, said in Japanese.
var wordsJa = map[string]string{
	"pause": "一時停止", "resume": "再開", "budget change": "予算の変更", "release": "配布予定の追加",
	"approved": "承認", "rejected": "却下", "viewer": "閲覧者", "operator": "オペレーター", "approver": "承認者",
}

// refusalUnknown is what the page says of a refusal the table does not know.
const refusalUnknown = "データベースがこの変更を受け付けませんでした。"

// sayRefusal is [sayJa] as refusalOf calls it: a variable, so that a test can keep the broken
// variant, the database's English as it is (refusals_test.go).
var sayRefusal = sayJa

// sayJa is refusal message msg in Japanese, and whether the table knew it.
func sayJa(msg string) (string, bool) {
	for _, r := range refusalsJa {
		m := r.pattern.FindStringSubmatch(msg)
		if m == nil {
			continue
		}
		out := r.ja
		for i, name := range r.pattern.SubexpNames() {
			if name != "" {
				out = strings.ReplaceAll(out, "${"+name+"}", groupJa(name, m[i]))
			}
		}
		return out, true
	}
	return refusalUnknown, false
}

// groupJa is a refusal's group said in Japanese: an instant as the team reads a time, yen with
// its unit, a known word in Japanese, anything else as it is.
func groupJa(name, v string) string {
	if t, ok := pgTime(v); ok {
		return tokyoTime(t)
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && strings.HasSuffix(name, "_yen") {
		return yen(n)
	}
	if ja, ok := wordsJa[v]; ok {
		return ja
	}
	return v
}

// pgTime reads a timestamptz as PostgreSQL writes it in a message (DateStyle ISO).
func pgTime(v string) (time.Time, bool) {
	for _, layout := range []string{"2006-01-02 15:04:05.999999-07", "2006-01-02 15:04:05.999999-07:00", "2006-01-02 15:04:05.999999-07:00:00"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}
