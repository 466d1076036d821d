package drill

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestParseFaults: the default list parses to every fault in order; an unknown or repeated name
// is refused, naming it.
func TestParseFaults(t *testing.T) {
	got, err := ParseFaults("db-crash, kill,sigterm,stall,line-outage, campaign-change,voids,hot-campaign,release")
	if err != nil || !slices.Equal(got, Faults) {
		t.Errorf("ParseFaults(all) = %v, %v; want %v", got, err, Faults)
	}
	for list, want := range map[string]string{"kill,flood": `"flood"`, "kill,kill": "twice", "": `""`} {
		if _, err := ParseFaults(list); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseFaults(%q): %v, want an error with %s", list, err, want)
		}
	}
}

// TestBreakNeedsItsOwnServerAndACrash: the break is refused against DATABASE_URL (it changes the
// server's settings) and without db-crash (it loses coupons only in a crash).
func TestBreakNeedsItsOwnServerAndACrash(t *testing.T) {
	ok := Options{Duration: time.Second, Clients: 1, Faults: []Fault{DBCrash}, Break: BreakSyncCommitOff, Serve: []string{"couponctl", "serve"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid options refused: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.DatabaseURL = "postgres://staging" }, "DATABASE_URL"},
		{func(o *Options) { o.Faults = []Fault{Kill} }, "add db-crash"},
		{func(o *Options) { o.Break = "fsync-off" }, "the only break is " + BreakSyncCommitOff},
	} {
		o := ok
		tc.edit(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want a refusal saying %q", o, err, tc.want)
		}
	}
}

// TestFaultNotesSayHowLongNoProcessServed: the kill and sigterm rows say when the process went
// and from when a new one served, both since the injection: not the new process's start-up alone,
// which read as if the service had been down 0.1 s.
func TestFaultNotesSayHowLongNoProcessServed(t *testing.T) {
	if got, want := killNote(0, 3600*time.Millisecond), "SIGKILL at +0.0 s; no process until a new one served from +3.6 s"; got != want {
		t.Errorf("killNote = %q, want %q", got, want)
	}
	got := terminateNote(0, time.Second, 3700*time.Millisecond)
	if want := "SIGTERM at +0.0 s, drained and exited at +1.0 s; no process until a new one served from +3.7 s"; got != want {
		t.Errorf("terminateNote = %q, want %q", got, want)
	}
}
