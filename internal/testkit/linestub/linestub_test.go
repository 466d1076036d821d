package linestub_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/testkit/linestub"
)

const lineUser = "U0123456789abcdef0123456789abcdef"

func push(t *testing.T, url, key string) *http.Response {
	t.Helper()
	return pushTo(t, url, key, lineUser)
}

func pushTo(t *testing.T, url, key, to string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+linestub.PushPath,
		strings.NewReader(`{"to":"`+to+`","messages":[{"type":"text","text":"hi"}]}`))
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

// TestOutages checks the whole-LINE behaviours: a "to" that is not a LINE user id is 400, a
// cut 200 accepts the key but the body cannot be read, and Default answers every other
// request (401 here) until it is reset.
func TestOutages(t *testing.T) {
	stub := linestub.New()
	srv := httptest.NewServer(stub)
	defer srv.Close()
	const cut, other = "123e4567-e89b-12d3-a456-426614174002", "123e4567-e89b-12d3-a456-426614174003"

	if r := pushTo(t, srv.URL, other, "m000001"); r.StatusCode != http.StatusBadRequest {
		t.Errorf("member id as to: %d, want 400", r.StatusCode)
	}

	stub.Script(cut, linestub.Response{CutBody: true})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+linestub.PushPath,
		strings.NewReader(`{"to":"`+lineUser+`","messages":[{"type":"text","text":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer token")
	req.Header.Set("X-Line-Retry-Key", cut)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, readErr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || readErr == nil || stub.AcceptedTimes(cut) != 1 {
		t.Errorf("cut body: %d, read error %v, accepted %d; want 200, an error, 1", resp.StatusCode, readErr, stub.AcceptedTimes(cut))
	}

	stub.Default(linestub.Response{Status: http.StatusUnauthorized})
	if r := push(t, srv.URL, other); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("with Default 401: %d", r.StatusCode)
	}
	stub.Default(linestub.Response{})
	if r := push(t, srv.URL, other); r.StatusCode != http.StatusOK {
		t.Errorf("after resetting Default: %d, want 200", r.StatusCode)
	}
	var tos []string
	for _, p := range stub.Pushes() {
		tos = append(tos, p.To)
	}
	if want := []string{"m000001", lineUser, lineUser, lineUser}; strings.Join(tos, ",") != strings.Join(want, ",") {
		t.Errorf("recorded to: %v, want %v", tos, want)
	}
}
