package hotbench

import (
	"strings"
	"testing"
)

// TestReadPoolTable: with a replica answering the dry runs, the read pool's table gives each
// turn's primary core-ms per coupon alone and beside, their medians' ratio, and the core-ms per
// dry run of the primary and of the replica; without a replica it is not written. The turns'
// per-coupon figures are each turn's server CPU over its coupons (addTurnCPU).
func TestReadPoolTable(t *testing.T) {
	var r DryRunResult
	for _, turn := range []struct {
		t      dryTurn
		beside bool
	}{
		{dryTurn{issued: 1000, pgMs: 200}, false}, {dryTurn{issued: 900, pgMs: 198}, true},
		{dryTurn{issued: 1000, pgMs: 210}, false}, {dryTurn{issued: 1000, pgMs: 230}, true},
		{dryTurn{issued: 0, pgMs: 5}, false}, // no coupon: no figure
	} {
		r.addTurnCPU(turn.t, turn.beside)
	}
	r.PGPerDryRun, r.ReplicaPerDryRun = 0.004, 0.194
	var b strings.Builder
	if err := writeReadPool(&b, "text", Report{ServerCPU: true, ReadPool: true, DryRuns: []DryRunResult{r}}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{ReadPoolTable, "[0.200 0.210]", "[0.220 0.230]", "1.10", "0.004", "0.194"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := writeReadPool(&b, "text", Report{ServerCPU: true, DryRuns: []DryRunResult{r}}); err != nil || b.Len() != 0 {
		t.Errorf("without a replica: %q, %v; want nothing", b.String(), err)
	}
}
