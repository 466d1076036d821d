package outbox

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ErrPushRejected is matched (errors.Is) by a [*PushError] whose push LINE refused for good: a
// 4xx other than 401, 403, 409 and 429, such as 400 for a member who blocked the account. Its
// row is parked at once; sending it again would get the same answer.
var ErrPushRejected = errors.New("outbox: push rejected by LINE")

// ErrTokenRefused is matched (errors.Is) by a [*PushError] for 401 or 403: LINE refused the
// channel access token (expired, revoked, or without the right), not the message. [Relay.Run]
// returns it when it ends a run for that reason.
var ErrTokenRefused = errors.New("outbox: LINE refused the channel access token")

// ErrLINEUnavailable is returned by [Relay.Run] when it ended the run early because LINE kept
// failing: [Config.BreakerFailures] timeouts, connection errors or 5xx in a row.
var ErrLINEUnavailable = errors.New("outbox: LINE unavailable, run ended early")

// PushError is a push that LINE did not accept: an HTTP status other than 2xx and 409, or no
// answer at all (timeout, connection error).
type PushError struct {
	// Status is LINE's HTTP status, 0 when there was no answer.
	Status int
	// RetryAfter is LINE's Retry-After, 0 when it sent none.
	RetryAfter time.Duration
	// Body is the start of LINE's error body ({"message": ...}), for last_error.
	Body string
	// Err is the transport error when there was no answer.
	Err error
}

func (e *PushError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("LINE push: no answer: %v", e.Err)
	}
	return fmt.Sprintf("LINE push: HTTP %d: %s", e.Status, e.Body)
}

// Unwrap returns the transport error, if any.
func (e *PushError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, [ErrPushRejected]) true for a refusal of the message that retrying
// cannot change, and errors.Is(err, [ErrTokenRefused]) true for 401 and 403.
func (e *PushError) Is(target error) bool {
	switch target {
	case ErrPushRejected:
		return !e.Retryable() && !e.tokenRefused()
	case ErrTokenRefused:
		return e.tokenRefused()
	}
	return false
}

func (e *PushError) tokenRefused() bool {
	return e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden
}

// Retryable reports whether the same push may succeed later: no answer (timeout, connection),
// 429 Too Many Requests, or a 5xx (LINE Messaging API reference, "Status codes" and "Retry
// failed API requests").
func (e *PushError) Retryable() bool {
	return e.Status == 0 || e.Status == http.StatusTooManyRequests || e.Status >= 500
}

// Outage reports whether the failure says LINE itself is failing rather than refusing this
// push: no answer (timeout, connection error) or a 5xx. A streak of them opens the run's
// circuit breaker.
func (e *PushError) Outage() bool {
	return e.Status == 0 || e.Status >= 500
}
