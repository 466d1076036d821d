package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/mops/coupon-api/internal/lab/isolationlab"
)

// simWidth is the widest line couponctl sim may print for a terminal: about 100 columns.
const simWidth = 100

// TestSimOutputFitsAndChartSaysMeans runs a small isolation lab on a throwaway server: every
// line of its default (text) output fits in about 100 columns, the figures of every column are
// still there, and its chart says that each bar is the mean of the runs.
func TestSimOutputFitsAndChartSaysMeans(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	tmp, err := os.MkdirTemp("", "sim-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil { // the throwaway server's account reads it
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", tmp)
	chart := filepath.Join(t.TempDir(), "lab.svg")
	stdout, stderr, err := runCLI(t, "sim", "--strategies", "repeatable-read,good", "--workers", "4",
		"--runs", "2", "--members", "10", "--chart", chart)
	if err != nil {
		t.Fatalf("sim: %v\n%s", err, stderr)
	}
	for _, line := range strings.Split(stdout, "\n") {
		if n := utf8.RuneCountInString(line); n > simWidth {
			t.Errorf("a line of %d columns, want at most %d:\n%s", n, simWidth, line)
		}
	}
	for _, w := range []string{"repeatable-read", "good", "SW-A", "SW-B", "SW-C", "coupons", "R1", "R2", "R3",
		"pushes", "retried", "RETRY_EXHAUSTED", "errors", "req/s", "p50", "p99", "Verdict"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("the output lost %q:\n%s", w, stdout)
		}
	}
	svg, err := os.ReadFile(chart)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(svg), "mean of 2 runs") {
		t.Errorf("the chart does not say its bars are the mean of the 2 runs")
	}
}

// TestSimTableWidthAtScale: with the default load's largest figures (every campaign overshot,
// a drift of millions of yen, hundreds of broken pairs, retries over 100%, seconds of latency)
// the terminal table still fits, and every figure is printed.
func TestSimTableWidthAtScale(t *testing.T) {
	t.Parallel()
	campaigns := []isolationlab.CampaignFigures{{CampaignID: "SW-A", OvershootYen: 900_000},
		{CampaignID: "SW-B", OvershootYen: 700_000}, {CampaignID: "SW-C", OvershootYen: 800_000}}
	ms := []isolationlab.Measurement{
		{Strategy: "before", Workers: 32, Run: 3, Requests: 1800, Coupons: 1800, Campaigns: campaigns,
			CounterDriftYen: 1_234_000, DuplicatePairs: 900, MembersOverCap: 300, PushesWithoutCoupon: 1800,
			Exhausted: 1800, Errors: 1800, Throughput: 12345, P50Ms: 2500.5, P99Ms: 12000.5},
		{Strategy: "repeatable-read", Workers: 8, Run: 1, Requests: 1800, Retries: 9000, Campaigns: campaigns},
	}
	var b strings.Builder
	if err := writeSimTable(&b, "text", ms); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(b.String(), "\n") {
		if n := utf8.RuneCountInString(line); n > simWidth {
			t.Errorf("a line of %d columns, want at most %d:\n%s", n, simWidth, line)
		}
	}
	for _, w := range []string{"900000", "700000", "800000", "1234000", "900", "300", "1800", "12345", "2500.5", "12000.5", "500.0"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("the table lost %s:\n%s", w, b.String())
		}
	}
}
