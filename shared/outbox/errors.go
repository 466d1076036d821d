package outbox

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ErrPushRejected is matched (errors.Is) by a [*PushError] whose push LINE refused for good: a
// 4xx other than 409 and 429, such as 400 for a member who blocked the account. Its row is
// parked at once; sending it again would get the same answer.
var ErrPushRejected = errors.New("relay: push rejected by LINE")

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

// Is makes errors.Is(err, [ErrPushRejected]) true for a refusal that retrying cannot change.
func (e *PushError) Is(target error) bool {
	return target == ErrPushRejected && !e.Retryable()
}

// Retryable reports whether the same push may succeed later: no answer (timeout, connection),
// 429 Too Many Requests, or a 5xx (LINE Messaging API reference, "Status codes" and "Retry
// failed API requests").
func (e *PushError) Retryable() bool {
	return e.Status == 0 || e.Status == http.StatusTooManyRequests || e.Status >= 500
}

// IsRetryable reports whether err, at any depth of wrapping, is a [*PushError] that may succeed
// later. Any other error is not.
func IsRetryable(err error) bool {
	var pe *PushError
	return errors.As(err, &pe) && pe.Retryable()
}
