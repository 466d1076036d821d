package outbox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	_ "time/tzdata" // Asia/Tokyo must load on images without a zoneinfo database

	"github.com/line/line-bot-sdk-go/v8/linebot/messaging_api"

	"github.com/mops/coupon-api/shared/outbox/outboxdb"
)

// maxErrorBody is how much of LINE's error body is kept for last_error, in bytes.
const maxErrorBody = 512

// push sends row's message to the member's LINE user id through the LINE Messaging API SDK
// (POST /v2/bot/message/push) with the coupon id as X-Line-Retry-Key: LINE accepts a key once
// and answers 409 to any later request with it for 24 hours, sending nothing (LINE Messaging
// API reference, "Retry failed API requests"), so re-sending after a timeout or a crash inside
// those 24 hours cannot notify the member twice.
//
// It returns nil for any 2xx and for 409 (already accepted), else a [*PushError]. A 2xx is
// judged on the status line alone: when the body cannot be read afterwards (the push timeout
// fires after the headers, the connection drops mid-body), the SDK returns an error with the
// response, but LINE has accepted the message. sent reports whether the request was written to
// LINE at all: false when it never left (the context ended first, no connection), so no
// attempt is charged for it.
func (r *Relay) push(ctx context.Context, row outboxdb.Claimed) (sent bool, err error) {
	// The SDK client carries its context as a field (WithContext), so each push gets a client
	// of its own; building one only parses the endpoint URL.
	api, err := messaging_api.NewMessagingApiAPI(r.cfg.ChannelAccessToken,
		messaging_api.WithEndpoint(r.cfg.BaseURL), messaging_api.WithHTTPClient(r.cfg.HTTPClient))
	if err != nil {
		return false, fmt.Errorf("outbox: LINE client: %w", err)
	}
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				wrote.Store(true)
			}
		},
	})
	req := &messaging_api.PushMessageRequest{
		To:       row.LineUserID,
		Messages: []messaging_api.MessageInterface{&messaging_api.TextMessage{Text: Message(row.CampaignID, row.AmountYen, row.ExpiresAt)}},
	}
	res, _, err := api.WithContext(ctx).PushMessageWithHttpInfo(req, row.CouponID)
	switch {
	case res != nil && res.StatusCode/100 == 2:
		return true, nil // accepted, whatever became of the body
	case err == nil:
		return true, nil
	case res == nil:
		return wrote.Load(), &PushError{Err: err} // no answer: timeout, refused connection, ...
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusConflict {
		return true, nil // the retry key was accepted before: the member got the message once
	}
	body, _ := io.ReadAll(io.LimitReader(res.Body, maxErrorBody)) // the SDK buffered it
	return true, &PushError{
		Status:     res.StatusCode,
		RetryAfter: retryAfter(res.Header.Get("Retry-After"), time.Now()),
		Body:       strings.TrimSpace(string(body)),
	}
}

// Message is the push text for a coupon of campaignID worth amountYen yen, valid until expiresAt
// (nil: no expiry), in Japanese: which coupon the member received, its value, and until when it
// may be used, in Asia/Tokyo time: the last minute in which it is valid ("23:59まで" for a coupon
// expiring at 00:00 on the 8th). An expiry inside a minute (12:30:30) names that minute (12:30),
// so the text never names an end earlier than the stored expiry.
func Message(campaignID string, amountYen int, expiresAt *time.Time) string {
	until := ""
	if expiresAt != nil {
		end := expiresAt.Truncate(time.Minute)
		if end.Before(*expiresAt) {
			end = end.Add(time.Minute)
		}
		last := end.Add(-time.Minute).In(tokyo)
		until = fmt.Sprintf("\n有効期限：%d年%d月%d日 %02d:%02dまで", last.Year(), int(last.Month()), last.Day(), last.Hour(), last.Minute())
	}
	return fmt.Sprintf("クーポンが届きました！\nキャンペーン「%s」の%s円引きクーポンです。アプリのクーポン一覧からご利用ください。%s",
		campaignID, yen(amountYen), until)
}

// tokyo is the time zone of the push text: the members' and the R3 month's.
var tokyo = func() *time.Location {
	loc, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		panic(err) // time/tzdata is embedded, so this cannot fail
	}
	return loc
}()

// yen formats n with thousands separators: 1000 -> "1,000".
func yen(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// retryAfter parses a Retry-After header, delay-seconds or an HTTP date (RFC 9110, 10.2.3),
// into a wait from now; 0 when absent or unreadable.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		return max(0, time.Duration(secs)*time.Second)
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now))
	}
	return 0
}
