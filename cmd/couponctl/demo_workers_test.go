package main

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
)

// demoRan is set by the first demo of the test process.
var demoRan atomic.Bool

// TestDemoWithMoreWorkersThanConnections: 320 clients against the throwaway server, whose
// max_connections is 300. The functions' pools are sized for the database, not one connection
// per client, so the demo's own set-up holds and every rule holds.
func TestDemoWithMoreWorkersThanConnections(t *testing.T) {
	if !demoRan.CompareAndSwap(false, true) {
		t.Skip("the functions the demo serves keep their first pool for the process's life (go test -count > 1)")
	}
	t.Setenv("DATABASE_URL", "") // a throwaway server
	var out bytes.Buffer
	cmd := rootCmd()
	cmd.SetArgs([]string{"demo", "--workers", "320"})
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("demo --workers 320: %v\n%s", err, out.String())
	}
}
