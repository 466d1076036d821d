package linestub_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/linestub"
)

func push(t *testing.T, url, key string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+linestub.PushPath,
		strings.NewReader(`{"to":"U1","messages":[{"type":"text","text":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer token")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Line-Retry-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// TestRetryKey checks LINE's retry-key rule over HTTP: the first request is accepted, a repeat
// is 409 with X-Line-Accepted-Request-Id, a scripted failure does not use the key up, and a key
// that is not a UUID is 400.
func TestRetryKey(t *testing.T) {
	stub := linestub.New()
	srv := httptest.NewServer(stub)
	defer srv.Close()
	const key, other = "123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456-426614174001"
	stub.Script(other, linestub.Response{Status: http.StatusTooManyRequests, RetryAfter: "7"})

	if r := push(t, srv.URL, key); r.StatusCode != http.StatusOK {
		t.Errorf("first push: %d, want 200", r.StatusCode)
	}
	if r := push(t, srv.URL, key); r.StatusCode != http.StatusConflict || r.Header.Get("X-Line-Accepted-Request-Id") == "" {
		t.Errorf("repeat: %d %v, want 409 with X-Line-Accepted-Request-Id", r.StatusCode, r.Header)
	}
	if r := push(t, srv.URL, other); r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") != "7" {
		t.Errorf("scripted 429: %d, Retry-After %q", r.StatusCode, r.Header.Get("Retry-After"))
	}
	if r := push(t, srv.URL, other); r.StatusCode != http.StatusOK {
		t.Errorf("after the script: %d, want 200", r.StatusCode)
	}
	if r := push(t, srv.URL, "not-a-uuid"); r.StatusCode != http.StatusBadRequest {
		t.Errorf("bad key: %d, want 400", r.StatusCode)
	}
	want := linestub.Stats{Requests: 4, Accepted: 2, Conflicts: 1, Failed: 1, Keys: 2}
	if got := stub.Stats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	if stub.AcceptedTimes(key) != 1 || stub.Calls(key) != 2 {
		t.Errorf("key: accepted %d, calls %d; want 1, 2", stub.AcceptedTimes(key), stub.Calls(key))
	}
}
