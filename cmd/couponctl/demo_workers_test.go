package main

import (
	"bytes"
	"context"
	"testing"
)

// TestDemoWithMoreWorkersThanConnections: 320 clients against the throwaway server, whose
// max_connections is 300. The functions' pools are sized for the database, not one connection
// per client, so the demo's own set-up holds and every rule holds.
func TestDemoWithMoreWorkersThanConnections(t *testing.T) {
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
