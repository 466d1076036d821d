package console

import (
	"fmt"
	"html/template"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"yen":       yen,
	"jst":       func(t time.Time) string { return tokyoTime(t) },
	"jstp":      jstPtr,
	"state":     stateJa,
	"over":      over,
	"what":      whatJa,
	"json":      jsonText,
	"detail":    jsonDetail,
	"badges":    badges,
	"note":      stateNote,
	"count":     issuedCoupons,
	"used":      usedTenths,
	"low":       lowBudget,
	"tenths":    func(n int) string { return tenthsText(n) + " %" },
	"left":      timeLeft,
	"auditKind": auditKindJa,
	"auditWhat": auditWhatJa,
	"n":         groupDigits[int],
	"remain":    remaining,
	"skip":      skipJa,
	"forecast": func(s campaign.Status, perMinute float64) map[string]any {
		text, at := forecast(s, perMinute)
		return map[string]any{"Text": text, "At": at}
	},
	"perMin": func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"push":   pushJa,
	"kind":   func(k string) string { return map[string]string{"budget": "予算", "period": "期間"}[k] },
	"pct":    percent,
	"reqState": func(s string) string {
		return map[string]string{"pending": "承認待ち", "approved": "承認済み", "rejected": "却下", "lapsed": "失効（24 時間）"}[s]
	},
	"redemption": func(a string) string { return map[string]string{"redeem": "利用", "rollback": "取消"}[a] },
}

// yen writes n with thousands separators and the unit: 1,000,000 円.
func yen(n any) string {
	var v int64
	switch x := n.(type) {
	case int:
		v = int64(x)
	case int64:
		v = x
	}
	return groupDigits(v) + " 円"
}

// percent is part of whole as a percentage, rounded half up to one decimal (42.9 %), as
// PostgreSQL's round(numeric, 1) rounds; "—", no figure, when whole is 0.
func percent(part, whole int) string {
	if whole <= 0 {
		return "—"
	}
	return ratio(int64(part), int64(whole)) + " %"
}

func jstPtr(t *time.Time) string {
	if t == nil {
		return "なし"
	}
	return tokyoTime(*t)
}

// stateJa is a campaign state (campaign_state's code, the database's judgement) in the team's
// words.
func stateJa(s string) string {
	return map[string]string{campaign.StateActive: "発行中", campaign.StatePaused: "一時停止中",
		campaign.StateSoldOut: "完売", campaign.StateWaitingRelease: "本日分終了",
		campaign.StateNotStarted: "開始前", campaign.StateEnded: "終了", campaign.StateExpired: "有効期限切れ"}[s]
}

// over says a campaign in state s has ended (its end or its coupons' expiry passed): the
// database refuses a pause, a resume or a budget change of it (campaign_refuse_ended), and its
// end has passed or its coupons no longer issue, so the page offers none of those, nor an end.
func over(s string) bool { return s == campaign.StateEnded || s == campaign.StateExpired }

func whatJa(s string) string {
	if ja, ok := map[string]string{"budget": "予算", "stripes": "予算ストライプ数", "period": "期間", "pause": "一時停止",
		"resume": "再開", "end": "終了", "validity": "有効期限", "create": "作成", "audience": "対象会員",
		"release": "配布予定", "repair": "集計の修復", "name": "名前"}[s]; ok {
		return ja
	}
	return s
}

func pushJa(s string) string {
	if ja, ok := map[string]string{"sent": "送信済み", "skipped": "送信対象外", "parked": "送信保留（エラー）", "open": "未送信",
		"in flight": "送信中", "not sent": "送信しない", "pruned": "記録整理済み（送信結果の記録なし）", "none": "通知なし"}[s]; ok {
		return ja
	}
	return s
}

// jsonText writes a history row's before or after, or a request's arguments, in the team's
// words: each key by [keyJa] (an unknown key as it is), times as [tokyoTime], amounts (keys
// ending _yen) in yen, counts with their unit, true and false as はい and いいえ, a list
// joined, an object in brackets; the keys of [detailKeys] are left to [jsonDetail].
func jsonText(m map[string]any) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if _, detail := detailKeys[k]; !detail {
			parts = append(parts, label(k)+": "+jsonValue(k, m[k]))
		}
	}
	return strings.Join(parts, "、")
}

// jsonDetail writes the keys of [detailKeys] in m, for the page's 詳細 section.
func jsonDetail(m map[string]any) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if ja, ok := detailKeys[k]; ok {
			parts = append(parts, ja+": "+jsonValue(k, m[k]))
		}
	}
	return strings.Join(parts, "、")
}

// keyJa are the keys of campaign_changes' before and after (campaign_change_record's callers)
// and of campaign_change_requests' arguments, in the team's words.
var keyJa = map[string]string{
	"budget_yen": "予算", "add_yen": "増減額", "issued_yen": "発行額", "discount_yen": "1 枚の額",
	"starts_at": "開始", "ends_at": "終了", "paused_at": "一時停止", "coupons_expire_at": "有効期限",
	"coupon_valid_days": "有効日数", "releases": "配布予定", "at": "日時", "coupons": "枚数",
	"released_coupons": "配布予定の合計", "audience_only": "会員限定", "added": "追加", "removed": "削除",
	"given": "指定", "role": "役割", "monthly_cap_yen": "月の上限", "approval_above_yen": "承認基準",
	"reissue_allowed": "再発行の許可", "name": "名前",
}

// detailKeys are the keys shown only in the 詳細 section, with their words: how the budget is
// held, not what the team decides.
var detailKeys = map[string]string{"stripes": "予算ストライプ数"}

// unitJa are the units of the counts among [keyJa]'s keys.
var unitJa = map[string]string{"coupons": " 枚", "released_coupons": " 枚", "added": " 名", "removed": " 名",
	"given": " 名", "coupon_valid_days": " 日"}

func label(k string) string {
	if ja, ok := keyJa[k]; ok {
		return ja
	}
	return k
}

// jsonValue writes the value of key k as [jsonText] does. pgx decodes a jsonb number as a
// float64, which %v prints in exponent form from a million on (1e+07): a whole number within
// float64's exact integers (2^53) is written as the integer it is.
func jsonValue(k string, v any) string {
	switch x := v.(type) {
	case nil:
		return "なし"
	case bool:
		return map[bool]string{true: "はい", false: "いいえ"}[x]
	case string:
		return jsonString(k, x)
	case float64:
		return jsonNumber(k, x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = jsonValue(k, e)
		}
		return strings.Join(parts, "、")
	case map[string]any:
		return "（" + jsonText(x) + "）"
	}
	return fmt.Sprint(v)
}

// jsonString writes a string value of key k: an instant as the team reads a time, a role in
// Japanese, anything else as it is.
func jsonString(k, x string) string {
	if t, err := time.Parse(time.RFC3339Nano, x); err == nil {
		return tokyoTime(t)
	}
	if ja, ok := wordsJa[x]; ok && k == "role" {
		return ja
	}
	return x
}

// jsonNumber writes a number value of key k: yen for a key ending _yen, else grouped with its
// unit; a fraction, or a number past float64's exact integers, as it is.
func jsonNumber(k string, x float64) string {
	if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	if strings.HasSuffix(k, "_yen") {
		return yen(int64(x))
	}
	return groupDigits(int64(x)) + unitJa[k]
}
