package outbox

import (
	"errors"
	"net/http"
	"testing"
)

// TestBreakerOpensOnAStreak: three outage failures in a row open a breaker of threshold 3; a
// refusal or a success in between resets the streak; once open it stays open.
func TestBreakerOpensOnAStreak(t *testing.T) {
	outage := &PushError{Status: http.StatusServiceUnavailable}
	timeout := &PushError{Err: errors.New("timeout")}
	refused := &PushError{Status: http.StatusBadRequest}
	b := &breaker{threshold: 3}
	for i, err := range []error{outage, timeout, refused, outage, nil, outage, timeout} {
		if b.record(err); b.isOpen() {
			t.Fatalf("open after result %d (%v): no streak of 3 yet", i, err)
		}
	}
	b.record(outage)
	if !b.isOpen() {
		t.Fatal("closed after 3 outage failures in a row")
	}
	b.record(nil)
	if !b.isOpen() {
		t.Error("closed again within the run")
	}
}
