package answerlog

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWriteThenRead: answers written from several goroutines read back whole, one line each,
// with the body's result and coupon id, and a transport error's text without a status.
func TestWriteThenRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "answers.jsonl")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Date(2026, 11, 30, 7, 38, 1, 123456789, time.UTC)
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 25 {
				_ = w.Write(New(sent, 8412*time.Microsecond, "m0001", "SW-A", 201,
					[]byte(`{"result":"ISSUED","coupon_id":"0b8f6b1e-0000-4000-8000-000000000001","amount_yen":1000}`), nil))
			}
		}()
	}
	for range 4 {
		<-done
	}
	if err := w.Write(New(sent, time.Second, "m0002", "SW-B", 500, []byte("ignored"), errors.New("connection refused"))); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 101 {
		t.Fatalf("read %d answers, want 101", len(got))
	}
	first := got[0]
	if !first.T.Equal(sent) || first.Ms != 8.412 || first.Status != 201 || first.Result != "ISSUED" ||
		first.CouponID != "0b8f6b1e-0000-4000-8000-000000000001" || first.Error != "" {
		t.Errorf("first answer %+v", first)
	}
	if last := got[100]; last.Status != 0 || last.Result != "" || last.Error != "connection refused" || last.Latency() != time.Second {
		t.Errorf("transport error read back as %+v", last)
	}
}

// TestReadNamesTheBadLine: a line that is not an answer is refused with its number.
func TestReadNamesTheBadLine(t *testing.T) {
	log := `{"t":"2026-11-30T07:38:01Z","ms":1,"member_id":"m1","campaign_id":"A","status":201,"result":"ISSUED","coupon_id":"x","error":""}
{"t":"2026-11-30T07:38:01Z","ms":1,"campaign_id":"A"}
`
	if _, err := Read(strings.NewReader(log)); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("Read: %v, want an error naming line 2", err)
	}
}

// TestCloseTwice: a second Close (the drill closes its log when the load ends and again when it
// stops, whichever comes first) does nothing; a write after it is refused.
func TestCloseTwice(t *testing.T) {
	w, err := Create(filepath.Join(t.TempDir(), "a.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Answer{T: time.Now(), MemberID: "m", CampaignID: "c"}); err != nil {
		t.Fatal(err)
	}
	if err1, err2 := w.Close(), w.Close(); err1 != nil || err2 != nil {
		t.Errorf("Close, Close = %v, %v; want nil twice", err1, err2)
	}
	if err := w.Write(Answer{T: time.Now(), MemberID: "m", CampaignID: "c"}); err == nil {
		t.Error("Write after Close: nil error")
	}
}
