package outbox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/line/line-bot-sdk-go/v8/linebot/messaging_api"
)

// maxErrorBody is how much of LINE's error body is kept for last_error, in bytes.
const maxErrorBody = 512

// push sends row's message through the LINE Messaging API SDK (POST /v2/bot/message/push) with
// the coupon id as X-Line-Retry-Key: LINE accepts a key once and answers 409 to any later
// request with it for 24 hours, sending nothing (LINE Messaging API reference, "Retry failed
// API requests"), so re-sending after a timeout or a crash cannot notify the member twice.
//
// It returns nil for 2xx and for 409 (already accepted), else a [*PushError].
func (r *Relay) push(ctx context.Context, row claimed) error {
	// The SDK client carries its context as a field (WithContext), so each push gets a client
	// of its own; building one only parses the endpoint URL.
	api, err := messaging_api.NewMessagingApiAPI(r.cfg.ChannelAccessToken,
		messaging_api.WithEndpoint(r.cfg.BaseURL), messaging_api.WithHTTPClient(r.cfg.HTTPClient))
	if err != nil {
		return fmt.Errorf("relay: LINE client: %w", err)
	}
	req := &messaging_api.PushMessageRequest{
		To:       row.memberID,
		Messages: []messaging_api.MessageInterface{&messaging_api.TextMessage{Text: Message(row.campaignID, row.amountYen)}},
	}
	res, _, err := api.WithContext(ctx).PushMessageWithHttpInfo(req, row.couponID)
	if err == nil {
		return nil
	}
	if res == nil {
		return &PushError{Err: err} // no answer: timeout, refused connection, ...
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusConflict {
		return nil // the retry key was accepted before: the member got the message once
	}
	body, _ := io.ReadAll(io.LimitReader(res.Body, maxErrorBody)) // the SDK buffered it
	return &PushError{
		Status:     res.StatusCode,
		RetryAfter: retryAfter(res.Header.Get("Retry-After"), time.Now()),
		Body:       strings.TrimSpace(string(body)),
	}
}

// Message is the push text for a coupon of campaignID worth amountYen yen, in Japanese:
// which coupon the member received, and its value.
func Message(campaignID string, amountYen int) string {
	return fmt.Sprintf("クーポンが届きました！\nキャンペーン「%s」の%s円引きクーポンです。アプリのクーポン一覧からご利用ください。",
		campaignID, yen(amountYen))
}

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
