// Package linestub is a local stand-in for the LINE Messaging API push endpoint
// (POST /v2/bot/message/push), for the relay's tests, benchmark and the couponctl demo. Serve a
// [Stub] with net/http/httptest or any http.Server and point the relay's LINE_API_BASE_URL at it.
//
// It behaves as LINE documents the retry key (LINE Messaging API reference, "Retry failed API
// requests" and "Send push message"): X-Line-Retry-Key must be a UUID, the first request with a
// key is accepted (200), and a later request with an accepted key is answered 409 Conflict with
// the header X-Line-Accepted-Request-Id, sending nothing. Like LINE, it answers 400 to a push
// whose "to" is not a LINE user id ("U" + 32 lowercase hex digits), such as a member id. It
// records every request per key with its "to", and it can be told to answer a key's n-th
// request, or every request, slowly, with a 5xx, a 4xx (401 for a refused token), 429 with
// Retry-After, or a 200 whose body is cut off ([Stub.Script], [Stub.Always], [Stub.Default]).
package linestub

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"
)

// PushPath is the push message endpoint's path.
const PushPath = "/v2/bot/message/push"

// Response is a programmed answer. A zero Status answers as LINE would (200, or 409 for an
// accepted key) after Delay.
type Response struct {
	// Status is the HTTP status to answer with, e.g. 500, 400 or 429; 0 behaves normally.
	Status int
	// RetryAfter, when not empty, is sent as the Retry-After header (seconds, e.g. "120").
	RetryAfter string
	// Message is the error body's "message"; a default is used when empty.
	Message string
	// Delay holds the answer back (a slow LINE). The request is still received: when Status is
	// 0 the key is accepted after the delay even if the client has stopped waiting, as a real
	// server that got the request would.
	Delay time.Duration
	// CutBody, with Status 0, accepts the push and sends 200 with its headers, then drops the
	// connection halfway through the body: the client cannot read the answer although LINE
	// has the message (a push timeout firing after the headers looks the same).
	CutBody bool
}

// Push is one recorded request.
type Push struct {
	RetryKey string
	To       string
	// Text is the first message's text, when it is a text message.
	Text string
	// Status is what the stub answered.
	Status int
}

// Stats sums up what the stub received.
type Stats struct {
	Requests  int // push requests received, whatever the answer
	Accepted  int // requests answered 200: each accepted a new retry key
	Conflicts int // requests answered 409: the key was already accepted
	Failed    int // requests answered with any other status
	Keys      int // distinct retry keys seen
}

// Stub is the stand-in: an http.Handler safe for concurrent use. The zero value is not usable;
// call [New].
type Stub struct {
	mu       sync.Mutex
	scripts  map[string][]Response // per key: answers to its 1st, 2nd, ... request
	always   map[string]Response   // per key: answer to every request
	fallback Response              // answer to a request with no script or always entry
	calls    map[string]int        // per key: requests received
	accepted map[string]int        // per key: requests answered 200 (more than 1 would be a LINE bug)
	pushes   []Push
	stats    Stats
	seq      int
}

// New returns a stub that accepts every well-formed push.
func New() *Stub {
	return &Stub{
		scripts:  map[string][]Response{},
		always:   map[string]Response{},
		calls:    map[string]int{},
		accepted: map[string]int{},
	}
}

// Script programs the answers to the next requests with retryKey: the first request gets
// answers[0], the second answers[1], and so on; after the script the stub behaves normally.
func (s *Stub) Script(retryKey string, answers ...Response) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scripts[retryKey] = answers
}

// Always programs the answer to every request with retryKey.
func (s *Stub) Always(retryKey string, answer Response) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.always[retryKey] = answer
}

// Default programs the answer to every request that no [Stub.Script] or [Stub.Always] entry
// covers: e.g. Response{Status: 401} for a refused token, or Response{Delay: time.Minute} for
// a LINE that hangs. Response{} restores the normal behaviour.
func (s *Stub) Default(answer Response) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fallback = answer
}

// Stats returns the totals so far.
func (s *Stub) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Keys = len(s.calls)
	return st
}

// Calls returns how many requests carried retryKey.
func (s *Stub) Calls(retryKey string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[retryKey]
}

// AcceptedTimes returns how many requests with retryKey were answered 200: 1 for a coupon
// pushed exactly once, 0 for one never delivered.
func (s *Stub) AcceptedTimes(retryKey string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted[retryKey]
}

// Accepted returns, per accepted retry key, how many times it was answered 200.
func (s *Stub) Accepted() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]int, len(s.accepted))
	for k, v := range s.accepted {
		m[k] = v
	}
	return m
}

// Pushes returns every request received, in arrival order.
func (s *Stub) Pushes() []Push {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Push(nil), s.pushes...)
}

// LineUserIDPattern is the form of a LINE user id, the push's "to": "U" and 32 lowercase hex
// digits (LINE Messaging API reference, "Send push message").
var LineUserIDPattern = regexp.MustCompile(`^U[0-9a-f]{32}$`)

// uuidPattern is the retry key format LINE requires: a UUID in hexadecimal.
var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

type pushRequest struct {
	To       string `json:"to"`
	Messages []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"messages"`
}

// ServeHTTP answers POST /v2/bot/message/push; any other path is 404, any other method 405.
func (s *Stub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != PushPath {
		writeError(w, http.StatusNotFound, "Not found", "")
		return
	}
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "Method not allowed", "")
		return
	}
	if !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
		writeError(w, http.StatusUnauthorized, "Authentication failed due to the following reason: no token", "")
		return
	}
	var req pushRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.To == "" ||
		len(req.Messages) == 0 || len(req.Messages) > 5 {
		writeError(w, http.StatusBadRequest, "The request body has 1 error(s)", "")
		return
	}
	key := r.Header.Get("X-Line-Retry-Key")
	if key != "" && !uuidPattern.MatchString(key) {
		writeError(w, http.StatusBadRequest, "The value for the 'X-Line-Retry-Key' header is invalid", "")
		return
	}

	answer := s.receive(key)
	if !LineUserIDPattern.MatchString(req.To) {
		answer = Response{Status: http.StatusBadRequest, Message: "The property, 'to', in the request body is invalid (line: -, column: -)"}
	}
	if answer.Delay > 0 {
		t := time.NewTimer(answer.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done(): // the client stopped waiting; the request was still received
			t.Stop()
		}
	}
	status, requestID, acceptedID := s.decide(key, answer)
	s.record(Push{RetryKey: key, To: req.To, Text: req.Messages[0].Text, Status: status})

	w.Header().Set("X-Line-Request-Id", requestID)
	switch status {
	case http.StatusOK:
		if answer.CutBody {
			cutBody(w)
		}
		writeJSON(w, status, map[string]any{"sentMessages": []map[string]string{{"id": requestID, "quoteToken": "q" + requestID}}})
	case http.StatusConflict:
		w.Header().Set("X-Line-Accepted-Request-Id", acceptedID)
		writeError(w, status, "The retry key is already accepted", "")
	default:
		msg := answer.Message
		if msg == "" {
			msg = http.StatusText(status)
		}
		writeError(w, status, msg, answer.RetryAfter)
	}
}

// receive counts the request and returns its programmed answer.
func (s *Stub) receive(key string) Response {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[key]++
	if a, ok := s.always[key]; ok {
		return a
	}
	if script := s.scripts[key]; len(script) > 0 {
		s.scripts[key] = script[1:]
		return script[0]
	}
	return s.fallback
}

// decide turns the programmed answer into a status: a programmed error, or LINE's retry-key
// rule (the first request with a key is accepted, later ones are 409).
func (s *Stub) decide(key string, answer Response) (status int, requestID, acceptedID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	requestID = fmt.Sprintf("stub-%08d", s.seq)
	s.stats.Requests++
	switch {
	case answer.Status != 0:
		s.stats.Failed++
		return answer.Status, requestID, ""
	case key != "" && s.accepted[key] > 0:
		s.stats.Conflicts++
		return http.StatusConflict, requestID, "accepted-" + key
	default:
		s.accepted[key]++
		s.stats.Accepted++
		return http.StatusOK, requestID, ""
	}
}

func (s *Stub) record(p Push) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pushes = append(s.pushes, p)
}

// cutBody sends 200 with a Content-Length it does not keep and part of the body, then drops the
// connection (http.ErrAbortHandler: the server closes it without logging).
func cutBody(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", "4096")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, `{"sentMessages":[{"id":"`)
	_ = http.NewResponseController(w).Flush()
	panic(http.ErrAbortHandler)
}

func writeError(w http.ResponseWriter, status int, message, retryAfter string) {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	writeJSON(w, status, map[string]string{"message": message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client may have gone away: nothing to do about it
}
