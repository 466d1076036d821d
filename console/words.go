package console

import (
	"fmt"
	"strconv"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// The campaign's figures in the promotion team's words, each from the database's own reading
// (campaign.Status: campaign_state, the R1 counter, the releases): nothing here judges a state.

// lowBudgetPercent is the share of the budget left below which a campaign is flagged 残りわずか
// (Talon.One's "Low on budget" flags 5%).
const lowBudgetPercent = 5

// shortTime writes t as a state's note does, Asia/Tokyo: 12/08 10:00, with its year when it is
// not this year's (2099/12/31 23:59).
func shortTime(t time.Time) string {
	if t = t.In(tokyo); t.Year() != time.Now().In(tokyo).Year() {
		return t.Format("2006/01/02 15:04")
	}
	return t.Format("01/02 15:04")
}

// remaining is 残り枚数 as the list and the campaign page show it: the coupons the budget and
// the releases still allow, "—" for a campaign that has ended (it issues none again).
func remaining(s campaign.Status) string {
	if over(s.State) {
		return "—"
	}
	return groupDigits(s.RemainingCoupons) + " 枚"
}

// skipJa is why the relay skipped a coupon's push (the outbox row's skip_reason), in Japanese.
func skipJa(reason string) string {
	if ja, ok := map[string]string{"voided": "無効化されたため", "redeemed": "送信前に利用されたため",
		"expired": "送信前に有効期限が切れたため", "no_line_account": "LINE アカウントの連携がないため"}[reason]; ok {
		return ja
	}
	return ""
}

// issuedCoupons is 配布数: the live coupons the R1 counter stands for.
func issuedCoupons(s campaign.Status) int {
	if s.DiscountYen == 0 {
		return 0
	}
	return s.IssuedYen / s.DiscountYen
}

// usedTenths is 予算消化率 in tenths of a percent (issued yen over the budget): [spentTenths].
func usedTenths(s campaign.Status) int { return spentTenths(int64(s.IssuedYen), int64(s.BudgetYen)) }

// spentTenths is issued yen over budget yen in tenths of a percent, rounded down so that a
// campaign shows 100.0 only once it is spent; 0 for a budget of 0.
func spentTenths(issued, budget int64) int {
	if budget <= 0 {
		return 0
	}
	return int(min(1000, 1000*issued/budget))
}

// tenthsText writes n tenths of a percent as the number the pages and the exports show: 33.3.
func tenthsText(n int) string { return fmt.Sprintf("%d.%d", n/10, n%10) }

// lowBudget says the budget left is above none and below [lowBudgetPercent] of the budget.
func lowBudget(s campaign.Status) bool {
	left := s.BudgetYen - s.IssuedYen
	return left > 0 && int64(left)*100 < int64(s.BudgetYen)*lowBudgetPercent
}

// stateNote is what the team needs beside a state: the next release of a campaign whose
// released coupons are taken (次回 12/08 10:00 +200枚), when a campaign not started opens
// (12/08 10:00 開始), "" otherwise.
func stateNote(s campaign.Status) string {
	switch {
	case s.State == campaign.StateWaitingRelease && s.NextReleaseAt != nil:
		return fmt.Sprintf("次回 %s +%d枚", shortTime(*s.NextReleaseAt), releaseAt(s, *s.NextReleaseAt))
	case s.State == campaign.StateNotStarted && s.OpensAt != nil:
		return shortTime(*s.OpensAt) + " 開始"
	}
	return ""
}

// releaseAt is the coupons campaign s's release at instant at gives, 0 when none is there.
func releaseAt(s campaign.Status, at time.Time) int {
	for _, r := range s.Schedule {
		if r.At.Equal(at) {
			return r.Coupons
		}
	}
	return 0
}

// badges are campaign s's kinds: 先着N名 (its budget in coupons, first come first served),
// 毎日HH:MM for releases a day apart at one Asia/Tokyo time (配布 N 回 for other releases),
// and 会員限定 with its audience's size.
func badges(s campaign.Status) []string {
	var out []string
	if s.DiscountYen > 0 {
		out = append(out, "先着"+groupDigits(s.BudgetYen/s.DiscountYen)+"名")
	}
	if n := len(s.Schedule); n > 0 {
		if hhmm, ok := daily(s.Schedule); ok {
			out = append(out, "毎日"+hhmm)
		} else {
			out = append(out, fmt.Sprintf("配布 %d 回", n))
		}
	}
	if s.AudienceOnly {
		out = append(out, "会員限定 "+groupDigits(s.AudienceSize)+"名")
	}
	return out
}

// daily says whether releases are at least two, each a day after the one before at the same
// Asia/Tokyo HH:MM, and that time.
func daily(releases []campaign.ReleaseStatus) (string, bool) {
	if len(releases) < 2 {
		return "", false
	}
	for i := 1; i < len(releases); i++ {
		prev := releases[i-1].At.In(tokyo)
		if !releases[i].At.Equal(prev.AddDate(0, 0, 1)) {
			return "", false
		}
	}
	return releases[0].At.In(tokyo).Format("15:04"), true
}

// groupDigits writes n with thousands separators: 12,000.
func groupDigits[N int | int64](n N) string {
	s := strconv.FormatInt(int64(n), 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// timeLeft is the time from now to at in hours and minutes, as a request's 失効まで reads
// (あと 23 時間 12 分; 1 分未満 in its last minute), 失効済み once at has passed.
func timeLeft(at, now time.Time) string {
	d := at.Sub(now)
	switch {
	case d <= 0:
		return "失効済み"
	case d < time.Minute:
		return "あと 1 分未満"
	}
	return fmt.Sprintf("あと %d 時間 %d 分", int(d.Hours()), int(d.Minutes())%60)
}

// forecast is when campaign s runs out at perMinute coupons a minute (the last 5 minutes' pace),
// as the team reads it: このペースで 19:41 に完売, or, with a release to come, 本日分は 10:07 に
// 終了見込み (or that today's coupons last until the next release); このペースでは終了までに
// 完売しません when its end comes first; "" when it is not issuing or issued nothing lately. It
// answers the instant too (zero with no forecast).
func forecast(s campaign.Status, perMinute float64) (string, time.Time) {
	if s.State != campaign.StateActive || perMinute <= 0 || s.RemainingCoupons <= 0 {
		return "", time.Time{}
	}
	at := s.At.Add(time.Duration(float64(s.RemainingCoupons) / perMinute * float64(time.Minute)))
	switch {
	case s.EndsAt != nil && !at.Before(*s.EndsAt):
		return "このペースでは終了までに完売しません", at
	case s.NextReleaseAt != nil && !at.Before(*s.NextReleaseAt):
		return "このペースでは次回の配布まで本日分は残ります", at
	case s.NextReleaseAt != nil:
		return "本日分は " + shortTime(at) + " に終了見込み", at
	}
	return "このペースで " + shortTime(at) + " に完売", at
}
